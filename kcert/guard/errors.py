"""Errors of the runtime guard (:mod:`kcert.guard`), each with its own ``kind``."""

from __future__ import annotations

from kcert.errors import KcertError


class GuardError(KcertError):
    """A guard cannot be set up: its certificate and spec do not fit together."""

    kind = "guard"

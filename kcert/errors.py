"""The one error root of kcert.

Every error a user can cause derives from :class:`KcertError`. Front ends (the
CLI and the API) catch it in exactly one place and show ``diagnostics()``;
nothing below them prints or exits.
"""

from __future__ import annotations


class KcertError(Exception):
    """A failure a person can act on."""

    #: Short stable slug used by the API's problem ``type`` and by ``--json``.
    kind: str = "error"

    def diagnostics(self) -> str:
        """Text that says what went wrong and what to do about it."""
        return str(self)


class UsageError(KcertError):
    """Bad arguments or environment outside any one package (exit code 2)."""

    kind = "usage"

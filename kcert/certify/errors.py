"""Errors of a kernel build, shared by the certifier and its sandboxed build child.

They live apart from :mod:`kcert.certify.build` so that
:mod:`kcert.certify.build_child`, which ``build`` itself imports, raises these
very errors rather than a parallel family that every caller translates.
"""

from __future__ import annotations

from collections.abc import Sequence

from kcert.errors import KcertError


class BuildError(KcertError):
    """The kernel did not compile (or compiled to something unusable); carries the log.

    ``arg_names`` is the Triton entry's parameter list when the build child got as far
    as loading it: a spec that lists the wrong parameters is told so first.
    """

    kind = "build-failed"

    def __init__(
        self, message: str, *, log: str = "", arg_names: Sequence[str] | None = None
    ) -> None:  # fmt: skip
        self.message, self.log = message, log
        self.arg_names = tuple(arg_names) if arg_names is not None else None
        super().__init__(message)

    def diagnostics(self) -> str:
        log = self.log.strip()
        return f"{self.message}\n{log}" if log else self.message


class CompilerUnavailable(KcertError):
    """The compiler itself cannot be loaded here: an environment problem, not the kernel's."""

    kind = "environment"

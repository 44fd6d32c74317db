"""Feedback on a certification, written for whoever fixes the kernel next: a model or a person.

A generate -> verify -> refine loop feeds :func:`report_feedback` back to the
model that wrote the kernel. It says which checks failed and on which
smallest shape, the first bad element (got, want, allowed) and the largest
error, and for a failed build the compiler's own error at its source line.
Nothing else of the reference goes in: one expected value per failure is what
the failure needs, never the reference's arrays.

:func:`compiler_error` also finds where a compiler's log points in the
source, for ``kcert lint`` and the build check's details.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcert.certify.report import CertificationReport, CheckResult

#: Triton's CompilationError: ``at LINE:COL:`` (in the function), source lines, a caret.
_TRITON_AT = re.compile(r"^at (\d+):(\d+):\s*$", re.M)
#: NVRTC: ``name.cu(12): error: what``.
_NVRTC = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<what>.+)$",
                    re.M)  # fmt: skip
#: A log without a location is shown by its last lines only.
_LOG_TAIL_LINES = 20


@dataclass(frozen=True, slots=True)
class CompilerError:
    """The compiler's own error and where it points in the kernel's source."""

    file: str
    #: 1-based line in ``file``, when it could be placed.
    line: int | None
    #: 1-based column, when the compiler gave one.
    column: int | None
    source_line: str | None
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "column": self.column,
                "source_line": self.source_line, "error": self.error}  # fmt: skip

    def text(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        lines = [f"compiler error at {where}: {self.error}"]
        if self.source_line is not None:
            lines.append(f"    {self.source_line.rstrip()}")
            if self.column is not None:
                lines.append("    " + " " * (self.column - 1) + "^")
        return "\n".join(lines)


def compiler_error(log: str, source: bytes, filename: str) -> CompilerError | None:
    """Where a Triton or NVRTC build log points in ``source``; None when it names no place."""
    text = source.decode("utf-8", errors="replace")
    return _triton_error(log, text, filename) or _nvrtc_error(log, text, filename)


def _triton_error(log: str, text: str, filename: str) -> CompilerError | None:
    match = _TRITON_AT.search(log)
    if match is None:
        return None
    relative, column = int(match.group(1)), int(match.group(2)) + 1
    excerpt = log[match.end():].strip("\n").splitlines()
    caret = next((i for i, s in enumerate(excerpt) if s.strip() == "^"), None)
    error = next((s.strip() for s in reversed(excerpt) if s.strip()), "")
    if caret is None or caret == 0:
        return CompilerError(filename, None, None, None, error)
    offending = excerpt[caret - 1]
    # the line is counted from the ``def`` of the function that failed (the entry or a
    # helper it calls): the def whose line ``relative`` lands on the excerpt's text
    lines = text.splitlines()
    candidates = set()
    for start in _def_lines(text):
        index = start + relative - 2
        if 0 <= index < len(lines) and lines[index].rstrip() == offending.rstrip():
            candidates.add(index + 1)
    if len(candidates) != 1:
        return CompilerError(filename, None, column, offending, error)
    return CompilerError(filename, candidates.pop(), column, offending, error)


def _def_lines(text: str) -> list[int]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return [n.lineno for n in ast.walk(tree) if isinstance(n, functions)]


def _nvrtc_error(log: str, text: str, filename: str) -> CompilerError | None:
    match = _NVRTC.search(log)
    if match is None:
        return None
    line = int(match.group("line"))
    lines = text.splitlines() if match.group("file").endswith(filename) else []
    source_line = lines[line - 1] if 0 < line <= len(lines) else None
    return CompilerError(match.group("file"), line, _nvrtc_column(log[match.end():], source_line),
                         source_line, match.group("what").strip())  # fmt: skip


def _nvrtc_column(after: str, source_line: str | None) -> int | None:
    """NVRTC echoes the line (indented its own way) and a caret under the column."""
    echoed = after.lstrip("\n").splitlines()[:2]
    if source_line is None or len(echoed) < 2 or echoed[1].strip() != "^":
        return None
    code = source_line.strip()
    shown = echoed[0].find(code) if code else -1
    if shown < 0 or echoed[0].strip() != code:
        return None
    indent = len(source_line) - len(source_line.lstrip())
    return echoed[1].index("^") - shown + indent + 1


def report_feedback(report: CertificationReport) -> str:
    """The report as text to act on: what failed, where, by how much; or that it passed."""
    # lazy: kcert.certify.report imports this module back (a cycle inside the package)
    from kcert.certify.report import Status, Verdict

    kernel = report.kernel
    head = (f"kernel '{kernel.name}' (entry '{kernel.entry}' in {kernel.source_name}, "
            f"{kernel.language}) on {report.executor}, hardware {report.hw_class}: ")
    failed = [c for c in report.checks if c.status is Status.FAIL]
    if report.verdict is Verdict.PASS and not failed:
        return head + (f"PASS: every required check passed on {len(report.probes)} probe(s).")
    required = [c for c in failed if c.required]
    lines = [head + ("FAIL" if report.verdict is Verdict.FAIL else "PASS") +
             f": {len(required)} required check(s) failed"
             + (f", {len(failed) - len(required)} other(s)" if len(failed) > len(required) else "")
             + "."]  # fmt: skip
    for check in failed:
        lines.append("")
        lines.extend(_check_feedback(report, check))
    not_run = [c.name for c in report.checks
               if c.status is Status.SKIP and c.required and c.message.startswith("not run")]
    if not_run:
        lines += ["", f"not run because of the failures above: {', '.join(not_run)}"]
    return "\n".join(lines)


def _check_feedback(report: CertificationReport, check: CheckResult) -> list[str]:
    where = []
    if check.probe:
        where.append(f"first failing probe {check.probe}")
    smallest = report.minimized.get(check.name)
    if smallest:
        where.append("smallest failing shape " + ", ".join(f"{k}={v}" for k, v in smallest.items()))
    stopped = report.minimize_stopped.get(check.name)
    if stopped:
        where.append(f"shrinking stopped early: {stopped}")
    title = f"FAILED {check.name}" + ("" if check.required else " (not required)")
    lines = [title + (f" ({'; '.join(where)})" if where else "") + ":", f"  {check.message}"]
    if check.name == "build":
        lines.extend("  " + s for s in _build_log(check).splitlines())
    return lines


def _build_log(check: CheckResult) -> str:
    located = check.details.get("compiler_error")
    if isinstance(located, dict) and located.get("error"):
        return CompilerError(
            file=str(located.get("file", "")), line=_int(located.get("line")),
            column=_int(located.get("column")),
            source_line=located.get("source_line") if isinstance(
                located.get("source_line"), str) else None,
            error=str(located["error"]),
        ).text()  # fmt: skip
    log = str(check.details.get("log", "")).strip()
    if not log:
        return ""
    tail = log.splitlines()[-_LOG_TAIL_LINES:]
    return "compiler log (last lines):\n" + "\n".join(f"    {s}" for s in tail)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

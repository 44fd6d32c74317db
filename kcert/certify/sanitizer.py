"""The optional ``sanitizer`` check: probes run under NVIDIA compute-sanitizer.

``kcert certify --sanitize memcheck,racecheck,initcheck`` runs a probe or two
of a CUDA C kernel again, once per tool, each in a sandbox of its own whose
worker is started under ``compute-sanitizer --tool TOOL`` (the sandbox's
*wrapper*). The tool's report is parsed into :class:`Finding` values that go
into the certificate with the check. The tools see what the host-side checks
can only infer: racecheck names shared-memory hazards even when the race
happened to give the right sum, memcheck names each out-of-bounds access, and
initcheck names reads of global memory nothing wrote.

The check is skipped, with its reason, when it was not asked for, when the
executor is not ``cuda`` (Triton and the interpreter launch through torch,
whose own kernels would drown the report), or when compute-sanitizer is not
installed. An error-level finding fails it; warnings are recorded only.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcert.certify.report import CheckResult, Status
from kcert.errors import UsageError

__all__ = [
    "TOOLS", "Finding", "Report", "find_sanitizer", "parse_report", "parse_tools", "pick_probes",
    "sanitizer_check", "skipped",
]  # fmt: skip

TOOLS: tuple[str, ...] = ("memcheck", "racecheck", "initcheck", "synccheck")
#: Where compute-sanitizer is looked for after $KCERT_COMPUTE_SANITIZER and PATH.
_CANDIDATES = ("/usr/local/cuda/bin/compute-sanitizer", "/opt/cuda/bin/compute-sanitizer")
#: Probes larger than this are not run under a tool (racecheck slows kernels 10-100x).
MAX_ELEMENTS = 1 << 16
#: Findings kept per tool: the first ones say what is wrong; the count says how much.
PRINT_LIMIT = 50
#: A run under a tool may take this many times the deadline of an ordinary run.
SLOWDOWN = 4.0
_HINT = "kcert certify --sanitize memcheck,racecheck,initcheck"

# "========= " starts every line the tool writes; findings start right after it,
# their details are indented further
_PREFIX = re.compile(r"^=+ ?")
_SUMMARY = re.compile(r"^(ERROR|RACECHECK|LEAK) SUMMARY:\s*(.*)$")
_COUNT = re.compile(r"\[(\d+) hazards?\]")
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("race", re.compile(r"Race reported|hazard detected", re.IGNORECASE)),
    ("uninitialized-read", re.compile(r"Uninitialized .*(read|access)", re.IGNORECASE)),
    ("invalid-access", re.compile(r"Invalid (__\w+__ )?(read|write|atomic|access)", re.IGNORECASE)),
    ("misaligned-access", re.compile(r"misaligned", re.IGNORECASE)),
    ("sync", re.compile(r"Barrier|syncwarp|Invalid arguments", re.IGNORECASE)),
    ("leak", re.compile(r"Leaked|Malloc/Free", re.IGNORECASE)),
    ("api-error", re.compile(r"Program hit|CUDA API", re.IGNORECASE)),
    ("hardware-exception", re.compile(r"exception|Warp Illegal|Out-of-range", re.IGNORECASE)),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a compute-sanitizer tool reported."""

    tool: str
    kind: str
    #: "error" fails the check; "warning" (racecheck's possible hazards, API errors) does not.
    severity: str
    headline: str
    #: The report's indented lines under the headline, host backtrace left out.
    detail: tuple[str, ...] = ()
    #: Hazards racecheck folded into this one report (the sum of its "[N hazards]"), else 1.
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "kind": self.kind, "severity": self.severity,
                "headline": self.headline, "detail": list(self.detail), "count": self.count}


@dataclass(frozen=True, slots=True)
class Report:
    """One tool's whole report: its findings and its own summary line."""

    tool: str
    findings: tuple[Finding, ...]
    summary: str | None
    lines: int

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")


def parse_report(tool: str, text: str) -> Report:
    """Parse compute-sanitizer's output (``--log-file`` or its stdout) for ``tool``."""
    findings: list[Finding] = []
    summary: str | None = None
    headline: str | None = None
    detail: list[str] = []
    in_backtrace = False
    count = 0

    def close() -> None:
        if headline is not None:
            findings.append(_finding(tool, headline, detail))

    for raw in text.splitlines():
        prefixed = _PREFIX.match(raw)
        if prefixed is None or raw.strip("= ") == "":
            continue  # the application's own output, or an empty tool line
        count += 1
        body = raw[prefixed.end():]
        if body[:1].isspace():
            line = body.strip()
            if line.startswith(("Saved host backtrace", "Host Frame", "Device Frame")):
                in_backtrace = True
            elif headline is not None and not in_backtrace:
                detail.append(line)
            continue
        close()
        headline, detail, in_backtrace = None, [], False
        matched = _SUMMARY.match(body)
        if matched:
            summary = body.strip() if summary is None else f"{summary}; {body.strip()}"
        elif not body.startswith(("COMPUTE-SANITIZER", "Target application", "This ")):
            headline = body.strip()
    close()
    return Report(tool, tuple(findings), summary, count)


def _finding(tool: str, headline: str, detail: Sequence[str]) -> Finding:
    text = " ".join((headline, *detail))
    kind = next((name for name, pattern in _KINDS if pattern.search(text)), "other")
    lowered = headline.lower()
    warning = lowered.startswith("warning") or kind in ("api-error", "leak")
    hazards = [int(n) for n in _COUNT.findall(text)]
    return Finding(tool, kind, "warning" if warning else "error", headline, tuple(detail),
                   sum(hazards) if hazards else 1)  # fmt: skip


# ---------------------------------------------------------------------------- the check


def parse_tools(text: str) -> tuple[str, ...]:
    """``memcheck,racecheck`` to a tuple of tool names; a :class:`UsageError` for others."""
    tools = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in tools if t not in TOOLS]
    if unknown or not tools:
        raise UsageError(f"unknown compute-sanitizer tool(s) {', '.join(unknown) or '(none)'}; "
                         f"pick from {', '.join(TOOLS)}")  # fmt: skip
    return tools


def find_sanitizer() -> Path | None:
    """compute-sanitizer: $KCERT_COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, then /usr/local/cuda."""
    named = os.environ.get("KCERT_COMPUTE_SANITIZER")
    if named:
        return Path(named) if os.access(named, os.X_OK) else None
    found = shutil.which("compute-sanitizer")
    if found:
        return Path(found)
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    for candidate in [*(f"{h}/bin/compute-sanitizer" for h in homes if h), *_CANDIDATES]:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def skipped(reason: str) -> CheckResult:
    return CheckResult("sanitizer", Status.SKIP, reason, required=False)


def not_asked() -> CheckResult:
    return skipped(f"not asked for ({_HINT})")


def availability(executor: str) -> tuple[Path | None, str | None]:
    """compute-sanitizer's path, or why the check cannot run with this executor here."""
    if executor != "cuda":
        return None, (f"compute-sanitizer checks CUDA C kernels run by the cuda executor; "
                      f"this certification ran on '{executor}'")  # fmt: skip
    tool = find_sanitizer()
    if tool is None:
        return None, ("compute-sanitizer was not found ($KCERT_COMPUTE_SANITIZER, PATH, "
                      "$CUDA_HOME/bin, /usr/local/cuda/bin); it comes with the CUDA toolkit")
    return tool, None


def pick_probes(elements: Sequence[int], *, limit: int = MAX_ELEMENTS) -> list[int]:
    """Which probes run under each tool: the smallest, and the largest up to ``limit``."""
    if not elements:
        return []
    order = sorted(range(len(elements)), key=lambda i: elements[i])
    picked = [order[0]]
    fitting = [i for i in order if elements[i] <= limit]
    if fitting and fitting[-1] != order[0]:
        picked.append(fitting[-1])
    return picked


def version(sanitizer: Path) -> str:
    """The tool's version line, for the certificate ("" when it cannot be told)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([str(sanitizer), "--version"], capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip
        lines = [x.strip() for x in done.stdout.splitlines() if "Version" in x or "version" in x]
        return lines[-1] if lines else done.stdout.strip()[:200]
    return ""


def wrapper(sanitizer: Path, tool: str, log_file: Path) -> tuple[str, ...]:
    """The command line put before the worker's for one tool."""
    return (str(sanitizer), "--tool", tool, "--print-limit", str(PRINT_LIMIT),
            "--error-exitcode", "0", "--log-file", str(log_file))  # fmt: skip


@dataclass
class _ToolRun:
    tool: str
    report: Report | None = None
    failures: list[str] = field(default_factory=list)


#: Runs the chosen probes in a sandbox made with the given wrapper, with the given folder
#: (where the tool writes its report) writable inside it; returns one message per run that
#: did not complete (a crash, a launch error, a timeout).
ProbeRunner = Callable[[tuple[str, ...], Path], list[str]]


def sanitizer_check(tools: Sequence[str], sanitizer: Path, run_probes: ProbeRunner,
                    probe_ids: Sequence[str]) -> CheckResult:  # fmt: skip
    """Run the probes under each tool (side by side, each in its own sandbox) and judge.

    The tools' reports go to a temporary folder, or to $KCERT_SANITIZER_LOGS when it
    names one (to keep them).
    """
    kept = os.environ.get("KCERT_SANITIZER_LOGS")
    with contextlib.ExitStack() as stack:
        if kept:
            Path(kept).mkdir(parents=True, exist_ok=True)
            folder = tempfile.mkdtemp(prefix="kcert-sanitizer-", dir=kept)
        else:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="kcert-sanitizer-"))

        def one(tool: str) -> _ToolRun:
            log = Path(folder) / f"{tool}.log"
            run = _ToolRun(tool)
            run.failures = run_probes(wrapper(sanitizer, tool, log), Path(folder))
            text = log.read_text(errors="replace") if log.exists() else ""
            run.report = parse_report(tool, text) if text else None
            return run

        with ThreadPoolExecutor(max_workers=len(tools)) as pool:
            runs = list(pool.map(one, tools))
    return judge(runs, probe_ids, version(sanitizer))


def judge(runs: Sequence[_ToolRun], probe_ids: Sequence[str], tool_version: str) -> CheckResult:
    """The ``sanitizer`` check from each tool's report and the runs that did not complete."""
    findings = [f for r in runs if r.report for f in r.report.findings]
    errors = [f for f in findings if f.severity == "error"]
    silent = [r.tool for r in runs if r.report is None]
    failures = [f"{r.tool}: {m}" for r in runs for m in r.failures]
    details: dict[str, Any] = {
        "tools": [r.tool for r in runs], "probes": list(probe_ids), "version": tool_version,
        "summaries": {r.tool: r.report.summary for r in runs if r.report},
        "findings": [f.to_json() for f in findings],
    }  # fmt: skip
    if failures:
        details["failed_runs"] = failures
    probe = probe_ids[0] if probe_ids else None
    if errors:
        by_tool: dict[str, list[Finding]] = {}
        for f in errors:
            by_tool.setdefault(f.tool, []).append(f)
        parts = []
        for tool, found in by_tool.items():
            hazards = sum(f.count for f in found)
            extent = f" over {hazards} hazards" if hazards > len(found) else ""
            first = found[0].headline + (f" {found[0].detail[0]}" if found[0].detail else "")
            parts.append(f"{tool}: {len(found)} error(s){extent}; first: {first}")
        return CheckResult("sanitizer", Status.FAIL, "; ".join(parts), probe, details=details)
    if failures or silent:
        why = failures + [f"{t}: compute-sanitizer wrote no report" for t in silent]
        return CheckResult("sanitizer", Status.FAIL, "runs under compute-sanitizer did not "
                           f"complete: {'; '.join(why)}", probe, details=details)  # fmt: skip
    message = f"no errors from {', '.join(r.tool for r in runs)} on {len(probe_ids)} probe(s)"
    if findings:
        message += f" ({len(findings)} warning(s) recorded)"
    return CheckResult("sanitizer", Status.PASS, message, details=details)

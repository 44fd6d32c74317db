"""Source locations for CI findings: a kernel's definition, and what its compiler points at.

Everything here reads text: the kernel source's bytes as the spec loaded them
(parsed with :mod:`ast` for Triton, never imported) and the compiler's log. A
log is written by the kernel's author as much as by the compiler (``#line``
directives, crafted error text), so a finding is placed only in a file the
kernel's own source bundle holds; anything else falls back to the definition.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from kcert.certify.report import CheckResult, Status
from kcert.certify.spec import KernelSpec

#: ``name.cu(12): error: ...`` and ``name.cu(3): warning #177-D: ...`` (NVRTC).
_NVRTC = re.compile(
    r"^(?P<file>[^\s()][^()]*)\((?P<line>\d+)\): (?P<level>catastrophic error|error|warning|"
    r"remark)(?: #[\w-]+)?: (?P<text>.*)$"
)
#: Triton's CompilationError: ``at 4:16:`` then the jit function's source from its ``def``.
_TRITON = re.compile(r"^at (?P<line>\d+):(?P<col>\d+):\n(?P<def>def\s+(?P<fn>\w+)[^\n]*)", re.M)
#: A Python error in the module: ``invalid syntax (saxpy.py, line 11)``.
_PYTHON = re.compile(r"\((?P<file>[^(),\n]+), line (?P<line>\d+)\)")


@dataclass(frozen=True, slots=True)
class Location:
    path: Path
    line: int
    column: int | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """A compiler or lint message at a place in the kernel's source."""

    level: str  # SARIF levels: "error", "warning" or "note"
    message: str
    location: Location


def definition(kernel: KernelSpec) -> Location:
    """Where the kernel's entry is defined (line 1 when the source does not show it)."""
    text = kernel.code.main.data.decode("utf-8", errors="replace")
    if kernel.language == "triton":
        found = _python_function(text, kernel.entry)
        if found is not None:
            return Location(kernel.source, *found)
        return Location(kernel.source, 1)
    name = re.escape(kernel.entry)
    match = (re.search(rf"__global__[^;{{}}()]*?\b(?P<name>{name})\s*\(", text)
             or re.search(rf"\b(?P<name>{name})\s*\(", text))  # fmt: skip
    if match is None:
        return Location(kernel.source, 1)
    start = match.start("name")
    line_start = text.rfind("\n", 0, start) + 1
    return Location(kernel.source, text.count("\n", 0, start) + 1, start - line_start + 1)


def _python_function(text: str, name: str) -> tuple[int, int] | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node.lineno, node.col_offset + 1
    return None


def build_findings(kernel: KernelSpec, check: CheckResult) -> tuple[Finding, ...]:
    """What the ``build`` check's log and lint notes place at a source line."""
    if check.name != "build":
        return ()
    log = str(check.details.get("log", ""))
    found = [*_nvrtc(kernel, log), *_triton(kernel, log)]
    if check.status is Status.FAIL and not found:
        found.extend(_python(kernel, check.message + "\n" + log))
    for hazard in check.details.get("interpreter_hazards", ()) or ():
        if isinstance(hazard, dict) and isinstance(hazard.get("line"), int):
            found.append(Finding("warning", "differs under the Triton interpreter: "
                                 f"{hazard.get('message', '')}",
                                 Location(kernel.source, hazard["line"])))  # fmt: skip
    return tuple(found)


def _files(kernel: KernelSpec) -> dict[str, tuple[Path, list[str]]]:
    """The bundle's files by the name the compiler knows them by, with their lines."""
    folder = kernel.source.parent
    return {f.name: (kernel.source if f is kernel.code.main else folder / f.name,
                     f.data.decode("utf-8", errors="replace").splitlines())
            for f in kernel.code.files()}  # fmt: skip


def _nvrtc(kernel: KernelSpec, log: str) -> list[Finding]:
    files = _files(kernel)
    lines = log.splitlines()
    found: list[Finding] = []
    for i, text in enumerate(lines):
        match = _NVRTC.match(text)
        if match is None or match["file"] not in files:
            continue
        path, source = files[match["file"]]
        line = int(match["line"])
        if not 1 <= line <= max(len(source), 1):
            continue
        level = "warning" if match["level"] == "warning" else (
            "note" if match["level"] == "remark" else "error")  # fmt: skip
        column = _caret_column(lines[i + 1: i + 3], source[line - 1] if source else "")
        found.append(Finding(level, match["text"].strip(), Location(path, line, column)))
    return found


def _caret_column(echo: list[str], source_line: str) -> int | None:
    """NVRTC echoes the line (indented) and puts a caret under the spot."""
    if len(echo) < 2 or echo[1].strip() != "^" or echo[0].strip() != source_line.strip():
        return None
    shift = (len(echo[0]) - len(echo[0].lstrip())) - (len(source_line) - len(source_line.lstrip()))
    column = echo[1].index("^") - shift + 1
    return column if 1 <= column <= len(source_line) + 1 else None


def _triton(kernel: KernelSpec, log: str) -> list[Finding]:
    if kernel.language != "triton":
        return []
    matches = list(_TRITON.finditer(log))
    if not matches:
        return []
    last = matches[-1]  # the innermost frame: where the error is, not its callers
    found = _python_function(kernel.code.main.data.decode("utf-8", errors="replace"), last["fn"])
    if found is None:
        return []
    def_line, def_column = found
    tail = log[last.end():].splitlines()
    # after the quoted source and its caret line comes the error itself
    caret = next((i for i, t in enumerate(tail) if t.strip() == "^"), None)
    message = "\n".join(tail[caret + 1:] if caret is not None else tail).strip()
    line = def_line + int(last["line"]) - 1
    column = def_column + int(last["col"])
    return [Finding("error", message or "Triton cannot compile this line",
                    Location(kernel.source, line, column))]  # fmt: skip


def _python(kernel: KernelSpec, text: str) -> list[Finding]:
    if kernel.language != "triton":
        return []
    for match in _PYTHON.finditer(text):
        if match["file"].strip() == kernel.code.main.name:
            return [Finding("error", text.strip().splitlines()[0],
                            Location(kernel.source, int(match["line"])))]  # fmt: skip
    return []

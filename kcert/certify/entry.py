"""Is the spec's ``entry`` defined in the kernel source at all? Read, never run.

A typo in ``entry`` is a mistake in the spec, not a kernel that fails to
build: it must stop with a spec error (exit 2) before anything is built, run
or signed. The source is parsed (Triton: Python's ``ast``; CUDA C: its
tokens), never imported. The check only refuses what is certainly absent: a
name the module could bind in a way the parse cannot follow (``from m import
*``, a source that does not parse) is left to the build, which says why.
"""

from __future__ import annotations

import ast
import difflib
import re

from kcert.certify.spec import KernelSpec

_DYNAMIC = frozenset({"globals", "setattr", "vars", "exec", "eval", "__import__"})
_CUDA_KERNEL = re.compile(r"__global__\s+(?:[\w:<>*&]+\s+)*?(\w+)\s*\(")


def check_entry(kernel: KernelSpec) -> None:
    """Raise a :class:`~kcert.certify.errors.SpecError` on key ``entry`` when it is not defined."""
    if kernel.language == "triton":
        known = _python_names(kernel.code.main.data)
        if known is None or kernel.entry in known.names:
            return
        candidates, where = known.functions, kernel.code.main.name
    else:
        texts = [f.data.decode("utf-8", errors="replace") for f in kernel.code.files()]
        word = re.compile(rf"\b{re.escape(kernel.entry)}\b")
        if any(word.search(text) for text in texts):
            return
        candidates = sorted({m.group(1) for t in texts for m in _CUDA_KERNEL.finditer(t)})
        where = ", ".join(f.name for f in kernel.code.files())
    close = difflib.get_close_matches(kernel.entry, candidates, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    listed = ", ".join(candidates) if candidates else "none"
    what = "@triton.jit functions" if kernel.language == "triton" else "__global__ functions"
    raise kernel.error(
        "entry", f"'{kernel.entry}' is not defined in {where} ({what} there: {listed}){hint}")


class _Names:
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.functions: list[str] = []


def _python_names(source: bytes) -> _Names | None:
    """Every name the module's top level binds; None when the parse cannot tell."""
    try:
        tree = ast.parse(source.decode("utf-8-sig"))
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return None  # the build reports the real problem with the source
    if any(isinstance(n, ast.Name) and n.id in _DYNAMIC for n in ast.walk(tree)):
        return None  # module code that binds names by string: only running it would tell
    found = _Names()
    if not _bind(tree.body, found):
        return None
    return found


def _bind(body: list[ast.stmt], found: _Names) -> bool:
    """Add what ``body`` binds to ``found``; False when a statement binds unknown names."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.names.add(node.name)
            if not isinstance(node, ast.ClassDef) and any(_is_jit(d) for d in node.decorator_list):
                found.functions.append(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return False
                found.names.add(alias.asname or alias.name.split(".")[0])
        else:
            for child in ast.walk(node):
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                    found.names.add(child.id)
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    found.names.add(child.name)  # under an ``if`` or ``try`` at top level
                elif isinstance(child, ast.Global):
                    found.names.update(child.names)
                elif isinstance(child, ast.Import | ast.ImportFrom):
                    if any(a.name == "*" for a in child.names):
                        return False
                    found.names.update(a.asname or a.name.split(".")[0] for a in child.names)
    return True


def _is_jit(decorator: ast.expr) -> bool:
    """``@triton.jit``, ``@jit`` or either called with arguments."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "jit"

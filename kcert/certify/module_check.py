"""Decide from the AST alone whether a Triton kernel module is data, not a program.

Importing a Triton module runs all of its top level, and Triton calls hooks
(``pre_hook``, ``prune_configs_by``, ``repr``...) around every launch. Before
anything imports a kernel module, :func:`check_module` parses its bytes and
allows only allowlisted imports, ``@triton.jit`` functions under
``triton.autotune``/``triton.heuristics`` with literal arguments, and constants
bound to literal expressions. Everything else is a :class:`Finding`, and all of
them are reported at once in a :class:`ModuleCodeError`. Nothing of the kernel
is imported or executed here; what is allowed, and the walk, live in
:mod:`kcert.certify.module_rules`.

The check is an allowlist throughout, jit bodies included. Under the
interpreter a ``@triton.jit`` body runs as Python, and Triton's code generator
calls any Python callable the body names, so an attribute chain off ``tl`` may
name only public Triton API (``tl.load``, ``libdevice.tanh``), any other
attribute only a Triton tensor, dtype or constexpr member, never a ``_`` name,
and a module is never a value (:mod:`kcert.certify.jit_rules`; the names are read
from the installed Triton). That is defence in depth, not the boundary: the
sandbox is. A bypass of this check is contained there, not harmless, so the
build and every run of a kernel stay in the sandbox.
"""

from __future__ import annotations

import ast
import codecs
import io
import tokenize

from kcert.certify.errors import ModuleCodeError
from kcert.certify.module_rules import Finding, ModuleRules

__all__ = ["Finding", "ModuleCodeError", "check_module", "module_findings"]


def check_module(source: bytes, filename: str) -> None:
    """Raise :class:`ModuleCodeError` listing every finding, unless ``source`` is clean."""
    findings = module_findings(source)
    if findings:
        raise ModuleCodeError(filename, findings)


def module_findings(source: bytes) -> tuple[Finding, ...]:
    """Every refused construct in ``source``, in file order (empty when it is clean).

    With ``--allow-module-code`` the pipeline runs the module anyway, in the
    sandbox, and can record these in the certificate.
    """
    text = _decode(source)
    if isinstance(text, Finding):
        return (text,)
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        where = (exc.lineno or 1, max((exc.offset or 1) - 1, 0))
        return (Finding(*where, f"the module is not valid Python ({exc.msg}); fix the syntax"),)
    except ValueError as exc:  # NUL bytes, on Pythons that do not call them a SyntaxError
        return (Finding(1, 0, f"the module is not valid Python ({exc}); fix the source"),)
    rules = ModuleRules()
    rules.module(tree)
    unique = {(f.line, f.col, f.message): f for f in rules.findings}
    return tuple(sorted(unique.values(), key=lambda f: (f.line, f.col)))


def _decode(source: bytes) -> str | Finding:
    """The text Python's importer would read, or why it might read something else.

    A coding declaration (``# coding: utf-7``) makes the importer decode the
    same bytes into another program than the one checked, so only UTF-8 is
    accepted, and the bytes are decoded here rather than by ``ast.parse``.
    """
    try:
        text = source.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = source[: exc.start].count(b"\n") + 1
        col = exc.start - (source.rfind(b"\n", 0, exc.start) + 1)
        bad = source[exc.start]
        return Finding(line, col, f"byte 0x{bad:02x} is not UTF-8; save the file as UTF-8")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        utf8 = codecs.lookup(encoding).name == "utf-8"
    except (SyntaxError, LookupError):
        encoding, utf8 = "unknown", False
    if utf8:
        return text
    line = next((i for i, t in enumerate(source.splitlines()[:2], 1) if b"coding" in t), 1)
    return Finding(
        line,
        0,
        f"a coding declaration ({encoding}) makes Python read these bytes as another text; "
        "remove it and save the file as UTF-8",
    )

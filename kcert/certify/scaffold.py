"""``kcert init``: scaffold a ``[[kernel]]`` table from a kernel's signature.

The signature says a lot but not everything. A ``const`` pointee is an input;
a non-const pointer is an output, or in-out when the body also reads it. C
scalar types map to dtypes. Triton has no types, so its pointers are found by
how the body loads and stores through them. What the signature cannot say
(the sizes to probe, and shapes when there are several sizes) is left as
:data:`~kcert.certify.spec.PLACEHOLDER`, which the spec parser refuses with a
message saying to fill it in.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from kcert.certify.errors import SPEC_NAME, ScaffoldError
from kcert.certify.spec import PLACEHOLDER

REFERENCE_FILE = "reference.py"

#: C scalar types (after dropping ``const``, ``volatile`` and restrict) to dtypes.
C_TYPES = {
    "float": "f32",
    "double": "f64",
    "__half": "f16",
    "half": "f16",
    "__nv_bfloat16": "bf16",
    "nv_bfloat16": "bf16",
    "bool": "bool",
    "char": "i8",
    "signed char": "i8",
    "int8_t": "i8",
    "unsigned char": "u8",
    "uint8_t": "u8",
    "short": "i16",
    "int16_t": "i16",
    "unsigned short": "u16",
    "uint16_t": "u16",
    "int": "i32",
    "signed": "i32",
    "signed int": "i32",
    "int32_t": "i32",
    "unsigned": "u32",
    "unsigned int": "u32",
    "uint32_t": "u32",
    "long": "i64",
    "long long": "i64",
    "long int": "i64",
    "int64_t": "i64",
    "long long int": "i64",
    "unsigned long": "u64",
    "unsigned long long": "u64",
    "uint64_t": "u64",
    "size_t": "u64",
    "ptrdiff_t": "i64",
}
_INT_DTYPES = frozenset({"i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"})
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict)\b")
_FLOATISH = re.compile(
    r"^(eps|epsilon|alpha|beta|gamma|scale|a|b|lr|momentum|temperature|"
    r"theta|factor|weight|bias|val|value)$",
    re.I,
)


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    #: "in" / "out" / "inout" for buffers, "scalar" or "const" otherwise.
    role: str
    dtype: str | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Scaffold:
    spec_path: Path
    name: str
    created_spec: bool
    reference_path: Path
    reference_written: bool
    text: str
    notes: tuple[str, ...] = field(default=())


def scaffold(source: Path, *, entry: str | None = None) -> Scaffold:
    """Add a ``[[kernel]]`` for ``source`` to the kcert.toml beside it (creating it if need be)."""
    if not source.is_file():
        raise ScaffoldError(f"{source} is not a file")
    if source.suffix not in (".cu", ".py"):
        raise ScaffoldError(f"{source} must be CUDA C (.cu) or Triton (.py)")
    try:
        text = source.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScaffoldError(f"cannot read {source}: {exc}") from exc
    notes: list[str] = []
    if source.suffix == ".cu":
        name, params = _cuda_signature(text, entry, source, notes)
    else:
        name, params = _triton_signature(text, entry, source, notes)
    spec_path = source.parent / SPEC_NAME
    created = not spec_path.exists()
    if not created:
        _refuse_duplicate(spec_path, name)
    table = _render(name, source.name, params, source.suffix == ".cu", notes)
    if created:
        spec_path.write_text("version = 1\n\n" + table, "utf-8")
    else:
        existing = spec_path.read_text("utf-8")
        sep = "" if existing.endswith("\n\n") else ("\n" if existing.endswith("\n") else "\n\n")
        spec_path.write_text(existing + sep + table, "utf-8")
    reference = source.parent / REFERENCE_FILE
    written = not reference.exists()
    if written:
        reference.write_text(_reference_template(name, params), "utf-8")
    elif not re.search(rf"^def {re.escape(name)}\b", reference.read_text("utf-8"), re.M):
        notes.append(f"add a function '{name}' to {reference.name}: the NumPy reference")
    return Scaffold(spec_path, name, created, reference, written, table, tuple(notes))


def _refuse_duplicate(spec_path: Path, name: str) -> None:
    try:
        data = tomllib.loads(spec_path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ScaffoldError(
            f"{spec_path} exists but cannot be read as TOML ({exc}); fix it before adding a kernel"
        ) from exc
    tables = data.get("kernel", [])
    if isinstance(tables, list) and any(
        isinstance(t, dict) and t.get("name") == name for t in tables
    ):
        raise ScaffoldError(
            f"{spec_path} already has a [[kernel]] named '{name}'; "
            "edit that table instead, or rename one of them"
        )


# ------------------------------------------------------------------------ CUDA C


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _matching(text: str, start: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at ``start``, or -1."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _cuda_signature(
    text: str, entry: str | None, source: Path, notes: list[str]
) -> tuple[str, list[Param]]:
    code = _strip_comments(text)
    kernels = list(
        re.finditer(
            r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
            r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(",
            code,
        )
    )
    names = [m.group(1) for m in kernels]
    if not kernels:
        raise ScaffoldError(f"{source} has no '__global__ void name(...)' kernel")
    if entry is None and len(kernels) > 1:
        raise ScaffoldError(
            f"{source} has several kernels ({', '.join(names)}); pick one with --entry"
        )
    match = kernels[0] if entry is None else next((m for m in kernels if m.group(1) == entry), None)
    if match is None:
        raise ScaffoldError(f"{source} has no kernel '{entry}' (found: {', '.join(names)})")
    name = match.group(1)
    close = _matching(code, match.end() - 1, "(", ")")
    if close < 0:
        raise ScaffoldError(f"cannot find the end of {name}'s parameter list in {source}")
    body_start = code.find("{", close)
    body_end = _matching(code, body_start, "{", "}") if body_start >= 0 else -1
    body = code[body_start:body_end] if body_end > 0 else ""
    if 'extern "C"' not in code[: match.start()]:
        notes.append(
            f"'{name}' is not declared extern \"C\"; NVRTC would mangle its name and "
            "lint will not find the entry"
        )
    raw = code[match.end() : close].strip()
    params = [_cuda_param(p.strip(), name, body) for p in raw.split(",")] if raw else []
    if not params:
        raise ScaffoldError(f"'{name}' takes no parameters: there is nothing to check")
    return name, params


def _cuda_param(decl: str, kernel: str, body: str) -> Param:
    if "[" in decl or "&" in decl or "<" in decl or "(" in decl:
        raise ScaffoldError(
            f"parameter '{decl}' of '{kernel}' is not a plain pointer or scalar; "
            "kcert init handles 'T* name' and 'T name' only"
        )
    match = re.match(r"^(.*?)([A-Za-z_]\w*)$", decl.strip())
    if match is None:
        raise ScaffoldError(f"cannot read parameter '{decl}' of '{kernel}'")
    head, name = match.groups()
    stars = head.count("*")
    pointee = head.split("*", 1)[0]
    base = " ".join(_QUALIFIERS.sub(" ", pointee).split())
    dtype = C_TYPES.get(base)
    if dtype is None or stars > 1:
        kind = f"'{base}{' *' * stars}'"
        raise ScaffoldError(
            f"parameter '{name}' of '{kernel}' has type {kind}, which has no kcert "
            f"dtype; known C types: {', '.join(sorted(C_TYPES))} (and pointers "
            "to them)"
        )
    if not stars:
        return Param(name, "scalar", dtype)
    if re.search(r"\bconst\b", pointee):
        return Param(name, "in", dtype, "const pointee: read-only")
    reads, writes = _uses(body, name)
    if writes and not reads:
        return Param(name, "out", dtype, "written, never read")
    return Param(
        name,
        "inout",
        dtype,
        "non-const pointer, read or aliased: use out if the kernel never reads it",
    )


def _uses(body: str, name: str) -> tuple[bool, bool]:
    """Whether ``body`` reads and whether it writes through ``name`` (direct indexing only)."""
    reads = writes = False
    for match in re.finditer(rf"\b{re.escape(name)}\b", body):
        pos = match.end()
        while pos < len(body) and body[pos].isspace():
            pos += 1
        if pos >= len(body) or body[pos] != "[":
            reads = True  # pointer arithmetic or passing it on: may read
            continue
        end = _matching(body, pos, "[", "]")
        rest = body[end + 1 :].lstrip() if end > 0 else ""
        if re.match(r"=(?!=)", rest):
            writes = True
        elif re.match(r"(\+|-|\*|/|%|&|\||\^|<<|>>)=", rest):
            reads = writes = True
        else:
            reads = True
    return reads, writes


# ------------------------------------------------------------------------ Triton


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr == "jit"
    return isinstance(target, ast.Name) and target.id == "jit"


def _triton_signature(
    text: str, entry: str | None, source: Path, notes: list[str]
) -> tuple[str, list[Param]]:
    try:
        tree = ast.parse(text, filename=str(source))
    except SyntaxError as exc:
        raise ScaffoldError(f"{source} is not valid Python: {exc}") from exc
    functions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list)
    ]
    names = [f.name for f in functions]
    if not functions:
        raise ScaffoldError(f"{source} has no @triton.jit function")
    if entry is None and len(functions) > 1:
        raise ScaffoldError(
            f"{source} has several @triton.jit functions ({', '.join(names)}); "
            "pick one with --entry"
        )
    fn = functions[0] if entry is None else next((f for f in functions if f.name == entry), None)
    if fn is None:
        raise ScaffoldError(
            f"{source} has no @triton.jit function '{entry}' (found: {', '.join(names)})"
        )
    loaded, stored = _pointer_uses(fn)
    params: list[Param] = []
    for arg in fn.args.args:
        annotation = ast.unparse(arg.annotation) if arg.annotation else ""
        if annotation.endswith("constexpr"):
            params.append(Param(arg.arg, "const", None))
        elif arg.arg in loaded or arg.arg in stored or "ptr" in arg.arg.lower():
            role = (
                "inout"
                if arg.arg in loaded and arg.arg in stored
                else ("out" if arg.arg in stored else "in")
            )
            params.append(Param(arg.arg, role, "f32", "pointer: check the dtype"))
        elif annotation == "float" or _FLOATISH.match(arg.arg):
            params.append(Param(arg.arg, "scalar", "f32"))
        else:
            params.append(Param(arg.arg, "scalar", "i32"))
    if any(p.role in ("in", "out", "inout") for p in params):
        notes.append("Triton pointers carry no type: every buffer was guessed as f32")
    return fn.name, params


def _pointer_uses(fn: ast.FunctionDef) -> tuple[set[str], set[str]]:
    """Names used as the base of ``tl.load`` and ``tl.store`` addresses.

    In ``out_ptr + row * n + cols`` only ``out_ptr`` is a base: names under a
    product are offsets. Simple local assignments (``base = x_ptr + row * n``)
    are followed.
    """
    assigned: dict[str, ast.expr] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                assigned[target.id] = node.value
    loaded: set[str] = set()
    stored: set[str] = set()
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        attr = func.attr if isinstance(func, ast.Attribute) else None
        if attr in ("load", "store") or (attr or "").startswith("atomic_"):
            names = _address_bases(node.args[0], assigned, set())
            (stored if attr == "store" else loaded).update(names)
            if attr and attr.startswith("atomic_"):
                stored.update(names)
    return loaded, stored


def _address_bases(node: ast.expr, assigned: dict[str, ast.expr], seen: set[str]) -> set[str]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _address_bases(node.left, assigned, seen) | _address_bases(
            node.right, assigned, seen
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        return _address_bases(node.left, assigned, seen)
    if isinstance(node, ast.Subscript):
        return _address_bases(node.value, assigned, seen)
    if isinstance(node, ast.Name):
        if node.id in assigned and node.id not in seen:
            return {node.id} | _address_bases(assigned[node.id], assigned, seen | {node.id})
        return {node.id}
    return set()


# ------------------------------------------------------------------------ rendering


def _render(name: str, source: str, params: list[Param], cuda: bool, notes: list[str]) -> str:
    sizes = [
        p.name
        for p in params
        if p.role == "scalar" and p.dtype in _INT_DTYPES and not p.name.lower().startswith("stride")
    ]
    consts = [p.name for p in params if p.role == "const"]
    shape = sizes[0] if len(sizes) == 1 else PLACEHOLDER
    if len(sizes) != 1:
        notes.append(
            f"write each buffer's shape in place of {PLACEHOLDER} (e.g. f32[m, k]) and the grid"
        )
    if cuda:
        grid = f"cdiv({sizes[0]}, 256)" if len(sizes) == 1 else PLACEHOLDER
        launch = f'grid = ["{grid}"]\nblock = [256]\n'
    else:
        one = len(sizes) == 1 and len(consts) == 1
        grid = f"cdiv({sizes[0]}, {consts[0]})" if one else PLACEHOLDER
        launch = f'grid = ["{grid}"]\n'
    dims = ", ".join(f'{s} = "{PLACEHOLDER}"' for s in sizes) or f'n = "{PLACEHOLDER}"'
    lines = [
        "[[kernel]]",
        f'name = "{name}"',
        f'source = "{source}"',
        f'entry = "{name}"',
        f'reference = "{REFERENCE_FILE}:{name}"',
        launch.rstrip("\n"),
        f"# {PLACEHOLDER}: the sizes to probe per dim, edges included, e.g. [1, 31, 32, 33, 1000]",
        f"dims = {{ {dims} }}",
        "",
        "[kernel.args]  # every parameter, in order",
    ]
    for p in params:
        if p.role == "const":
            value, comment = '"const = 128"', "tl.constexpr: pick its value (may use the dims)"
        elif p.role == "scalar" and p.name in sizes:
            value, comment = f'"{p.dtype} = {p.name}"', "a size: probed over dims"
        elif p.role == "scalar" and p.dtype in _INT_DTYPES:
            value, comment = f'"{p.dtype} = {PLACEHOLDER}"', "write its value as an expression"
        elif p.role == "scalar":
            value, comment = f'"{p.dtype} = 1.5"', "pick the value to probe"
        else:
            value, comment = f'"{p.role} {p.dtype}[{shape}]"', p.note
        lines.append(f"{p.name} = {value}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines) + "\n"


def _reference_template(name: str, params: list[Param]) -> str:
    outputs = [p.name for p in params if p.role in ("out", "inout")]
    args = ", ".join(p.name for p in params)
    returns = (
        f"the expected '{outputs[0]}' (one array)"
        if len(outputs) == 1
        else "a dict of the expected outputs by name: " + ", ".join(outputs)
    )
    return f'''"""NumPy references for the kernels in {SPEC_NAME}.

kcert calls each reference with every kernel argument by name (buffers as
NumPy arrays of their shape, scalars and consts as numbers) and compares the
kernel's outputs against what it returns.
"""

import numpy as np  # noqa: F401  (the reference is written with it)


def {name}(*, {args}):
    """Return {returns}."""
    raise NotImplementedError("write the NumPy reference for {name}")
'''

"""What a ``@triton.jit`` body may name: public Triton API, read from the installed Triton.

A jit body runs as Python under the interpreter, and Triton's code generator
calls the Python callables it meets while compiling. Triton's modules import
standard ones (``tl.extra`` holds ``pkgutil``, ``tl.core`` holds ``typing``...),
so an attribute chain off ``tl`` could reach anything Python has loaded. So
names are allowlisted, never denylisted: off a module alias, only the public
device API of a few Triton modules (:func:`triton_api`); off anything else, only
the public members of Triton's tensor, dtype and constexpr; never a ``_`` name,
and never a module as a value. :mod:`kcert.certify.module_rules` walks the
body and asks the functions here about each name, chain and subscript.
Importing Triton is fine: it is a trusted library, not kernel code; the sets
are computed once per process.
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kcert.certify.errors import CompilerUnavailable

#: The modules a kernel may reach, and the submodules each may name. Every other
#: submodule (``core``, ``random``, ``target_info``, ``runtime``...) and every module
#: Triton itself imports is refused.
API_SUBMODULES: Mapping[str, frozenset[str]] = {
    "triton": frozenset({"language"}),
    "triton.language": frozenset({"math", "extra", "standard"}),
    "triton.language.math": frozenset(),
    "triton.language.standard": frozenset(),
    "triton.language.extra": frozenset({"libdevice", "cuda"}),
    "triton.language.extra.libdevice": frozenset(),
    "triton.language.extra.cuda": frozenset({"libdevice"}),
    "triton.language.extra.cuda.libdevice": frozenset(),
    "math": frozenset(),
}
#: What a kernel body may use of the ``triton`` package itself: pure integer
#: helpers. The rest of ``triton.__all__`` (``compile``, ``set_allocator``,
#: ``runtime``...) is host-side.
TRITON_BODY_NAMES = frozenset({"cdiv", "next_power_of_2"})
#: Public instance attributes that are Triton's internals, not its API:
#: ``tensor.handle`` is the IR value, or under the interpreter a numpy buffer.
INTERNAL_ATTRIBUTES = frozenset({"handle"})


@dataclass(frozen=True, slots=True)
class TritonApi:
    """What an attribute chain in a kernel body may name."""

    #: module -> the functions, classes, dtypes and constants it may name
    names: Mapping[str, frozenset[str]]
    #: module -> the API submodules it may name (only modules that are installed)
    submodules: Mapping[str, frozenset[str]]
    #: what may follow any other expression: tensor, dtype and constexpr members
    object_attributes: frozenset[str]


@functools.cache
def triton_api() -> TritonApi:
    """The allowlists for the installed Triton (imported here on first use).

    Without Triton nothing could be checked, so that is an error, not an empty list.
    """
    try:
        importlib.import_module("triton.language")
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:  # missing or broken
        raise CompilerUnavailable(
            f"Triton cannot be imported ({exc}); install kcert[triton] to check .py kernels"
        ) from exc
    modules = {name: mod for name in API_SUBMODULES if (mod := _import(name)) is not None}
    names = {name: _device_names(name, mod) for name, mod in modules.items()}
    submodules = {
        name: frozenset(s for s in subs if f"{name}.{s}" in modules)
        for name, subs in API_SUBMODULES.items()
        if name in modules
    }
    return TritonApi(names, submodules, _object_attributes())


def _import(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:  # an optional backend (extra.cuda) that this Triton lacks
        return None


def _device_names(name: str, module: types.ModuleType) -> frozenset[str]:
    if name == "math":
        return frozenset(
            n for n in dir(math)
            if not n.startswith("_") and (callable(getattr(math, n)) or _number(getattr(math, n)))
        )  # fmt: skip
    if name == "triton":
        return TRITON_BODY_NAMES & frozenset(module.__all__)
    if name == "triton.language.extra":
        return frozenset()  # only its backends; the rest is its import loop's leftovers
    listed = frozenset(getattr(module, "__all__", ()))
    return frozenset(
        n for n in dir(module)
        if not n.startswith("_") and _device_object(getattr(module, n), listed=n in listed)
    )  # fmt: skip


def _device_object(obj: object, *, listed: bool) -> bool:
    """A function, class, dtype or constant of ``triton.language``, never a module.

    A name a module only imported (``wraps``, ``List``, ``jit`` in ``standard``)
    is not its API; ``__all__`` vouches for names defined elsewhere (``PropagateNan``).
    """
    # lazy: Triton is optional (kcert[triton]) and slow to import
    import triton.language as tl

    if isinstance(obj, types.ModuleType):
        return False
    if not (callable(obj) or isinstance(obj, tl.dtype | tl.constexpr) or _number(obj)):
        return False  # a TypeVar, a string, a module spec left by an import loop
    origin = getattr(obj, "__module__", None)
    return listed or isinstance(origin, str) and origin.startswith("triton.language")


def _number(obj: object) -> bool:
    return isinstance(obj, int | float) and not isinstance(obj, bool)


def _object_attributes() -> frozenset[str]:
    """Public members of Triton's tensor, type and constexpr classes and instances."""
    # lazy: Triton is optional (kcert[triton]) and slow to import
    import triton.language as tl

    dtype = tl.float32
    instances: list[object] = [
        dtype, tl.pointer_type(dtype), tl.block_type(dtype, [2]), tl.constexpr(1),
        tl.tensor(None, tl.block_type(dtype, [2])),
    ]  # fmt: skip
    optional = [getattr(tl, n, None) for n in ("tensor_descriptor", "PropagateNan")]
    classes = [type(i) for i in instances] + [tl.dtype, *(c for c in optional if c is not None)]
    members = {n for c in classes for n in dir(c)}
    members |= {n for i in instances for n in vars(i)}
    members |= {m for c in classes for m in _enum_members(c)}
    return frozenset(n for n in members if not n.startswith("_")) - INTERNAL_ATTRIBUTES


def _enum_members(cls: object) -> frozenset[str]:
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return frozenset(cls.__members__)
    return frozenset(getattr(cls, "__members__", {}))  # a pybind11 enum


# -- the checks ------------------------------------------------------------------------


def name_problem(node: ast.Name, aliases: Mapping[str, str]) -> str | None:
    """A bare name that is an import: no module as a value, nothing outside the API."""
    target = aliases.get(node.id)
    if target is None:
        return None
    if target in API_SUBMODULES:
        return f"the module {_alias(node.id, target)} used as a value (name its functions)"
    if not api_name(target):
        return f"a use of {_alias(node.id, target)} (not Triton device API)"
    return None


def chain_problem(
    node: ast.Attribute, aliases: Mapping[str, str], *, as_value: bool = True
) -> str | None:
    """Why an attribute chain is refused, checking each step from its root; None if allowed.

    Off a module alias (``tl``, ``libdevice``, ``math``), each step must be an API
    submodule or one of that module's device functions, classes or dtypes; off
    anything else (a local, a call, a constant), a member of Triton's tensor,
    dtype or constexpr. ``as_value``: the chain's value is used, so it may not be
    a module (``m = tl.extra``).
    """
    api = triton_api()
    names, base = chain(node)
    module: str | None = None
    if isinstance(base, ast.Name) and base.id in aliases:
        target = aliases[base.id]
        if target in api.names:
            module = target
        elif not api_name(target):
            return f"a use of {_alias(base.id, target)} (not Triton device API)"
    for depth, attr in enumerate(names, 1):
        if attr.startswith("_"):
            kind = "special" if dunder(attr) else "private"
            return f"a {kind} attribute access ({_prefix(node, depth)})"
        if module is not None and attr in api.submodules[module]:
            module = f"{module}.{attr}"
        elif module is not None:
            if attr not in api.names[module]:
                return (f"an attribute access ({_prefix(node, depth)}) outside the public "
                        f"Triton API ({module} has no device function, class or dtype "
                        f"named {attr})")  # fmt: skip
            module = None
        elif attr not in api.object_attributes:
            return (f"an attribute access ({_prefix(node, depth)}) outside the methods and "
                    "properties of Triton's tensor, dtype and constexpr")  # fmt: skip
    if module is not None and as_value:
        return f"the module {module} used as a value ({short(node)}; name its functions)"
    return None


def subscript_problem(node: ast.Subscript, aliases: Mapping[str, str]) -> str | None:
    """A subscript of a module or of a chain off one (``collections._sys.modules[...]``)."""
    value = node.value
    _, base = chain(value) if isinstance(value, ast.Attribute) else ([], value)
    if not (isinstance(base, ast.Name) and aliases.get(base.id) in API_SUBMODULES):
        return None
    if isinstance(value, ast.Attribute):
        problem = chain_problem(value, aliases, as_value=False)
        if problem is not None:
            return problem
    return f"a subscript of a module attribute ({short(node)})"


def children(node: ast.AST, aliases: Mapping[str, str]) -> Sequence[ast.AST]:
    """What to walk below ``node``: a chain off an import was checked whole, root included."""
    if isinstance(node, ast.Attribute):
        _, base = chain(node)
        return [] if isinstance(base, ast.Name) and base.id in aliases else [base]
    return list(ast.iter_child_nodes(node))


def api_name(target: str, *, submodule: bool = False) -> bool:
    """``triton.language.float32``: a device name of an API module (or, if asked, a submodule)."""
    api = triton_api()
    module, _, name = target.rpartition(".")
    known = name in api.names.get(module, ())
    return known or submodule and name in api.submodules.get(module, ())


def chain(node: ast.Attribute) -> tuple[list[str], ast.expr]:
    """``tl.extra.libdevice`` -> (["extra", "libdevice"], the Name tl)."""
    names: list[str] = []
    base: ast.expr = node
    while isinstance(base, ast.Attribute):
        names.append(base.attr)
        base = base.value
    return names[::-1], base


def short(node: ast.AST) -> str:
    """A construct as the user wrote it, on one line, calls shown as ``f(...)``."""
    if isinstance(node, ast.Call):
        return f"{short(node.func)}(...)"
    text = ast.unparse(node).splitlines()[0].rstrip(":")
    return text if len(text) <= 60 else text[:57] + "..."


def _prefix(node: ast.Attribute, depth: int) -> str:
    """The first ``depth`` steps of an attribute chain, as written."""
    names, _ = chain(node)
    for _ in range(len(names) - depth):
        assert isinstance(node.value, ast.Attribute)
        node = node.value
    return short(node)


def _alias(name: str, target: str) -> str:
    return name if name == target else f"{name} ({target})"


def dunder(name: str) -> bool:
    """``__class__``, ``__globals__``: names that reach Python's machinery."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__")

"""The jit-body allowlist is read from the installed Triton: API names, never its modules."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from kcert.certify.errors import CompilerUnavailable
from kcert.certify.jit_rules import API_SUBMODULES, triton_api
from kcert.certify.module_check import module_findings

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


def test_every_allowed_name_is_a_device_object_of_an_api_module() -> None:
    api = triton_api()
    assert api is triton_api()  # computed once
    assert "triton.language" in api.names and "math" in api.names
    for module, names in api.names.items():
        assert set(API_SUBMODULES) >= {module}
        loaded = importlib.import_module(module)
        for name in names:
            assert not name.startswith("_"), (module, name)
            assert not isinstance(getattr(loaded, name), types.ModuleType), (module, name)
        for sub in api.submodules[module]:
            assert isinstance(getattr(loaded, sub), types.ModuleType), (module, sub)


def test_the_public_triton_language_api_is_admitted_and_its_imports_are_not() -> None:
    api = triton_api()
    public = {n for n in tl.__all__ if not isinstance(getattr(tl, n), types.ModuleType)}
    assert public <= api.names["triton.language"]
    assert api.submodules["triton.language"] == {"math", "extra", "standard"}
    assert {"core", "random", "target_info"}.isdisjoint(api.names["triton.language"])
    assert api.names["triton.language.extra"] == frozenset()  # pkgutil, modules... left out
    assert {"wraps", "List", "T"}.isdisjoint(api.names["triton.language.math"])
    assert {"jit", "constexpr_function", "annotations"}.isdisjoint(
        api.names["triton.language.standard"]
    )
    assert {"exp", "tanh"} <= api.names["triton.language.extra.libdevice"]
    assert api.names["triton"] == {"cdiv", "next_power_of_2"} <= set(triton.__all__)
    assert {"pi", "sqrt"} <= api.names["math"]


def test_object_members_are_tensor_and_dtype_api_without_internals() -> None:
    members = triton_api().object_attributes
    assert {"to", "dtype", "shape", "numel", "element_ty", "primitive_bitwidth", "value"} <= members
    assert {"handle", "format", "modules", "fn", "run", "mro"}.isdisjoint(members)
    assert not any(name.startswith("_") for name in members)


def test_without_triton_the_check_is_an_environment_error_not_an_empty_allowlist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "triton.language", None)  # what a failed import leaves
    triton_api.cache_clear()
    try:
        with pytest.raises(CompilerUnavailable, match="install kcert\\[triton\\]"):
            module_findings(b"import triton\n\n\n@triton.jit\ndef k(x):\n    x.to(x)\n")
    finally:
        triton_api.cache_clear()


def test_jit_bodies_use_only_syntax_triton_compiles() -> None:
    """JIT_BODY_NODES names statements and expressions Triton's code generator visits."""
    import ast

    from triton.compiler.code_generator import CodeGenerator

    from kcert.certify.module_rules import JIT_BODY_NODES

    visited = {n.removeprefix("visit_") for n in dir(CodeGenerator) if n.startswith("visit_")}
    nodes = [n for n in JIT_BODY_NODES if issubclass(n, ast.stmt | ast.expr)]
    # FormattedValue lives inside JoinedStr, which the code generator visits whole
    assert {n.__name__ for n in nodes} - visited == {"FormattedValue"}
    assert ast.Match not in JIT_BODY_NODES and ast.Try not in JIT_BODY_NODES

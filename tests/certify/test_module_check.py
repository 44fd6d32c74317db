"""The module check: kernel modules are data; every other construct is refused with its line."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from kcert.certify.errors import ModuleCodeError
from kcert.certify.module_check import Finding, check_module, module_findings
from kcert.errors import KcertError

ROOT = Path(__file__).resolve().parents[2]
KERNEL_FOLDERS = (ROOT / "examples" / "triton", ROOT / "tests" / "assets" / "triton")

#: A kernel whose body is line 7, for snippets that belong inside a jit body.
KERNEL = """import triton
import triton.language as tl


@triton.jit
def k(x, n, BLOCK: tl.constexpr):
    {body}
"""


def kernel(body: str) -> str:
    return KERNEL.format(body=body)


def decorated(decorator: str) -> str:
    """A kernel under ``decorator``, which lands on line 5."""
    return (
        "import triton\nimport triton.language as tl\n\n\n"
        f"{decorator}\n@triton.jit\ndef k(x, n, B: tl.constexpr):\n    pass\n"
    )


def found(source: str | bytes) -> list[tuple[int, str]]:
    data = source.encode() if isinstance(source, str) else source
    return [(f.line, f.message) for f in module_findings(data)]


def kernel_sources() -> list[Path]:
    """Every kernel module the specs beside the examples and the assets name."""
    sources: set[Path] = set()
    for folder in KERNEL_FOLDERS:
        spec = tomllib.loads((folder / "kcert.toml").read_text())
        sources.update(folder / k["source"] for k in spec["kernel"] if k["source"].endswith(".py"))
    return sorted(sources)


@pytest.mark.parametrize("path", kernel_sources(), ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.triton
def test_real_kernel_modules_pass(path: Path) -> None:
    check_module(path.read_bytes(), path.name)


def test_every_python_file_beside_the_kernels_is_a_kernel_or_a_reference() -> None:
    """No kernel module escapes the test above; references are host code and are refused."""
    everything = {p for folder in KERNEL_FOLDERS for p in folder.glob("*.py")}
    references = {p for p in everything if p.name == "reference.py"}
    assert everything - references == set(kernel_sources())
    assert len(kernel_sources()) == 9
    for path in references:
        assert any("an import of numpy" in m for _, m in found(path.read_bytes()))


# (id, source, [(line, distinctive part of the message), ...] exactly as reported)
HOSTILE: list[tuple[str, str | bytes, list[tuple[int, str]]]] = [
    ("os.system", "import os\nimport triton\n\nos.system('id')\n",
     [(1, "an import of os "), (4, "a module-level call (os.system(...)) runs when")]),
    ("import ctypes", "import triton\nimport ctypes\n", [(2, "an import of ctypes ")]),
    ("from os import environ", "import triton\nfrom os import environ\n",
     [(2, "an import of os ")]),
    ("__import__ in jit", kernel("m = __import__('os')"),
     [(7, "a use of __import__ in @triton.jit k")]),
    ("getattr in jit", kernel("f = getattr(tl, 'x')"),
     [(7, "a use of getattr in @triton.jit k"),
      (7, "the module tl (triton.language) used as a value (name its functions)")]),
    ("pre_run_hook", kernel("pass") + "k.pre_run_hook = k\n",
     [(8, "an assignment to an attribute (k.pre_run_hook = ...)")]),
    ("class", "import triton\n\n\nclass Hook:\n    pass\n",
     [(4, "a class definition (class Hook)")]),
    ("if environ", "import os\nimport triton\n\nif os.environ.get('CI'):\n    X = 1\n",
     [(1, "an import of os "), (4, "an if statement at module level (if os.environ.get('CI'))")]),
    ("autotune pre_run_hook",
     decorated("@triton.autotune(configs=[triton.Config({'B': 32})], key=['n'], pre_run_hook=k)"),
     [(5, "triton.autotune(..., pre_run_hook=...) hands Triton Python to call")]),
    ("try", "import triton\n\ntry:\n    import triton.language as tl\nexcept ImportError:\n"
     "    tl = None\n", [(3, "a try statement at module level (try)")]),
    ("exec in jit", kernel("exec('x = 1')"), [(7, "a use of exec in @triton.jit k")]),
    ("len constant", "import triton\n\nX = len('a')\n",
     [(3, "a module constant bound to a call (len(...)) (not a literal)")]),
    ("relative import", "import triton\nfrom . import helpers\n",
     [(2, "a relative import (from . import ...)")]),
    ("syntax error", "import triton\n\ndef k(:\n    pass\n", [(3, "is not valid Python")]),
    ("non-UTF-8", b"import triton\nX = '\xff'\n", [(2, "byte 0xff is not UTF-8")]),
    ("dunder chain in jit", kernel("b = x.__class__.__bases__"),
     [(7, "a special attribute access (x.__class__) in @triton.jit k")]),
    ("open", "import triton\n\nopen('/etc/passwd')\n", [(3, "a module-level call (open(...))")]),
    ("heuristics print", decorated("@triton.heuristics({'B': lambda args: print(args)})"),
     [(5, "a call to print(...) inside a heuristics lambda")]),
    # beyond the list: other ways in
    ("utf-7 cookie", b"# coding: utf-7\nimport triton\n# +AAo-import os\n",
     [(1, "a coding declaration (utf-7)")]),
    ("module reached through triton", kernel("tl.core.builtins.eval('1')"),
     [(7, "an attribute access (tl.core) outside the public Triton API (triton.language has "
          "no device function, class or dtype named core)")]),
    ("format string", kernel("s = '{0.__globals__}'.format(k)"),
     [(7, "an attribute access ('{0.__globals__}'.format) outside the methods and properties "
          "of Triton's tensor, dtype and constexpr")]),
    ("typing in jit", "import typing\n" + kernel("h = typing.get_type_hints(k)"),
     [(8, "a use of typing (not Triton device API) in @triton.jit k")]),
    ("import in jit", kernel("import os"), [(7, "an import inside a function (import os)")]),
    ("lambda in jit", kernel("f = lambda: 0"), [(7, "a nested lambda")]),
    ("plain function", "import triton\n\n\ndef helper(x):\n    return x\n",
     [(4, "a function without @triton.jit innermost (def helper)")]),
    ("async function", "import triton\n\n\nasync def go():\n    pass\n",
     [(4, "an async function (async def go)")]),
    ("star import", "import triton\nfrom triton.language import *\n",
     [(2, "a star import (from triton.language import *)")]),
    ("triton host module", "from triton import runtime\n", [(1, "from triton import runtime")]),
    ("import triton.runtime", "import triton.runtime\n", [(1, "an import of triton.runtime ")]),
    ("builtins", "import builtins\n", [(1, "an import of builtins ")]),
    ("other decorator", "import functools\nimport triton\n\n\n@functools.cache\n@triton.jit\n"
     "def k(x):\n    pass\n",
     [(1, "an import of functools "), (5, "the decorator @functools.cache")]),
    ("jit repr hook", "import triton\n\n\n@triton.jit(repr=str)\ndef k(x):\n    pass\n",
     [(4, "triton.jit(..., repr=...) hands Triton Python")]),
    ("config pre_hook",
     decorated("@triton.autotune(configs=[triton.Config({'B': 32}, pre_hook=k)], key=['n'])"),
     [(5, "triton.Config(..., pre_hook=...) hands Triton Python")]),
    ("config list built by a call",
     decorated("@triton.autotune(configs=make_configs(), key=['n'])"),
     [(5, "triton.autotune configs as a call (make_configs(...))")]),
    ("default argument", "import triton\n\n\n@triton.jit\ndef k(x, n=len('ab')):\n    pass\n",
     [(5, "a default argument value of a call (len(...))")]),
    ("string annotation", "import triton\n\n\n@triton.jit\n"
     "def k(x: \"__import__('os').system('id')\"):\n    pass\n",
     [(5, "an annotation holding a call (__import__('os').system(...))")]),
    ("walrus", "import triton\n\nX = (Y := 3)\n", [(3, "an assignment expression (Y := 3)")]),
    ("module lambda", "import triton\n\nF = lambda: 0\n",
     [(3, "a module constant bound to a lambda")]),
    ("global", "import triton\n\nglobal X\n", [(3, "a global statement at module level")]),
    ("patch triton", "import triton\n\ntriton.language.zeros = 0\n",
     [(3, "an assignment to an attribute (triton.language.zeros = ...)")]),
    ("subscript target", "import triton\n\nTABLE = [1]\nTABLE[0] = 2\n",
     [(4, "an assignment to a subscript (TABLE[0] = ...)")]),
    ("rebind an import", "import triton\nimport triton.language as tl\n\ntl = 3\n",
     [(4, "'tl' is bound again")]),
    ("dunder module name", "import triton\n\n__getattr__ = 1\n",
     [(3, "binding a special name (__getattr__)")]),
    ("__builtins__ in jit", kernel("b = __builtins__"), [(7, "a use of __builtins__")]),
    # the red team's chains: Triton's submodules import standard ones
    ("pkgutil to posix_spawn", kernel(
        "tl.extra.pkgutil.zipimport._bootstrap_external._os.posix_spawn('/bin/sh', ['sh'], None)"),
     [(7, "an attribute access (tl.extra.pkgutil) outside the public Triton API "
          "(triton.language.extra has no device function, class or dtype named pkgutil)")]),
    ("operator.attrgetter", kernel("f = tl.core.typing.operator.attrgetter('x')"),
     [(7, "an attribute access (tl.core) outside the public Triton API")]),
    ("sys.modules", kernel("m = tl.core.typing.collections._sys.modules['os']"),
     [(7, "an attribute access (tl.core) outside the public Triton API")]),
    ("module through a local", kernel("m = tl.extra\n    m.pkgutil.zipimport"),
     [(7, "the module triton.language.extra used as a value (tl.extra; name its functions)"),
      (8, "an attribute access (m.pkgutil) outside the methods and properties of Triton's")]),
    ("private tensor attribute", kernel("h = x._handle"),
     [(7, "a private attribute access (x._handle) in @triton.jit k")]),
    ("tensor class", kernel("c = x.__class__"),
     [(7, "a special attribute access (x.__class__) in @triton.jit k")]),
    ("libdevice.os", "from triton.language.extra import libdevice\n" + kernel(
        "libdevice.os.system('id')"),
     [(8, "an attribute access (libdevice.os) outside the public Triton API "
          "(triton.language.extra.libdevice has no device function, class or dtype named os)")]),
    ("tl.math.sys", kernel("m = tl.math.sys.modules"),
     [(7, "an attribute access (tl.math.sys) outside the public Triton API "
          "(triton.language.math has no device function, class or dtype named sys)")]),
    # the same, by other roads
    ("subscript of a module", kernel("f = tl.extra.libdevice['exp']"),
     [(7, "a subscript of a module attribute (tl.extra.libdevice['exp'])")]),
    ("module as an argument", kernel("tl.device_print('m', tl.math)"),
     [(7, "the module triton.language.math used as a value (tl.math; name its functions)")]),
    ("module returned", "from triton.language.extra import libdevice\n" + kernel(
        "return libdevice"),
     [(8, "the module libdevice (triton.language.extra.libdevice) used as a value")]),
    ("imported host name", "from typing import get_type_hints\n" + kernel(
        "h = get_type_hints(k)"),
     [(8, "a use of get_type_hints (typing.get_type_hints) (not Triton device API)")]),
    ("host name of triton", kernel("c = triton.compile(k)"),
     [(7, "an attribute access (triton.compile) outside the public Triton API (triton has no")]),
    ("non-API submodule", kernel("r = tl.random.randint"),
     [(7, "an attribute access (tl.random) outside the public Triton API")]),
    ("store into triton's objects", kernel("tl.float32.FP_TYPES[0] = 'fp64'"),
     [(7, "an assignment to a subscript (tl.float32.FP_TYPES[0] = ...) in @triton.jit k")]),
    ("store to an attribute", kernel("x.dtype = tl.float16"),
     [(7, "an assignment to an attribute (x.dtype = ...) in @triton.jit k")]),
    ("from triton.language import core", "from triton.language import core\n",
     [(1, "from triton.language import core, which is not public Triton device API")]),
    ("import triton.language.core", "import triton.language.core as c\n",
     [(1, "an import of triton.language.core ")]),
    ("from extra import pkgutil", "from triton.language.extra import pkgutil\n",
     [(1, "from triton.language.extra import pkgutil, which is not public Triton device API")]),
    ("private attribute in heuristics", decorated("@triton.heuristics({'B': lambda a: a._x})"),
     [(5, "Attribute (a._x) inside a heuristics lambda")]),
    # the second red team: a match class pattern reads any attribute (print.__self__ is the
    # builtins module), behind a test that is true only under the interpreter
    ("match class pattern", kernel(
        "if isinstance(n, int):\n        match print:\n"
        "            case object(__self__=object(exec=ex)):\n                ex('1', {})"),
     [(7, "a use of isinstance in @triton.jit k"),
      (8, "a match statement, which Triton does not compile")]),
    ("interpreter-only branch", kernel("if callable(x):\n        pass"),
     [(7, "a use of callable in @triton.jit k")]),
    ("try statement", kernel("try:\n        pass\n    except Exception:\n        pass"),
     [(7, "a try statement, which Triton does not compile")]),
    ("starred call", kernel("tl.store(*(x, x))"),
     [(7, "Starred (*(x, x)), which Triton does not compile")]),
    ("annotation off a host module", "import triton\nimport triton.language as tl\n\n\n"
     "@triton.jit\ndef k(x: tl.core.typing.Any):\n    pass\n",
     [(6, "an annotation holding Attribute (tl.core.typing.Any) runs code")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "expected"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
@pytest.mark.triton
def test_hostile_construct_is_refused_at_its_line(
    source: str | bytes, expected: list[tuple[int, str]]
) -> None:
    findings = found(source)
    assert [line for line, _ in findings] == [line for line, _ in expected], findings
    for (_, message), (_, fragment) in zip(findings, expected, strict=True):
        assert fragment in message
        assert "; " in message  # what is there; what to do


@pytest.mark.triton
def test_a_chain_off_tl_may_name_only_public_triton_api() -> None:
    """The red team's road to the build child: ``tl.extra`` still holds its import loop's
    ``pkgutil``, and from there every module Python has loaded."""
    source = kernel(
        "tl.extra.pkgutil.zipimport._bootstrap_external._os.posix_spawn('sh', [], None)"
    )
    with pytest.raises(ModuleCodeError) as info:
        check_module(source.encode(), "kernels.py")
    assert info.value.diagnostics() == (
        "kernels.py:7: an attribute access (tl.extra.pkgutil) outside the public Triton API "
        "(triton.language.extra has no device function, class or dtype named pkgutil) in "
        "@triton.jit k runs as Python in the interpreter, or is called by the compiler; "
        "remove it, or certify with --allow-module-code (its module code then runs in the "
        "sandbox only)"
    )


@pytest.mark.triton
def test_every_finding_in_a_module_is_reported_one_per_line() -> None:
    source = (
        b'"""A library module, not a kernel module."""\n'  # 1
        b"import os\n"  # 2
        b"import triton\n"  # 3
        b"import triton.language as tl\n"  # 4
        b"\n"  # 5
        b"MODE = os.environ.get('MODE')\n"  # 6
        b"\n"  # 7
        b"\n"  # 8
        b"@triton.jit\n"  # 9
        b"def k(x, BLOCK: tl.constexpr):\n"  # 10
        b"    eval('1')\n"  # 11
        b"\n"  # 12
        b"\n"  # 13
        b"class Wrapper:\n"  # 14
        b"    pass\n"  # 15
        b"\n"  # 16
        b"\n"  # 17
        b"k.pre_run_hook = print\n"  # 18
    )
    with pytest.raises(ModuleCodeError) as info:
        check_module(source, "kernels.py")
    error = info.value
    assert isinstance(error, KcertError)
    assert error.kind == "module-code"
    assert [f.line for f in error.findings] == [2, 6, 11, 14, 18]
    lines = error.diagnostics().splitlines()
    assert len(lines) == 5
    assert all(re.fullmatch(r"kernels\.py:\d+: [^;]+; .+", line) for line in lines), lines
    assert lines[0].startswith("kernels.py:2: an import of os ")
    assert lines[1].startswith("kernels.py:6: a module constant bound to a call (os.environ.get")
    assert lines[2].startswith("kernels.py:11: a use of eval in @triton.jit k")
    assert lines[3].startswith("kernels.py:14: a class definition (class Wrapper)")
    assert lines[4].startswith("kernels.py:18: an assignment to an attribute (k.pre_run_hook")
    assert "--allow-module-code" in lines[3]
    assert str(error) == error.diagnostics()


def test_findings_are_small_frozen_records() -> None:
    (finding,) = module_findings(b"import triton\nimport ctypes\n")
    assert (finding.line, finding.col) == (2, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.line = 3  # type: ignore[misc]
    assert isinstance(finding, Finding)


def test_the_error_kind_is_its_own() -> None:
    owners = [
        path
        for path in (ROOT / "kcert").rglob("*.py")
        if re.search(r'kind = "module-code"', path.read_text())
    ]
    assert [p.relative_to(ROOT).as_posix() for p in owners] == ["kcert/certify/errors.py"]


ALLOWED = {
    "autotune with configs": decorated(
        "@triton.autotune(\n"
        "    configs=[triton.Config({'B': 32}, num_warps=4, num_stages=2),\n"
        "             triton.Config({'B': 64}, num_warps=8)],\n"
        "    key=['n'], reset_to_zero=['x'], warmup=5, rep=20,\n"
        ")"
    ),
    "autotune with positional configs from a constant comprehension": (
        "import triton\nfrom triton import Config, jit\n\n"
        "CONFIGS = [Config({'B': b}, num_warps=w) for b in (32, 64) for w in [4, 8]]\n\n\n"
        "@triton.autotune(CONFIGS, ['n'])\n@jit(do_not_specialize=['n'])\n"
        "def k(x, n, B):\n    pass\n"
    ),
    "heuristics with lambdas": decorated(
        "@triton.heuristics({\n"
        "    'B': lambda args: triton.next_power_of_2(min(args['n'], 1024)),\n"
        "    'EVEN': lambda args: args['n'] % args['B'] == 0,\n"
        "    'W': lambda a: max(int(a['n'] // 256), 1) if a['n'] > 0 else 1,\n"
        "})"
    ),
    "libdevice and other triton.language submodules": (
        "import triton\nimport triton.language\nimport triton.language as tl\n"
        "from triton.language.extra import libdevice\n"
        "import triton.language.math as tlmath\nimport math\nfrom typing import Any\n\n\n"
        "@triton.jit\ndef k(x, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    v = libdevice.exp(tl.load(x + offs, mask=offs < n))\n"
        "    tl.store(x + offs, tlmath.sqrt(v), mask=offs < n)\n"
    ),
    "constexpr constants and __all__": (
        '"""Kernels."""\n\nfrom __future__ import annotations\n\n'
        "import math\n\nimport triton\nimport triton.language as tl\n\n"
        "__all__ = ['k']\nBLOCK: tl.constexpr = 128\nWIDE = tl.constexpr(4 * BLOCK)\n"
        "SCALE = -1.5 / math.pi\nNAME = 'k'\nSHAPE = (BLOCK, 2 ** 4)\nDTYPE = tl.float16\n"
        "EPS: float = 1e-6\nLIMIT = None\nFLAGS = [True, False]\n\n\n"
        "@triton.jit\ndef k(x, n, B: tl.constexpr = BLOCK, D: 'tl.constexpr' = DTYPE):\n"
        "    for i in tl.static_range(4):\n        helper(x, i)\n"
        "    while n > 0:\n        n = n - 1\n    if n == 0:\n        tl.device_print('n', n)\n\n\n"
        "@triton.jit\ndef helper(x, i):\n    tl.store(x + i, tl.load(x + i) * WIDE)\n"
    ),
}


ALLOWED["the public Triton API, tensor methods and properties"] = (
    "import math\n\nimport triton\nimport triton.language as tl\n"
    "from triton.language.extra import libdevice\n"
    "from triton.language.extra.libdevice import tanh\n\nBLOCK = 128\n\n\n"
    "@triton.heuristics({'B': lambda args: triton.cdiv(args['n'], BLOCK)})\n@triton.jit\n"
    "def k(x, n, B: tl.constexpr):\n"
    "    offs = tl.arange(0, B)\n"
    "    acc = tl.load(x + offs, mask=offs < n).to(tl.float32)\n"
    "    rows = acc.shape[0]\n"
    "    for i in tl.static_range(4):\n"
    "        acc += tl.math.exp(acc) + libdevice.tanh(acc) + tanh(acc) * math.pi\n"
    "    acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)\n"
    "    W: tl.constexpr = triton.cdiv(B, 2)\n"
    "    bits = acc.dtype.primitive_bitwidth + tl.cdiv(n, W) + triton.language.program_id(0)\n"
    "    tl.store(x + offs, acc.to(x.dtype.element_ty), mask=offs < rows + bits)\n"
)


@pytest.mark.parametrize("source", ALLOWED.values(), ids=ALLOWED.keys())
@pytest.mark.triton
def test_allowed_forms_pass(source: str) -> None:
    assert found(source) == []


#: A kernel body may name its own locals as it likes (attorch calls one ``input``);
#: what it may not do is read the builtin, which a name no binding surely precedes is.
SHADOWING = [
    ("a local assigned first", "input = tl.load(x)\n    if n > 0:\n        input = -input\n"
     "    tl.store(x, input)", []),
    ("a parameter", None, []),
    ("a for target in its loop", "for len in range(n):\n        tl.store(x + len, len)", []),
    ("a tuple target", "a, type = n, n\n    tl.store(x, type)", []),
    ("the builtin on the right of its own binding", "input = input",
     [(7, "a use of input in @triton.jit k")]),
    ("the builtin before the binding", "a = input\n    input = 1",
     [(7, "a use of input in @triton.jit k")]),
    ("a binding in one branch only", "if n > 0:\n        input = 1\n    a = input",
     [(9, "a use of input in @triton.jit k")]),
    ("a for target after its loop", "for input in range(n):\n        pass\n    a = input",
     [(9, "a use of input in @triton.jit k")]),
    ("a for target in its own range", "for input in range(input):\n        pass",
     [(7, "a use of input in @triton.jit k")]),
    ("an augmented assignment reads first", "input += 1",
     [(7, "a use of input in @triton.jit k")]),
    ("a walrus binds nothing here", "a = (input := 1)\n    b = input",
     [(7, "a use of input in @triton.jit k"), (8, "a use of input in @triton.jit k")]),
    ("an annotation without a value", "input: tl.constexpr\n    a = input",
     [(7, "a use of input in @triton.jit k"), (8, "a use of input in @triton.jit k")]),
    ("a dunder stays refused even when bound", "__import__ = 1\n    a = __import__",
     [(7, "a use of __import__"), (8, "a use of __import__")]),
    ("a binding in the kernel leaves its helper alone", None,
     [(13, "a use of input in @triton.jit h")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "expected"), [c[1:] for c in SHADOWING], ids=[c[0] for c in SHADOWING]
)
@pytest.mark.triton
def test_a_local_shadows_a_banned_builtin_only_where_surely_bound(
    body: str | None, expected: list[tuple[int, str]]
) -> None:
    if body is not None:
        source = kernel(body)
    elif expected:
        source = kernel("input = 1\n    h(x)") + "\n\n@triton.jit\ndef h(x):\n    a = input\n"
    else:
        source = KERNEL.replace("def k(x,", "def k(input, len,").format(body="tl.store(input, len)")
    findings = found(source)
    assert [line for line, _ in findings] == [line for line, _ in expected], findings
    for (_, message), (_, fragment) in zip(findings, expected, strict=True):
        assert fragment in message

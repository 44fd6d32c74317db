"""The Triton interpreter's known differences: found in the source, named in the report.

The certification tests also pin the interpreter's behaviour: if a Triton
release makes the interpreter agree with the compiler, these kernels pass and
the tests say that the notes are out of date.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from kcert.certify.interpreter import static_hazards
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import CheckResult, Status, Verdict
from kcert.certify.spec import KernelSpec, load_spec

KERNELS = '''
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def masked_with_and(x, out, n, eps, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if pid >= 0 and n > 0:
        mask = (offs < n) and (offs >= 0)
        v = tl.load(x + offs, mask=offs < n, other=0.0)
        tl.store(out + offs, v + eps, mask=mask)


@triton.jit
def eps_as_tensor(x, out, n, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + eps.to(tl.float32), mask=mask)


@triton.jit
def with_libdevice(x, out, n, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, libdevice.tanh(tl.load(x + offs, mask=mask)) + eps, mask=mask)


@triton.jit
def bf16_arithmetic(x, out, n, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    tl.store(out + offs, v * v, mask=mask)


@triton.jit
def bf16_atomic(x, out, n, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.zeros([BLOCK], dtype=tl.bfloat16), mask=mask)
    tl.atomic_add(out + offs, tl.load(x + offs, mask=mask), mask=mask)
'''

REFERENCE = '''
import numpy as np


def add_eps(*, x, out, n, eps, BLOCK):
    return x + eps


def tanh_eps(*, x, out, n, eps, BLOCK):
    return np.tanh(x) + eps


def square(*, x, out, n, eps, BLOCK):
    return x * x


def copy(*, x, out, n, eps, BLOCK):
    return x
'''

SPEC = '''
[[kernel]]
name = "{entry}"
source = "kernels.py"
entry = "{entry}"
reference = "reference.py:{reference}"
grid = ["cdiv(n, BLOCK)"]
dims = {{ n = [40] }}
probes = {{ fresh = 0 }}
[kernel.args]
x = "in {dtype}[n]"
out = "out {dtype}[n]"
n = "i32 = n"
eps = "f32 = 0.5"
BLOCK = "const = 32"
[kernel.values]
x = "uniform(-2, 2)"
'''

CASES = {
    "masked_with_and": ("add_eps", "f32"), "eps_as_tensor": ("add_eps", "f32"),
    "with_libdevice": ("tanh_eps", "f32"), "bf16_arithmetic": ("square", "bf16"),
    "bf16_atomic": ("copy", "bf16"),
}  # fmt: skip


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KernelSpec]:
    folder: Path = tmp_path_factory.mktemp("interpreter")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE))
    (folder / "kcert.toml").write_text("".join(
        SPEC.format(entry=e, reference=r, dtype=d) for e, (r, d) in CASES.items()))
    return {k.name: k for k in load_spec(folder / "kcert.toml").kernels}


def hazards(kernel: KernelSpec) -> list[tuple[str, int]]:
    return [(h.kind, h.line) for h in static_hazards(kernel)]


def test_the_source_shows_each_difference(kernels: dict[str, KernelSpec]) -> None:
    # 'and' on scalars (line 11) means the same on both; on the mask (line 12) it does not
    assert hazards(kernels["masked_with_and"]) == [("bool-op", 12)]
    assert hazards(kernels["eps_as_tensor"]) == [("float-scalar", 21)]
    assert hazards(kernels["with_libdevice"]) == [("libdevice", 28)]
    # bfloat16 arithmetic is no longer a difference: the worker computes it as compiled
    assert hazards(kernels["bf16_arithmetic"]) == []


def test_a_float_const_is_not_a_float_scalar(tmp_path: Path,
                                             kernels: dict[str, KernelSpec]) -> None:  # fmt: skip
    import dataclasses

    from kcert.certify.spec import ConstArg, parse_expr

    kernel = kernels["eps_as_tensor"]
    args = tuple(ConstArg("eps", parse_expr("0.5"), "float") if a.name == "eps" else a
                 for a in kernel.args)  # fmt: skip
    assert static_hazards(dataclasses.replace(kernel, args=args)) == ()


def failed(kernel: KernelSpec) -> dict[str, CheckResult]:
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    report = certify(kernel, CertifyOptions(executor="triton-interpreter", fresh_seed=5,
                                            minimize=False))  # fmt: skip
    assert report.verdict is Verdict.FAIL
    return {c.name: c for c in report.checks if c.status is Status.FAIL}


def causes(check: CheckResult) -> list[Any]:
    assert "likely the Triton interpreter, not the kernel" in check.message
    return [c["cause"] for c in check.details["interpreter"]]


def test_and_on_a_mask_fails_the_build_on_the_interpreter(kernels: dict[str, KernelSpec]) -> None:
    checks = failed(kernels["masked_with_and"])
    # the mask is 'offs >= 0' alone under the interpreter, '&' compiled: the probes could
    # not show what a GPU runs, so the build fails before any probe runs
    assert set(checks) == {"build"} and "(line 12)" in checks["build"].message
    assert "'and' on a tensor: offs < n and offs >= 0" in checks["build"].message


def test_a_float_scalar_used_as_a_tensor_is_blamed_on_the_interpreter(
    kernels: dict[str, KernelSpec],
) -> None:
    checks = failed(kernels["eps_as_tensor"])
    assert set(checks) == {"launch"}
    assert "'float' object has no attribute 'to'" in checks["launch"].message
    assert causes(checks["launch"]) == ["float-scalar"]


def test_a_libdevice_stub_is_blamed_on_the_interpreter(kernels: dict[str, KernelSpec]) -> None:
    checks = failed(kernels["with_libdevice"])
    assert set(checks) == {"launch"} and causes(checks["launch"]) == ["libdevice"]


def test_bf16_arithmetic_passes_on_the_interpreter(kernels: dict[str, KernelSpec]) -> None:
    # the interpreter alone multiplies the raw bits (tests/certify/test_interpreter_numerics.py);
    # the worker computes v * v on the values, rounded once as the compiler rounds
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    report = certify(kernels["bf16_arithmetic"], CertifyOptions(
        executor="triton-interpreter", fresh_seed=5, minimize=False))  # fmt: skip
    assert report.verdict is Verdict.PASS, [c.message for c in report.checks]


def test_a_bf16_atomic_is_blamed_on_the_interpreter(kernels: dict[str, KernelSpec]) -> None:
    # the interpreter has no bfloat16 atomics (a GPU does): the launch fails, and says why
    checks = failed(kernels["bf16_atomic"])
    assert set(checks) == {"launch"} and "Unsupported data type" in checks["launch"].message
    assert causes(checks["launch"]) == ["atomic-dtype"]


def test_other_executors_are_left_alone(kernels: dict[str, KernelSpec]) -> None:
    from kcert.certify.interpreter import blame

    check = CheckResult("launch", Status.FAIL, "AttributeError: 'float' object has no attribute")
    assert blame([check], static_hazards(kernels["eps_as_tensor"]), "triton") == [check]


ASSETS = Path(__file__).resolve().parents[1] / "assets" / "interpreter" / "kcert.toml"


def test_and_on_tensors_fails_the_build_when_only_the_interpreter_ran() -> None:
    # right under the interpreter ('low and high' is high), wrong compiled (low & high)
    spec = load_spec(ASSETS)
    options = CertifyOptions(executor="triton-interpreter", fresh_seed=3, minimize=False,
                             timing=False)  # fmt: skip
    report = certify(spec.kernel("add_only_interpreted"), options)
    checks = {c.name: c for c in report.checks if c.status is Status.FAIL}
    assert set(checks) == {"build"}, {k: c.message for k, c in checks.items()}
    message = checks["build"].message
    assert "'and' on a tensor: low and high" in message and "(line 18)" in message
    assert "certified on the Triton interpreter only" in message and "write & or |" in message
    twin = certify(spec.kernel("add_either"), options)
    assert twin.verdict is Verdict.PASS, [c.message for c in twin.checks]

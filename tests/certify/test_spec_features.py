"""Spec features real kernels need, each certified with a small Triton kernel that needs it.

Float and string constexprs, a value domain over the dims, a scalar that names a
later argument, an unused pointer and a reference that answers in bfloat16.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.probes import fixed_probes, make_inputs
from kcert.certify.report import Status, Verdict
from kcert.certify.spec import KernelSpec, load_spec

pytest.importorskip("triton")
pytest.importorskip("torch")

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def rms_scale(x, out, n, EPS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    tl.store(out + offs, v / tl.sqrt(v * v + EPS), mask=mask)


@triton.jit
def activation(x, out, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    if ACT == "relu":
        v = tl.maximum(v, 0.0)
    tl.store(out + offs, v, mask=mask)


@triton.jit
def pick(x, target, out, m, n, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < m
    t = tl.load(target + rows, mask=mask, other=-1)
    valid = mask & (t >= 0)
    v = tl.load(x + rows * n + t, mask=valid, other=0.0)
    tl.store(out + rows, v, mask=mask)


@triton.jit
def blocked_copy(x, out, blocks, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (offs < blocks * BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=mask), mask=mask)


@triton.jit
def add_bias(x, bias, out, n, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask)
    if HAS_BIAS:
        v += tl.load(bias + offs, mask=mask)
    tl.store(out + offs, v * 2.0, mask=mask)


@triton.jit
def to_bf16(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask).to(tl.bfloat16), mask=mask)
'''

REFERENCE = '''
import ml_dtypes
import numpy as np


def rms_scale(*, x, out, n, EPS, BLOCK):
    assert isinstance(EPS, float)
    return x / np.sqrt(x * x + EPS)


def activation(*, x, out, n, ACT, BLOCK):
    assert ACT == "relu"
    return np.maximum(x, 0.0)


def pick(*, x, target, out, m, n, BLOCK):
    # raises IndexError for a class index outside [-1, n)
    assert target.min() >= -1
    got = x[np.arange(m), np.maximum(target, 0)]
    return np.where(target >= 0, got, 0.0)


def blocked_copy(*, x, out, blocks, n, BLOCK):
    assert blocks == -(-n // BLOCK)
    return x


def add_bias(*, x, bias, out, n, HAS_BIAS, BLOCK):
    assert bias is None
    return x * 2.0


def to_bf16(*, x, out, n, BLOCK):
    return x.astype(ml_dtypes.bfloat16)
'''

SPEC = '''
[[kernel]]
name = "rms_scale"
source = "kernels.py"
entry = "rms_scale"
reference = "reference.py:rms_scale"
grid = ["cdiv(n, BLOCK)"]
dims = { n = [1, 33, 100] }
probes = { fresh = 1 }
[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
EPS = "const float = 1e-5"
BLOCK = "const = 64"

[[kernel]]
name = "activation"
source = "kernels.py"
entry = "activation"
reference = "reference.py:activation"
grid = ["cdiv(n, BLOCK)"]
dims = { n = [1, 33, 100] }
probes = { fresh = 1 }
[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
ACT = 'const str = "relu"'
BLOCK = "const = 64"

[[kernel]]
name = "pick"
source = "kernels.py"
entry = "pick"
reference = "reference.py:pick"
grid = ["cdiv(m, BLOCK)"]
dims = { m = [1, 40], n = [1, 3, 17] }
probes = { fresh = 1 }
[kernel.args]
x = "in f32[m, n]"
target = "in i32[m]"
out = "out f32[m]"
m = "i32 = m"
n = "i32 = n"
BLOCK = "const = 32"
[kernel.values]
target = "uniform(-1, n)"

[[kernel]]
name = "blocked_copy"
source = "kernels.py"
entry = "blocked_copy"
reference = "reference.py:blocked_copy"
grid = ["blocks"]
dims = { n = [1, 33, 100] }
probes = { fresh = 1 }
[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
blocks = "i32 = cdiv(n, BLOCK)"
n = "i32 = n"
BLOCK = "const = 32"

[[kernel]]
name = "add_bias"
source = "kernels.py"
entry = "add_bias"
reference = "reference.py:add_bias"
grid = ["cdiv(n, BLOCK)"]
dims = { n = [1, 33, 100] }
probes = { fresh = 1 }
[kernel.args]
x = "in f32[n]"
bias = "none"
out = "out f32[n]"
n = "i32 = n"
HAS_BIAS = "const = 0"
BLOCK = "const = 64"

[[kernel]]
name = "to_bf16"
source = "kernels.py"
entry = "to_bf16"
reference = "reference.py:to_bf16"
grid = ["cdiv(n, BLOCK)"]
dims = { n = [1, 33, 100] }
probes = { fresh = 1 }
[kernel.args]
x = "in f32[n]"
out = "out bf16[n]"
n = "i32 = n"
BLOCK = "const = 64"
'''


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KernelSpec]:
    folder = tmp_path_factory.mktemp("features")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE))
    (folder / "kcert.toml").write_text(SPEC)
    return {k.name: k for k in load_spec(folder / "kcert.toml").kernels}


def certified(kernel: KernelSpec) -> None:
    report = certify(kernel, CertifyOptions(executor="triton-interpreter", fresh_seed=3))
    failed = [f"{c.name}: {c.message}" for c in report.checks if c.status is Status.FAIL]
    assert report.verdict is Verdict.PASS, failed


def test_a_float_constexpr(kernels: dict[str, KernelSpec]) -> None:
    assert kernels["rms_scale"].bind({"n": 33}).consts["EPS"] == 1e-5
    certified(kernels["rms_scale"])


def test_a_string_constexpr(kernels: dict[str, KernelSpec]) -> None:
    assert kernels["activation"].bind({"n": 33}).consts["ACT"] == "relu"
    certified(kernels["activation"])


def test_a_value_domain_over_the_dims(kernels: dict[str, KernelSpec]) -> None:
    kernel = kernels["pick"]
    for probe in fixed_probes(kernel).probes:
        target = make_inputs(kernel, probe)["target"]
        n = probe.dims["n"]
        assert target.min() >= -1 and target.max() < n
        if target.size >= 40:  # both ends of [-1, n) are drawn
            assert target.min() == -1 and target.max() == n - 1
    certified(kernel)


def test_a_scalar_that_names_a_later_const(kernels: dict[str, KernelSpec]) -> None:
    assert kernels["blocked_copy"].bind({"n": 100}).scalars["blocks"] == 4
    certified(kernels["blocked_copy"])


def test_an_unused_pointer(kernels: dict[str, KernelSpec]) -> None:
    certified(kernels["add_bias"])


def test_a_reference_that_answers_in_bfloat16(kernels: dict[str, KernelSpec]) -> None:
    from kcert.certify.reference import Reference

    kernel = kernels["to_bf16"]
    probe = fixed_probes(kernel).probes[-1]
    answer = Reference(kernel)(make_inputs(kernel, probe), probe.launch)
    assert answer["out"].dtype == np.float64
    certified(kernel)


def test_a_float_in_an_integer_const_is_named_as_the_cause(tmp_path: Path) -> None:
    """``const = 1e-6`` fails at every dim, so no launch is valid: the error says why."""
    from kcert.certify.errors import SpecError
    from kcert.certify.triton_build import const_sets

    (tmp_path / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (tmp_path / "reference.py").write_text(textwrap.dedent(REFERENCE))
    spec = SPEC.replace('EPS = "const float = 1e-5"', 'EPS = "const = 1e-5"')
    (tmp_path / "kcert.toml").write_text(spec)
    kernel = next(k for k in load_spec(tmp_path / "kcert.toml").kernels if k.name == "rms_scale")
    with pytest.raises(SpecError) as caught:
        const_sets(kernel)
    assert caught.value.key == "args.EPS"
    assert "no combination of dims gives a valid launch" in caught.value.message
    assert "'1e-5' must give an integer" in caught.value.message
    assert 'EPS = "const float = ..."' in caught.value.message
    with pytest.raises(SpecError) as bound:
        kernel.bind({"n": 33})
    assert bound.value.key == "args.EPS"

"""Minimization on the interpreter stays in the spec's domain and never loses a failure."""

from __future__ import annotations

import textwrap

import pytest

from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import Status, Verdict
from kcert.certify.spec import KernelSpec, load_spec

pytest.importorskip("triton")
pytest.importorskip("torch")

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def first_four(x, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < tl.minimum(n, 4)
    tl.store(out + offs, tl.load(x + offs, mask=mask), mask=mask)


@triton.jit
def first_32(x, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < tl.minimum(n, 32)
    tl.store(out + offs, tl.load(x + offs, mask=mask), mask=mask)
'''

REFERENCE = '''
def below_eight(*, x, out, n, BLOCK):
    if n < 8:
        raise IndexError(f"index 7 is out of bounds for axis 0 with size {n}")
    return x


def gap(*, x, out, n, BLOCK):
    if 8 < n < 33:
        raise IndexError(f"no answer at n={n}")
    return x
'''

SPEC = '''
[[kernel]]
name = "{name}"
source = "kernels.py"
entry = "{entry}"
reference = "reference.py:{reference}"
grid = ["1"]
dims = {{ n = [8, 33, 100] }}
probes = {{ fresh = 0 }}
[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
BLOCK = "const = 128"
'''


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KernelSpec]:
    folder = tmp_path_factory.mktemp("minimize")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE))
    (folder / "kcert.toml").write_text(
        SPEC.format(name="below", entry="first_four", reference="below_eight")
        + SPEC.format(name="gap", entry="first_32", reference="gap"))
    return {k.name: k for k in load_spec(folder / "kcert.toml").kernels}


def test_minimization_stops_at_the_smallest_listed_size(kernels: dict[str, KernelSpec]) -> None:
    # below n = 8 the reference raises; the failure at n = 8 is the answer, not exit 2
    report = certify(kernels["below"], CertifyOptions(executor="triton-interpreter",
                                                      fresh_seed=1))  # fmt: skip
    assert report.verdict is Verdict.FAIL
    coverage = next(c for c in report.checks if c.name == "coverage")
    assert coverage.status is Status.FAIL and coverage.probe == "n=8"
    assert report.minimized == {"coverage": {"n": 8}}
    assert report.minimize_stopped == {}


def test_a_reference_error_while_minimizing_keeps_the_failure_and_says_why(
    kernels: dict[str, KernelSpec],
) -> None:
    report = certify(kernels["gap"], CertifyOptions(executor="triton-interpreter",
                                                    fresh_seed=1))  # fmt: skip
    assert report.verdict is Verdict.FAIL
    assert report.minimized == {"coverage": {"n": 33}}
    reason = report.minimize_stopped["coverage"]
    assert "stopped at n=20" in reason and "IndexError: no answer at n=20" in reason
    assert report.predicate()["minimize_stopped"] == {"coverage": reason}

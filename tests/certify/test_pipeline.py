"""The whole pipeline on the Triton interpreter, with small kernels written here."""

from __future__ import annotations

import textwrap

import pytest

from kcert.certify.errors import ReferenceFailure
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import CHECK_NAMES, CertificationReport, Status, Verdict
from kcert.certify.spec import KernelSpec, load_spec

pytest.importorskip("triton")
pytest.importorskip("torch")

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def add_unmasked_store(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask, other=0.0) + tl.load(y + offs, mask=mask,
             other=0.0))


@triton.jit
def add_first_half(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < (n + 1) // 2
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def add_clobbers_x(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask)
    tl.store(out + offs, s, mask=mask)
    tl.store(x + offs, s, mask=mask)


@triton.jit
def add_off_by_1e3(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask)
    tl.store(out + offs, s * 1.001, mask=mask)


@triton.jit
def add_broken(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, undefined_name(x), mask=offs < n)


@triton.jit
def add_tuned(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask)
    tested = (n == 1) | (n == 300)
    tl.store(out + offs, tl.where(tested, s, s * 0.99), mask=mask)


@triton.jit
def add_hangs(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    i = n * 0
    while i < n:
        i = i * 1
    tl.store(out + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)
'''

REFERENCE = '''
import numpy as np


def add(*, x, y, out, n, BLOCK):
    return x + y


def explodes(*, x, y, out, n, BLOCK):
    raise ValueError("this reference is broken")
'''

SPEC_ENTRY = '''
[[kernel]]
name = "{name}"
source = "kernels.py"
entry = "{entry}"
reference = "reference.py:{reference}"
grid = ["cdiv(n, BLOCK)"]
dims = {{ n = [1, 33, 100, 300] }}
probes = {{ fresh = 2 }}

[kernel.args]
x = "in f32[n]"
y = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
BLOCK = "const = 64"
'''

ENTRIES = {
    "add": ("add", "add"), "unmasked": ("add_unmasked_store", "add"),
    "half": ("add_first_half", "add"), "clobber": ("add_clobbers_x", "add"),
    "offset": ("add_off_by_1e3", "add"), "broken": ("add_broken", "add"),
    "hangs": ("add_hangs", "add"),
    "bad_reference": ("add", "explodes"),
}  # fmt: skip


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KernelSpec]:
    folder = tmp_path_factory.mktemp("pipeline")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "reference.py").write_text(textwrap.dedent(REFERENCE))
    spec = "".join(SPEC_ENTRY.format(name=n, entry=e, reference=r)
                   for n, (e, r) in ENTRIES.items())  # fmt: skip
    # the fixed probes are capped to the two sizes the tuned kernel gets right
    tuned = SPEC_ENTRY.format(name="tuned", entry="add_tuned", reference="add")
    spec += tuned.replace("probes = { fresh = 2 }", "probes = { fresh = 4, max_probes = 2 }")
    (folder / "kcert.toml").write_text(spec)
    return {k.name: k for k in load_spec(folder / "kcert.toml").kernels}


def run(kernel: KernelSpec, **options: object) -> CertificationReport:
    return certify(kernel, CertifyOptions(executor="triton-interpreter", fresh_seed=7,
                                          deadline_s=60, **options))  # type: ignore[arg-type]


def status(report: CertificationReport) -> dict[str, Status]:
    return {c.name: c.status for c in report.checks}


def test_a_correct_kernel_passes_with_a_full_report(kernels: dict[str, KernelSpec]) -> None:
    report = run(kernels["add"])
    assert report.verdict is Verdict.PASS
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    assert status(report)["timing"] is Status.SKIP
    assert status(report)["sanitizer"] is Status.SKIP  # not asked for
    assert all(s is Status.PASS for n, s in status(report).items()
               if n not in ("timing", "sanitizer"))  # fmt: skip
    assert report.hw_class == "cpu" and report.executor == "triton-interpreter"
    assert report.fresh_seed == 7
    kinds = [p.kind for p in report.probes]
    # two drawn, and two on tile boundaries (n's cap, 600, holds two tiles of 256)
    assert kinds.count("fresh") == 2 + 2 and kinds.count("fixed") == 4
    probe = report.probes[0]
    assert probe.id == "n=1" and set(probe.inputs) == {"x", "y"}
    assert all(v.startswith("sha256:") for v in (*probe.inputs.values(), *probe.outputs.values()))
    # the kernel's output equals the correctly rounded reference here, anchor for anchor
    assert probe.outputs["out"] == probe.reference["out"]
    assert report.minimized == {}
    again = run(kernels["add"])
    assert [p.inputs for p in again.probes] == [p.inputs for p in report.probes]


@pytest.mark.parametrize(("name", "check", "smallest"), [
    # an unmasked tail store overruns whenever n is not a multiple of the block: n = 1 does
    ("unmasked", "bounds", 1),
    # writing only the first half leaves something unwritten from n = 2 on
    ("half", "coverage", 2),
    ("clobber", "input-integrity", 1),
    ("offset", "correctness", 1),
])  # fmt: skip
def test_each_bug_fails_its_own_check_and_is_minimized(
    kernels: dict[str, KernelSpec], name: str, check: str, smallest: int
) -> None:
    report = run(kernels[name])
    assert report.verdict is Verdict.FAIL
    failed = {n for n, s in status(report).items() if s is Status.FAIL}
    assert failed == {check}
    result = next(c for c in report.checks if c.name == check)
    assert result.probe is not None and result.probe in result.details["failed_probes"]
    assert status(report)["fresh-probes"] is Status.SKIP
    assert report.minimized == {check: {"n": smallest}}


def test_a_kernel_tuned_to_the_fixed_probes_fails_fresh_probes(
    kernels: dict[str, KernelSpec],
) -> None:
    report = run(kernels["tuned"])
    failed = {n for n, s in status(report).items() if s is Status.FAIL}
    assert failed == {"fresh-probes"}
    fresh = next(c for c in report.checks if c.name == "fresh-probes")
    assert fresh.message.startswith("correctness") and fresh.details["seed"] == 7
    assert fresh.probe is not None and fresh.probe.startswith("fresh")
    assert report.minimized == {"fresh-probes": {"n": 2}}


def test_a_kernel_that_does_not_build_fails_build(kernels: dict[str, KernelSpec]) -> None:
    report = run(kernels["broken"], minimize=False)
    assert report.verdict is Verdict.FAIL
    assert status(report)["build"] is Status.FAIL
    assert status(report)["launch"] is Status.SKIP


def test_a_hang_fails_launch_at_the_deadline(kernels: dict[str, KernelSpec]) -> None:
    report = certify(kernels["hangs"], CertifyOptions(executor="triton-interpreter",
                                                      fresh_seed=7, deadline_s=3))
    launch = next(c for c in report.checks if c.name == "launch")
    assert launch.status is Status.FAIL and launch.probe == "n=1"
    assert "timeout" in launch.message
    assert status(report)["correctness"] is Status.SKIP
    assert report.verdict is Verdict.FAIL


def test_a_failing_reference_is_a_diagnostic(kernels: dict[str, KernelSpec]) -> None:
    with pytest.raises(ReferenceFailure, match="this reference is broken"):
        run(kernels["bad_reference"])


def test_max_probes_caps_the_fixed_set(kernels: dict[str, KernelSpec]) -> None:
    report = run(kernels["add"], max_probes=2)
    assert [p.id for p in report.probes if p.kind == "fixed"] == ["n=1", "n=300"]
    correctness = next(c for c in report.checks if c.name == "correctness")
    assert correctness.details["uncovered_dim_values"] == {"n": [33, 100]}

"""Lint: real NVRTC builds held to [kernel.artifact] limits, each violation named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kcert.certify.lint import LintReport, lint
from kcert.certify.report import Status
from kcert.certify.spec import KernelSpec, load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

KERNEL = """
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    extern __shared__ float dyn[];
    __shared__ float fixed[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        dyn[threadIdx.x] = x[i];
        fixed[threadIdx.x % 64] = a;
        __syncthreads();
        y[i] = dyn[threadIdx.x] * fixed[threadIdx.x % 64];
    }
}
"""
ARGS = 'x = "in f32[n]"\ny = "out f32[n]"\na = "f32 = 2"\nn = "i32 = n"'


@pytest.fixture(autouse=True)
def kcert_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))


def make(folder: Path, *, artifact: str = "", args: str = ARGS, source: str = KERNEL,
         extra: str = "") -> KernelSpec:  # fmt: skip
    (folder / "k.cu").write_text(source)
    (folder / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (folder / "kcert.toml").write_text(
        '[[kernel]]\nname = "scale"\nsource = "k.cu"\nentry = "scale"\n'
        'reference = "ref.py:ref"\ngrid = ["cdiv(n, 128)"]\nblock = [128]\n'
        f'shared_mem = "128 * 4"\ndims = {{ n = [1, 1000] }}\n{extra}\n'
        f"[kernel.args]\n{args}\n\n[kernel.artifact]\n{artifact}\n"
    )
    return load_spec(folder / "kcert.toml").kernels[0]


def test_no_limits_passes_and_reports_resources(tmp_path: Path) -> None:
    report = lint(make(tmp_path), arch="sm_90")
    assert report.ok
    assert [c.name for c in report.checks] == ["build", "artifact"]
    assert all(c.status is Status.PASS for c in report.checks)
    assert report.resources is not None and report.resources.shared_bytes == 64 * 4
    assert report.check("artifact").details["dynamic_shared_bytes"] == 512
    assert "registers" in report.check("artifact").message


def test_too_tight_registers_fail_naming_figure_and_limit(tmp_path: Path) -> None:
    report = lint(make(tmp_path, artifact="max_registers = 2"), arch="sm_90")
    assert not report.ok
    check = report.check("artifact")
    assert check.status is Status.FAIL
    assert report.resources is not None
    assert f"registers {report.resources.registers} > max_registers = 2" in check.message


def test_shared_limit_counts_static_and_dynamic(tmp_path: Path) -> None:
    ok = lint(make(tmp_path, artifact="max_shared_bytes = 768"), arch="sm_90")
    assert ok.ok, ok.check("artifact").message
    tight = lint(make(tmp_path, artifact="max_shared_bytes = 767"), arch="sm_90")
    assert "shared memory 768 bytes > max_shared_bytes = 767" in tight.check("artifact").message


def test_required_and_forbidden_ptx(tmp_path: Path) -> None:
    kernel = make(tmp_path, artifact='required = ["bar.sync", "no.such.op"]\n'
                  'forbidden = ["ld.shared", "printf"]')  # fmt: skip
    message = lint(kernel, arch="sm_90").check("artifact").message
    assert "PTX lacks required 'no.such.op'" in message
    assert "PTX contains forbidden 'ld.shared'" in message
    assert "bar.sync" not in message and "printf" not in message


def test_spills_and_local_memory_limits(tmp_path: Path) -> None:
    heavy = (Path(__file__).parent / "test_build.py").read_text().split('HEAVY = """')[1]
    source = heavy.split('"""')[0]
    kernel = make(
        tmp_path, source=source.replace("heavy", "scale"),
        args='x = "in f32[n]"\ny = "out f32[n]"\nn = "i32 = n"',
        artifact="max_spills = 0\nmax_local_bytes = 0",
        extra='[kernel.build]\noptions = ["--maxrregcount=24"]',
    )  # fmt: skip
    report = lint(kernel, arch="sm_90")
    r = report.resources
    assert r is not None and r.spill_stores > 0
    message = report.check("artifact").message
    assert f"spills {r.spill_stores + r.spill_loads} bytes > max_spills = 0" in message
    assert f"local memory {r.local_bytes} bytes > max_local_bytes = 0" in message


def test_build_failure_fails_build_and_skips_artifact(tmp_path: Path) -> None:
    report = lint(make(tmp_path, source=KERNEL.replace("* fixed", "* missing")), arch="sm_90")
    assert not report.ok
    build, artifact = report.checks
    assert build.status is Status.FAIL and "missing" in build.details["log"]
    assert artifact.status is Status.SKIP
    assert report.resources is None and report.builds == ()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ('x = "in f32[n]"\ny = "out f32[n]"\nn = "i32 = n"', "takes 4 parameter(s)"),
        ('x = "in f32[n]"\ny = "out f32[n]"\na = "f64 = 2"\nn = "i32 = n"',
         "args.a is a f64 scalar (8 bytes) but parameter 2"),
        ('x = "in f32[n]"\ny = "out f32[n]"\na = "f32 = 2"\nn = "i64 = n"',
         "args.n is a i64 scalar (8 bytes)"),
        ('x = "f32 = 1"\ny = "out f32[n]"\na = "f32 = 2"\nn = "i32 = n"',
         "args.x is a f32 scalar (4 bytes) but parameter 0"),
    ],
)  # fmt: skip
def test_parameters_must_match_the_entry(tmp_path: Path, args: str, fragment: str) -> None:
    report = lint(make(tmp_path, args=args), arch="sm_90")
    assert report.check("build").status is Status.FAIL
    assert fragment in report.check("build").message


def test_report_json_is_one_serializable_object(tmp_path: Path) -> None:
    report = lint(make(tmp_path, artifact="max_registers = 2"), arch="sm_90")
    data = json.loads(json.dumps(report.to_json()))
    assert data["verdict"] == "fail"
    assert data["kernel"] == "scale" and data["arch"] == "sm_90"
    assert data["builds"][0]["cubin_digest"].startswith("sha256:")
    assert {c["name"] for c in data["checks"]} == {"build", "artifact"}


@pytest.mark.parametrize("language", ["cuda", pytest.param("triton", marks=pytest.mark.triton)])
def test_every_example_lints_clean(language: str) -> None:
    spec = load_spec(EXAMPLES / language / "kcert.toml")
    reports: list[LintReport] = [lint(k, arch="sm_90") for k in spec.kernels]
    for report in reports:
        assert report.ok, (report.kernel, [c.message for c in report.checks])
        r = report.resources
        assert r is not None and r.registers > 0 and r.spill_stores == r.spill_loads == 0


def test_examples_have_meaningful_limits() -> None:
    # Lint passing must mean something: every example sets register and spill limits.
    for language in ("cuda", "triton"):
        for kernel in load_spec(EXAMPLES / language / "kcert.toml").kernels:
            assert kernel.artifact.max_registers is not None
            assert kernel.artifact.max_spills == 0


@pytest.mark.triton
def test_triton_register_limit_is_enforced(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_bytes((EXAMPLES / "triton" / "saxpy.py").read_bytes())
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    (tmp_path / "kcert.toml").write_text(
        '[[kernel]]\nname = "saxpy"\nsource = "k.py"\nentry = "saxpy"\n'
        'reference = "ref.py:ref"\ngrid = ["cdiv(n, BLOCK)"]\ndims = { n = [1, 5000] }\n'
        "[kernel.args]\n"
        'x_ptr = "in f32[n]"\ny_ptr = "inout f32[n]"\na = "f32 = 1"\nn = "i32 = n"\n'
        'BLOCK = "const = min(1024, next_pow2(n))"\n'
        '[kernel.artifact]\nmax_registers = 8\nrequired = ["ld.global"]\n'
    )
    report = lint(load_spec(tmp_path / "kcert.toml").kernels[0], arch="sm_90")
    assert not report.ok
    assert len(report.builds) == 2  # one per distinct const assignment: BLOCK=1024 and 1
    message = report.check("artifact").message
    assert re.search(r"registers \d+ > max_registers = 8 \[BLOCK=1024\]", message), message
    assert re.search(r"registers \d+ > max_registers = 8 \[BLOCK=1\]", message), message
    assert "ld.global" not in message


def test_an_unused_pointer_is_a_pointer_parameter(tmp_path: Path) -> None:
    # x as "none": the entry's first parameter is 8 bytes, a pointer; a null one at launch
    none = lint(make(tmp_path, args=ARGS.replace('"in f32[n]"', '"none"')), arch="sm_90")
    assert none.check("build").status is Status.PASS, none.check("build").message
    scalar = lint(make(tmp_path, args=ARGS.replace('"in f32[n]"', '"i32 = 0"')), arch="sm_90")
    assert "args.x is a i32 scalar (4 bytes) but parameter 0" in scalar.check("build").message

"""``kcert certify`` in-process: exit codes, one JSON object on stdout, signing, no tracebacks."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from kcert.cli.app import app

pytest.importorskip("triton")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 3.0, mask=mask)


@triton.jit
def scale_tail(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n, other=0.0) * 3.0)
'''

SPEC = '''
[[kernel]]
name = "{name}"
source = "kernels.py"
entry = "{name}"
reference = "reference.py:scale"
grid = ["cdiv(n, BLOCK)"]
dims = {{ n = [1, 100, 200] }}
probes = {{ fresh = 1 }}

[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
BLOCK = "const = 64"
'''


@pytest.fixture(autouse=True)
def kcert_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certify_cmd")
    (folder / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (folder / "reference.py").write_text("def scale(*, x, out, n, BLOCK):\n    return x * 3.0\n")
    (folder / "kcert.toml").write_text(SPEC.format(name="scale") + SPEC.format(name="scale_tail"))
    return folder / "kcert.toml"


def run(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def one_json(result: Result) -> dict[str, Any]:
    value = json.loads(result.stdout)
    assert isinstance(value, dict)
    return value


def test_a_passing_kernel_signed_into_a_certificate(spec: Path, tmp_path: Path) -> None:
    key = tmp_path / "signing"
    assert run("keys", "generate", "--out", str(key)).exit_code == 0
    cert = tmp_path / "scale.cert.json"
    result = run("certify", str(spec), "--kernel", "scale", "--executor", "triton-interpreter",
                 "--key", str(key), "--out", str(cert), "--json")
    assert result.exit_code == 0, result.output
    summary = one_json(result)
    assert summary["kernel"] == "scale" and summary["verdict"] == "pass"
    assert summary["certificate"] == str(cert) and summary["certificate_id"].startswith("sha256:")
    assert summary["minimized"] == {}
    # probed on the interpreter only: what it cannot show is said, the verdict stands
    # and the magnitudes the inputs were drawn over
    assert [n["kind"] for n in summary["scope_notes"]] == ["executor", "values"]
    assert "races" in summary["scope_notes"][0]["message"]
    assert "magnitudes between these ends" in summary["scope_notes"][1]["message"]
    # the sizes certified: every dim's listed values, the drawn ones, and the extremes
    assert all({"listed", "drawn", "min", "max", "draw_up_to"} == set(scope)
               for scope in summary["shape_scope"].values()) and summary["shape_scope"]
    names = [c["name"] for c in summary["checks"]]
    assert "correctness" in names and "timing" in names
    assert all({"name", "status", "probe", "message"} <= set(c) for c in summary["checks"])
    assert cert.is_file()
    verified = run("verify", str(cert), "--key", f"{key}.pub", "--json")
    assert verified.exit_code == 0, verified.output


def test_a_failing_kernel_exits_1_with_the_probe_and_smallest_shape(spec: Path) -> None:
    source = spec.parent / "kernels.py"
    result = run("certify", str(source), "--kernel", "scale_tail", "--json")
    assert result.exit_code == 1, result.output
    summary = one_json(result)
    assert summary["verdict"] == "fail" and summary["certificate"] is None
    bounds = next(c for c in summary["checks"] if c["name"] == "bounds")
    assert bounds["status"] == "fail" and bounds["probe"] == "n=1"
    assert summary["minimized"]["bounds"] == {"n": 1}


def test_human_output_is_a_table_and_a_verdict(spec: Path) -> None:
    result = run("certify", str(spec), "--kernel", "scale", "--max-probes", "1")
    assert result.exit_code == 0, result.output
    assert "verdict: pass" in result.stdout
    assert "not covered (executor): probed on the Triton interpreter only" in result.stdout
    assert "sizes probed for " in result.stdout
    for name in ("correctness", "coverage", "bounds", "determinism", "fresh-probes"):
        assert name in result.stdout
    # without --key nothing is written, and it says so; stderr is no terminal here, so the
    # progress is one plain line per step
    assert "no certificate written: no --key given" in result.stderr
    assert not Path("scale.cert.json").exists()  # the default --out, in the working folder
    assert "certifying scale: fixed probe 1/1" in result.stderr


@pytest.mark.parametrize("args", [
    ("--executor", "opencl"),
    ("--out", "x.cert.json"),
    ("--hw", "H100"),
    ("--kernel", "nope"),
])  # fmt: skip
def test_bad_input_exits_2_with_one_json_error(spec: Path, args: tuple[str, ...]) -> None:
    result = run("certify", str(spec), "--kernel", "scale", *args, "--json")
    assert result.exit_code == 2, result.output
    assert set(one_json(result)) == {"error"}


def test_a_cuda_kernel_without_a_gpu_exits_2_and_points_to_lint() -> None:
    from kcert.certify.sandbox import gpu_visible

    if gpu_visible()[0]:
        pytest.skip("this machine has a GPU")
    result = run("certify", str(EXAMPLES / "cuda" / "saxpy.cu"))
    assert result.exit_code == 2
    assert "kcert lint" in result.stderr


def test_a_host_that_cannot_sandbox_exits_2_and_says_what_is_missing(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kcert.certify import jail

    monkeypatch.setattr(jail, "find_bwrap", lambda: None)
    jail.probe.cache_clear()
    try:
        result = run("certify", str(spec), "--kernel", "scale", "--executor",
                     "triton-interpreter", "--json")  # fmt: skip
    finally:
        jail.probe.cache_clear()
    assert result.exit_code == 2
    error = one_json(result)["error"]
    assert error["type"] == "sandbox-unavailable"
    assert "bwrap" in error["detail"] and "--no-sandbox" in error["detail"]


def test_no_sandbox_is_recorded_in_the_certificate(spec: Path, tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    assert run("keys", "generate", "--out", str(key)).exit_code == 0
    cert = tmp_path / "c.json"
    result = run("certify", str(spec), "--kernel", "scale", "--executor", "triton-interpreter",
                 "--key", str(key), "--out", str(cert), "--no-sandbox", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    import base64

    predicate = json.loads(base64.b64decode(json.loads(cert.read_text())["payload"]))["predicate"]
    confinement = predicate["certifier"]["confinement"]
    assert confinement["sandbox"] is False and "no-sandbox" in confinement["mechanism"]

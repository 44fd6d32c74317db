"""``kcert lint`` and ``kcert init`` in-process: exit codes, one JSON object, no tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kcert.certify.spec import PLACEHOLDER
from kcert.cli.app import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["saxpy", "row_sum", "softmax", "matmul", "layernorm", "row_max"]


@pytest.fixture(autouse=True)
def kcert_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))


def run(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def cuda_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "cuda"
    shutil.copytree(EXAMPLES / "cuda", folder)
    return folder


def test_lint_all_cuda_examples_table(cuda_copy: Path) -> None:
    result = run("lint", str(cuda_copy / "kcert.toml"))
    assert result.exit_code == 0, result.output
    for name in NAMES:
        assert name in result.stdout
    assert "registers" in result.stdout and "pass" in result.stdout


def test_lint_json_is_one_object(cuda_copy: Path) -> None:
    result = run("lint", str(cuda_copy / "kcert.toml"), "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["verdict"] == "pass" and data["arch"] == "sm_90"
    assert [k["kernel"] for k in data["kernels"]] == NAMES
    for kernel in data["kernels"]:
        assert kernel["resources"]["registers"] > 0
        assert kernel["resources"]["spill_stores"] == 0


def test_lint_a_folder(cuda_copy: Path) -> None:
    data = json.loads(run("lint", str(cuda_copy), "--json").stdout)
    assert [k["kernel"] for k in data["kernels"]] == NAMES
    assert run("lint", str(cuda_copy.parent)).exit_code == 2


def test_lint_one_kernel_by_name_or_source(cuda_copy: Path) -> None:
    by_name = json.loads(run("lint", str(cuda_copy / "kcert.toml"), "--kernel", "matmul",
                             "--json").stdout)  # fmt: skip
    by_source = json.loads(run("lint", str(cuda_copy / "matmul.cu"), "--json").stdout)
    assert [k["kernel"] for k in by_name["kernels"]] == ["matmul"]
    assert by_source["kernels"][0]["builds"] == by_name["kernels"][0]["builds"]


@pytest.mark.parametrize(
    ("flags", "arch"), [(["--hw", "A100"], "sm_80"), (["--arch", "sm_89"], "sm_89"), ([], "sm_90")]
)
def test_lint_arch_follows_hw(cuda_copy: Path, flags: list[str], arch: str) -> None:
    result = run("lint", str(cuda_copy / "saxpy.cu"), "--json", *flags)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["arch"] == arch
    assert data["kernels"][0]["builds"][0]["arch"] == arch


def test_too_tight_registers_exit_1(cuda_copy: Path) -> None:
    spec = cuda_copy / "kcert.toml"
    spec.write_text(spec.read_text().replace("max_registers = 64", "max_registers = 3", 1))
    result = run("lint", str(spec), "--kernel", "matmul")
    assert result.exit_code == 1
    assert "max_registers = 3" in result.stdout and "fail" in result.stdout
    as_json = run("lint", str(spec), "--kernel", "matmul", "--json")
    assert as_json.exit_code == 1
    data = json.loads(as_json.stdout)
    assert data["verdict"] == "fail"
    artifact = data["kernels"][0]["checks"][1]
    assert artifact["name"] == "artifact" and artifact["status"] == "fail"


def test_one_failing_kernel_fails_the_file(cuda_copy: Path) -> None:
    spec = cuda_copy / "kcert.toml"
    spec.write_text(spec.read_text().replace('required = ["fma.rn.f32"]', 'required = ["nope"]'))
    data = json.loads(run("lint", str(spec), "--json").stdout)
    assert data["verdict"] == "fail"
    assert [k["verdict"] for k in data["kernels"]] == ["fail"] + ["pass"] * 5


def test_compile_error_exits_1_with_the_log(cuda_copy: Path) -> None:
    source = cuda_copy / "saxpy.cu"
    source.write_text(source.read_text().replace("fmaf(a, x[i], y[i])", "fmaf(a, x[i], zz)"))
    result = run("lint", str(source))
    assert result.exit_code == 1
    assert "build failed" in result.stdout and "zz" in result.stdout


def test_broken_spec_exits_2_naming_the_key(cuda_copy: Path) -> None:
    spec = cuda_copy / "kcert.toml"
    spec.write_text(spec.read_text().replace('x = "in f32[n]"', 'x = "in f99[n]"', 1))
    result = run("lint", str(spec))
    assert result.exit_code == 2
    assert "key 'args.x'" in result.stderr and "kernel 'saxpy'" in result.stderr
    assert result.stdout == ""
    as_json = run("lint", str(spec), "--json")
    assert as_json.exit_code == 2
    error = json.loads(as_json.stdout)["error"]
    assert error["type"] == "bad-spec" and "args.x" in error["detail"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(["lint", "nope.toml"], "does not exist"), (["lint", "{spec}", "--hw", "TPU"], "H100"),
     (["lint", "{spec}", "--arch", "90"], "sm_XX"),
     (["lint", "{spec}", "--kernel", "nope"], "no kernel named 'nope'"),
     (["lint", "{folder}/reference.py"], "no [[kernel]] has source")],
)  # fmt: skip
def test_bad_input_exits_2(cuda_copy: Path, args: list[str], fragment: str) -> None:
    filled = [a.format(spec=cuda_copy / "kcert.toml", folder=cuda_copy) for a in args]
    result = run(*filled)
    assert result.exit_code == 2
    assert fragment in result.stderr


def test_init_then_fill_in_dims_then_lint(tmp_path: Path) -> None:
    folder = tmp_path / "new"
    folder.mkdir()
    shutil.copy(EXAMPLES / "cuda" / "saxpy.cu", folder)
    created = run("init", str(folder / "saxpy.cu"))
    assert created.exit_code == 0, created.stderr
    assert (folder / "kcert.toml").is_file() and (folder / "reference.py").is_file()
    refused = run("lint", str(folder / "saxpy.cu"))
    assert refused.exit_code == 2
    assert "dims.n" in refused.stderr and "fill in" in refused.stderr
    spec = folder / "kcert.toml"
    spec.write_text(spec.read_text().replace(f'n = "{PLACEHOLDER}"', "n = [1, 33, 1000]"))
    accepted = run("lint", str(folder / "saxpy.cu"), "--json")
    assert accepted.exit_code == 0, accepted.stdout
    assert json.loads(accepted.stdout)["kernels"][0]["verdict"] == "pass"
    again = run("init", str(folder / "saxpy.cu"))
    assert again.exit_code == 2 and "already has a [[kernel]] named 'saxpy'" in again.stderr


@pytest.mark.triton
def test_init_triton_then_lint(tmp_path: Path) -> None:
    folder = tmp_path / "tri"
    folder.mkdir()
    shutil.copy(EXAMPLES / "triton" / "saxpy.py", folder)
    assert run("init", str(folder / "saxpy.py")).exit_code == 0
    spec = folder / "kcert.toml"
    spec.write_text(spec.read_text().replace(f'n = "{PLACEHOLDER}"', "n = [1, 1000]"))
    result = run("lint", str(spec), "--json")
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["kernels"][0]["resources"]["registers"] > 0


def test_init_unknown_type_exits_2(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float4* v, int n) {}')
    result = run("init", str(tmp_path / "k.cu"))
    assert result.exit_code == 2
    assert "float4" in result.stderr
    assert not (tmp_path / "kcert.toml").exists()


@pytest.mark.triton
def test_lint_under_the_triton_interpreter(tmp_path: Path) -> None:
    # With TRITON_INTERPRET=1 in the environment, Triton's own helpers cannot be
    # compiled in-process; lint must still build the real PTX.
    env = {**os.environ, "TRITON_INTERPRET": "1", "KCERT_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-c", "from kcert.cli import main; main()", "lint",
         str(EXAMPLES / "triton" / "row_max.py"), "--json"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    kernel = json.loads(done.stdout)["kernels"][0]
    assert kernel["verdict"] == "pass" and kernel["resources"]["registers"] > 0

"""``kcert fingerprint`` in-process, on a machine with or without a GPU."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kcert.certify import environment as envmod
from kcert.certify.environment import fingerprint
from kcert.cli.app import app


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envmod, "gpu_status", lambda: (False, "no CUDA driver"))


def test_json_without_a_gpu_is_one_object_with_the_cpu_stack(no_gpu: None) -> None:
    result = CliRunner().invoke(app, ["fingerprint", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["hw_class"] == "cpu"
    assert data["gpu_found"] is False
    assert "no GPU found" in data["note"]
    assert data["environment"]["executor"] == "triton-interpreter"
    assert data["drift_fields"] == list(envmod.DEFAULT_CPU_DRIFT)
    # the printed fingerprint is the one anybody can recompute from the printed fields
    assert data["fingerprint"] == str(fingerprint(data["environment"], data["drift_fields"]))


def test_plain_output_says_no_gpu_was_found(no_gpu: None) -> None:
    result = CliRunner().invoke(app, ["fingerprint"])
    assert result.exit_code == 0, result.output
    assert "no GPU found" in result.stderr
    digest = str(envmod.cpu_environment().fingerprint())
    assert f"fingerprint: {digest}" in result.stdout
    assert "hardware class: cpu" in result.stdout


def test_a_gpu_executor_without_a_gpu_exits_2(no_gpu: None) -> None:
    result = CliRunner().invoke(app, ["fingerprint", "--executor", "cuda", "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "environment"
    assert "triton-interpreter" in error["detail"]


def test_an_unknown_executor_exits_2() -> None:
    result = CliRunner().invoke(app, ["fingerprint", "--executor", "opencl"])
    assert result.exit_code == 2
    assert "--executor must be one of" in result.stderr


def test_the_interpreter_stack_can_be_asked_for_on_any_machine() -> None:
    result = CliRunner().invoke(app, ["fingerprint", "--executor", "triton-interpreter",
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["hw_class"] == "cpu" and data["note"] is None


@pytest.mark.gpu
def test_on_a_gpu_the_fingerprint_is_the_gpus() -> None:
    result = CliRunner().invoke(app, ["fingerprint", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gpu_found"] is True
    env = data["environment"]
    assert env["device_kind"] == "gpu" and env["gpu_name"]
    assert data["drift_fields"] == list(envmod.DEFAULT_GPU_DRIFT)
    assert data["fingerprint"] == str(fingerprint(env))

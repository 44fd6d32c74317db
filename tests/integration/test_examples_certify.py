"""Every correct Triton example passes ``kcert certify`` on the CPU interpreter.

The second test strips the examples' ``[kernel.tolerance]`` and ``[kernel.values]``
tables, so the default tolerance model is held to real kernels on the default
inputs, large and tiny magnitudes included: it must raise no false alarm.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import Verdict
from kcert.certify.spec import load_spec
from kcert.cli.app import app

pytest.importorskip("triton")

TRITON = Path(__file__).resolve().parents[2] / "examples" / "triton"
NAMES = [k["name"] for k in tomllib.loads((TRITON / "kcert.toml").read_text())["kernel"]]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_triton_example_certifies(name: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["certify", str(TRITON / "kcert.toml"), "--kernel", name,
                                      "--executor", "triton-interpreter", "--json"])
    assert "Traceback" not in result.output
    summary = json.loads(result.stdout)
    failed = [c for c in summary["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and summary["verdict"] == "pass", failed


@pytest.mark.slow
def test_default_tolerances_pass_every_triton_example(tmp_path: Path) -> None:
    folder = tmp_path / "triton"
    shutil.copytree(TRITON, folder)
    spec = (folder / "kcert.toml").read_text()
    spec = re.sub(r"\[kernel\.(tolerance|values)\]\n[^\[]*", "", spec)
    assert "[kernel.tolerance]" not in spec
    (folder / "kcert.toml").write_text(spec)
    for kernel in load_spec(folder / "kcert.toml").kernels:
        report = certify(kernel, CertifyOptions(executor="triton-interpreter", max_probes=8,
                                                minimize=False))  # fmt: skip
        failed = [c for c in report.checks if c.status == "fail"]
        assert report.verdict is Verdict.PASS, (kernel.name, failed)

"""Every correct Triton example passes ``kcert certify`` on the CPU interpreter, and its
certificate verifies twice: with kcert and with an independent DSSE verifier.

That first test is where the predicate the certifier writes meets the schema, the
signature and securesystemslib; one certification of each example checks both (it
was run twice, once here and once more in tests/attest, for the same path).

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
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.signer import SSlibKey  # type: ignore[attr-defined]  # no __all__ there
from typer.testing import CliRunner

from kcert.attest.certificate import certificate_id, read_certificate, verify_envelope
from kcert.attest.keys import key_id, write_keypair
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import Verdict
from kcert.certify.spec import load_spec
from kcert.cli.app import app

pytest.importorskip("triton")

TRITON = Path(__file__).resolve().parents[2] / "examples" / "triton"
NAMES = [k["name"] for k in tomllib.loads((TRITON / "kcert.toml").read_text())["kernel"]]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_triton_example_certifies_signs_and_verifies(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signing_key: Ed25519PrivateKey,
) -> None:  # fmt: skip
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KCERT_KEY_PASSPHRASE", raising=False)
    key, cert = tmp_path / "k.key", tmp_path / f"{name}.cert.json"
    write_keypair(key, passphrase=None, private_key=signing_key)
    result = CliRunner().invoke(app, ["certify", str(TRITON / "kcert.toml"), "--kernel", name,
                                      "--executor", "triton-interpreter", "--json",
                                      "--key", str(key), "--out", str(cert)])  # fmt: skip
    assert "Traceback" not in result.output
    summary = json.loads(result.stdout)
    failed = [c for c in summary["checks"] if c["status"] == "fail"]
    assert result.exit_code == 0 and summary["verdict"] == "pass", failed

    public = signing_key.public_key()
    envelope = read_certificate(cert)
    verified = verify_envelope(envelope, {key_id(public): public})
    assert verified.id == certificate_id(envelope)
    assert (verified.kernel_name, verified.hw_class) == (name, "cpu")
    assert verified.executor == "triton-interpreter"
    assert verified.verdict is Verdict.PASS
    source = load_spec(TRITON / "kcert.toml").kernel(name).source.name
    assert [n for n, _ in verified.subjects][0] == source

    theirs = SslibEnvelope.from_dict(json.loads(cert.read_bytes()))
    sslib_key = SSlibKey.from_crypto(public, keyid=key_id(public), scheme="ed25519")
    assert list(theirs.verify([sslib_key], 1)) == [key_id(public)]
    assert json.loads(theirs.payload)["predicate"]["verdict"] == "pass"


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

"""``kcert keys generate``, ``kcert verify`` and ``kcert diff`` through the real Typer app."""

from __future__ import annotations

import base64
import importlib.util
import json
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

from kcert.attest import dsse
from kcert.attest.certificate import sign_report, write_certificate
from kcert.attest.keys import PASSPHRASE_ENV, load_private_key, write_keypair
from kcert.cli.app import app


def _load_factory() -> ModuleType:
    # The report factory lives with the attestation tests; tests/ is not a package.
    path = Path(__file__).parents[1] / "attest" / "attest_report_factory.py"
    spec = importlib.util.spec_from_file_location("attest_report_factory_for_cli", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


factory = _load_factory()
runner = CliRunner()


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    path = tmp_path / "signer"
    write_keypair(path, passphrase=None)
    return path


def _certificate(tmp_path: Path, key: Path, name: str, **report_args: Any) -> Path:
    path = tmp_path / name
    write_certificate(path, sign_report(factory.make_report(**report_args), load_private_key(key)))
    return path


def test_keys_generate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    out = tmp_path / "signer"
    result = runner.invoke(app, ["keys", "generate", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["encrypted"] is False
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert (tmp_path / "signer.pub").exists()
    assert len(document["keyid"]) == 64
    again = runner.invoke(app, ["keys", "generate", "--out", str(out)])
    assert again.exit_code == 2
    assert "already exists" in again.stderr and "--force" in again.stderr
    forced = runner.invoke(app, ["keys", "generate", "--out", str(out), "--force", "--json"])
    assert forced.exit_code == 0
    assert json.loads(forced.stdout)["keyid"] != document["keyid"]


def test_keys_generate_with_passphrase(tmp_path: Path) -> None:
    out = tmp_path / "signer"
    result = runner.invoke(app, ["keys", "generate", "--out", str(out)],
                           env={PASSPHRASE_ENV: "s3cret"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert b"ENCRYPTED" in out.read_bytes()
    load_private_key(out, passphrase=b"s3cret")


def test_verify_valid(tmp_path: Path, keys: Path) -> None:
    cert = _certificate(tmp_path, keys, "a.json")
    result = runner.invoke(app, ["verify", str(cert), "--key", f"{keys}.pub"])
    assert result.exit_code == 0, result.output
    assert "valid certificate sha256:" in result.stdout
    as_json = runner.invoke(app, ["verify", str(cert), "--key", f"{keys}.pub", "--json"])
    document = json.loads(as_json.stdout)
    assert (document["valid"], document["verdict"], document["kernel"]) == (True, "pass", "saxpy")


def test_verify_failed_verdict_is_valid_unless_pass_is_required(
    tmp_path: Path, keys: Path
) -> None:
    cert = _certificate(tmp_path, keys, "f.json", failing={"correctness": "off by one"})
    plain = runner.invoke(app, ["verify", str(cert), "--key", f"{keys}.pub"])
    assert plain.exit_code == 0
    assert "FAILED" in plain.stderr
    strict = runner.invoke(app, ["verify", str(cert), "--key", f"{keys}.pub", "--require-pass"])
    assert strict.exit_code == 1


def test_verify_invalid_exits_1_with_the_reason(tmp_path: Path, keys: Path) -> None:
    cert = _certificate(tmp_path, keys, "a.json")
    document = json.loads(cert.read_text())
    payload = bytearray(base64.b64decode(document["payload"]))
    payload[100] ^= 1
    document["payload"] = base64.b64encode(bytes(payload)).decode()
    cert.write_text(json.dumps(document))
    result = runner.invoke(app, ["verify", str(cert), "--key", f"{keys}.pub", "--json"])
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["valid"] is False and "bad signature" in out["reason"]


def test_verify_untrusted_key_exits_1(tmp_path: Path, keys: Path) -> None:
    cert = _certificate(tmp_path, keys, "a.json")
    other = tmp_path / "other"
    write_keypair(other, passphrase=None)
    result = runner.invoke(app, ["verify", str(cert), "--key", f"{other}.pub"])
    assert result.exit_code == 1
    assert "untrusted key" in result.stderr


def test_verify_not_a_kcert_statement_exits_1(tmp_path: Path, keys: Path) -> None:
    envelope = dsse.sign("application/vnd.in-toto+json", b'{"_type": "something else"}',
                         load_private_key(keys))  # fmt: skip
    cert = tmp_path / "other.json"
    cert.write_bytes(envelope.to_bytes())
    result = runner.invoke(app, ["verify", str(cert), "--key", f"{keys}.pub"])
    assert result.exit_code == 1
    assert "not an in-toto statement" in result.stderr


@pytest.mark.parametrize("content", [None, b"not json", b'{"payload": ""}'])
def test_verify_unreadable_exits_2(tmp_path: Path, keys: Path, content: bytes | None) -> None:
    cert = tmp_path / "cert.json"
    if content is not None:
        cert.write_bytes(content)
    result = runner.invoke(app, ["verify", str(cert), "--key", f"{keys}.pub", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["type"] == "bad-certificate"


def test_verify_bad_key_file_exits_2(tmp_path: Path, keys: Path) -> None:
    cert = _certificate(tmp_path, keys, "a.json")
    result = runner.invoke(app, ["verify", str(cert), "--key", str(keys)])
    assert result.exit_code == 2
    assert "is a private key" in result.stderr
    assert "PRIVATE KEY" not in result.output


def test_diff_json_and_fail_on_regression(tmp_path: Path, keys: Path) -> None:
    a = _certificate(tmp_path, keys, "a.json")
    same = _certificate(tmp_path, keys, "same.json")
    worse = _certificate(tmp_path, keys, "b.json",
                         resources=factory.make_resources(registers=64, spill_stores=4),
                         timing=factory.make_timing(kernel_ms=0.02))  # fmt: skip
    plain = runner.invoke(app, ["diff", str(a), str(worse)])
    assert plain.exit_code == 0, plain.output
    assert "registers" in plain.stdout and "regression" in plain.stdout
    result = runner.invoke(app, ["diff", str(a), str(worse), "--json", "--fail-on-regression"])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["regressed"] is True and document["signatures_checked"] is False
    assert {r["kind"] for r in document["regressions"]} == {"artifact", "timing"}
    ok = runner.invoke(app, ["diff", str(a), str(same), "--fail-on-regression",
                             "--key", f"{keys}.pub", "--json"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["signatures_checked"] is True
    lenient = runner.invoke(app, ["diff", str(a), str(worse), "--fail-on-regression",
                                  "--slowdown", "2", "--json"])  # fmt: skip
    assert {r["kind"] for r in json.loads(lenient.stdout)["regressions"]} == {"artifact"}


def test_diff_refuses_a_certificate_from_an_untrusted_key(tmp_path: Path, keys: Path) -> None:
    a = _certificate(tmp_path, keys, "a.json")
    other = tmp_path / "other"
    write_keypair(other, passphrase=None)
    b = _certificate(tmp_path, other, "b.json")
    result = runner.invoke(app, ["diff", str(a), str(b), "--key", f"{keys}.pub"])
    assert result.exit_code == 1
    assert "b.json: signed by untrusted key" in result.stderr


def test_diff_unreadable_exits_2(tmp_path: Path, keys: Path) -> None:
    a = _certificate(tmp_path, keys, "a.json")
    result = runner.invoke(app, ["diff", str(a), str(tmp_path / "absent.json")])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr

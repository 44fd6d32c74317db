"""Registry commands through the real Typer app: embedded (SQLite, PostgreSQL) and remote.

The remote case runs ``kcert.api`` under uvicorn on a free local port in a
thread, so the CLI's httpx client talks real HTTP to a real server.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from kcert.api.app import create_app
from kcert.attest.certificate import write_certificate
from kcert.attest.keys import generate_private_key, key_id, write_keypair
from kcert.cli.app import app
from kcert.registry.config import Settings
from kcert.registry.db import dispose_engines
from kcert.registry.testing import (
    MadeCertificate,
    gpu_environment,
    make_certificate,
    postgres_database,
    postgres_reachable,
)

runner = CliRunner()
ADMIN = "kcert_cli_admin_" + "y" * 24
ENV_VARS = ("KCERT_HOME", "KCERT_DATABASE_URL", "KCERT_REGISTRY", "KCERT_TOKEN",
            "KCERT_ADMIN_TOKEN")  # fmt: skip


@dataclass
class Setup:
    mode: str
    tmp: Path
    key: Ed25519PrivateKey

    def cert(self, **kwargs: Any) -> tuple[MadeCertificate, Path]:
        made = make_certificate(self.key, **kwargs)
        path = self.tmp / f"{made.id[7:19]}.cert.json"
        write_certificate(path, made.envelope)
        return made, path

    def environment(self, **overrides: Any) -> Path:
        path = self.tmp / f"env-{len(list(self.tmp.glob('env-*')))}.json"
        path.write_text(json.dumps(gpu_environment(**overrides)))
        return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(
    params=["embedded-sqlite", pytest.param("embedded-postgres", marks=pytest.mark.postgres),
            "remote-sqlite", pytest.param("remote-postgres", marks=pytest.mark.postgres)]
)  # fmt: skip
def setup(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Setup]:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    mode: str = request.param
    with _database(mode) as url:
        if url is not None:
            monkeypatch.setenv("KCERT_DATABASE_URL", url)
        if mode.startswith("remote"):
            with _server(tmp_path, url) as base:
                monkeypatch.setenv("KCERT_REGISTRY", base)
                monkeypatch.setenv("KCERT_TOKEN", ADMIN)
                yield Setup(mode, tmp_path, generate_private_key())
        else:
            yield Setup(mode, tmp_path, generate_private_key())
        dispose_engines()


class _database:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.context: Any = None

    def __enter__(self) -> str | None:
        if not self.mode.endswith("postgres"):
            return None
        reason = postgres_reachable()
        if reason is not None:
            pytest.skip(reason)
        self.context = postgres_database()
        url: str = self.context.__enter__()
        return url

    def __exit__(self, *exc: object) -> None:
        if self.context is not None:
            dispose_engines()
            self.context.__exit__(*exc)


class _server:
    def __init__(self, tmp: Path, url: str | None) -> None:
        settings = Settings(
            home=tmp / "server-home", database_url=url, admin_token=SecretStr(ADMIN)
        )
        self.port = free_port()
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="off")  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test registry server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def kcert(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def kcert_json(*args: str | Path, code: int = 0) -> dict[str, Any]:
    result = kcert(*args, "--json")
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    value: dict[str, Any] = json.loads(result.stdout)
    return value


def test_the_flow_through_the_cli(setup: Setup) -> None:
    cert, path = setup.cert()
    pub = setup.key.public_key().public_bytes_raw().hex()

    refused = kcert("push", path)
    assert refused.exit_code == 1, refused.stderr
    assert "untrusted" in refused.stderr or "no trusted keys" in refused.stderr

    trusted = kcert_json("keys", "trust", pub, "--name", "ci")
    assert trusted["keyid"] == key_id(setup.key.public_key())

    stored = kcert_json("push", path)
    assert stored["id"] == cert.id and stored["created"] is True
    assert kcert_json("push", path)["created"] is False

    target = kcert_json("target", "report", "prod", "--hw", "H100",
                        "--environment", setup.environment())  # fmt: skip
    assert target["created"] is True

    promoted = kcert_json("promote", "--kernel", cert.kernel, "--target", "prod")
    assert promoted["granted"] is True and promoted["certificate"] == cert.id

    gate = kcert_json("gate", "--kernel", cert.kernel, "--target", "prod")
    assert gate["allow"] is True and gate["certificate"] == cert.id
    assert kcert("gate", "--kernel", cert.kernel, "--target", "prod").exit_code == 0

    drift = kcert_json("target", "report", "prod", "--hw", "H100",
                       "--environment", setup.environment(nvrtc="13.2"))  # fmt: skip
    assert drift["stale_certificates"] == [cert.id]

    denied_gate = kcert_json("gate", "--kernel", cert.kernel, "--target", "prod", code=1)
    assert denied_gate["allow"] is False
    assert any("(stale)" in r for r in denied_gate["reasons"])

    denied = kcert_json("promote", "--kernel", cert.kernel, "--target", "prod", code=1)
    assert denied["granted"] is False and any("(stale)" in r for r in denied["reasons"])
    plain = kcert("promote", "--kernel", cert.kernel, "--target", "prod")
    assert plain.exit_code == 1 and "denied" in plain.stdout


def test_an_unsandboxed_certificate_is_stored_with_a_note_then_refused(setup: Setup) -> None:
    pub = setup.key.public_key().public_bytes_raw().hex()
    kcert_json("keys", "trust", pub, "--name", "ci")
    cert, path = setup.cert(sandbox=False)
    pushed = kcert("push", path)
    assert pushed.exit_code == 0, pushed.stderr
    assert "does not record that its kernel ran in the sandbox" in pushed.stderr
    assert kcert_json("push", path)["sandboxed"] is False
    kcert_json("target", "report", "prod", "--hw", "H100", "--environment", setup.environment())
    denied = kcert_json("promote", "--kernel", cert.kernel, "--target", "prod", code=1)
    assert denied["granted"] is False
    assert any("was made with --no-sandbox" in r for r in denied["reasons"]), denied["reasons"]
    gate = kcert_json("gate", "--kernel", cert.kernel, "--target", "prod", code=1)
    assert any("certify it again without --no-sandbox" in r for r in gate["reasons"])

    sandboxed, path = setup.cert(sandbox=True)
    pushed = kcert("push", path)
    assert pushed.exit_code == 0 and "sandbox" not in pushed.stderr
    kcert_json("promote", "--kernel", sandboxed.kernel, "--target", "prod")
    assert kcert_json("gate", "--kernel", sandboxed.kernel, "--target", "prod")["allow"] is True


def test_revocation_and_keys_through_the_cli(setup: Setup) -> None:
    key_file = setup.tmp / "signer"
    write_keypair(key_file, passphrase=None, private_key=setup.key)
    kcert_json("keys", "trust", f"{key_file}.pub", "--name", "ci")
    cert, path = setup.cert()
    kcert_json("push", path)
    kcert_json("target", "report", "prod", "--hw", "H100", "--environment", setup.environment())
    kcert_json("promote", "--kernel", cert.kernel, "--target", "prod")

    revoked = kcert_json("revoke", cert.id, "--reason", "wrong reference")
    assert revoked["revoke_reason"] == "wrong reference"
    assert kcert("gate", "--kernel", cert.kernel, "--target", "prod").exit_code == 1

    keyid = key_id(setup.key.public_key())
    assert kcert_json("keys", "revoke", keyid, "--reason", "rotated")["revoked_at"]
    other, other_path = setup.cert()
    refused = kcert("push", other_path)
    assert refused.exit_code == 1 and "revoked" in refused.stderr


def test_bad_input_is_exit_2_with_a_message(setup: Setup) -> None:
    bad_kernel = kcert("gate", "--kernel", "sha256:nope", "--target", "prod")
    assert bad_kernel.exit_code == 2 and "--kernel" in bad_kernel.stderr
    missing = kcert("push", setup.tmp / "missing.json")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    no_target = kcert("revoke", "sha256:" + "0" * 64, "--reason", "x", "--json")
    assert no_target.exit_code == 2
    assert json.loads(no_target.stdout)["error"]["type"] == "not-found"
    bad_env = setup.tmp / "bad.json"
    bad_env.write_text("[1, 2]")
    report = kcert("target", "report", "prod", "--hw", "H100", "--environment", bad_env)
    assert report.exit_code == 2 and "JSON object" in report.stderr
    drift = kcert("target", "report", "prod", "--hw", "H100", "--environment",
                  setup.environment(), "--drift-field", "not_a_field")  # fmt: skip
    assert drift.exit_code == 2 and "unknown drift field" in drift.stderr


def test_tokens_from_the_cli_work_against_the_api(setup: Setup) -> None:
    created = kcert_json("token", "create", "--scope", "gate:read", "--description", "deploys")
    assert created["token"].startswith("kcert_") and created["scopes"] == ["gate:read"]
    if not setup.mode.startswith("remote"):
        return
    import os

    os.environ["KCERT_TOKEN"] = created["token"]  # restored by the fixture's monkeypatch
    cert, _ = setup.cert()
    gate = kcert_json("gate", "--kernel", cert.kernel, "--target", "prod", code=1)
    assert gate["allow"] is False
    forbidden = kcert("token", "create", "--scope", "admin", "--json")
    assert forbidden.exit_code == 2
    assert json.loads(forbidden.stdout)["error"]["type"] == "forbidden"


def test_target_report_reads_this_machine_by_default(setup: Setup) -> None:
    reported = kcert_json("target", "report", "here", "--hw", "cpu")
    assert reported["environment"]["device_kind"] in ("cpu", "gpu")
    assert reported["fingerprint"].startswith("sha256:")


def test_kcert_serve_runs_the_api_with_the_admin_token(tmp_path: Path) -> None:
    """The real console script: migrate on start, serve /openapi.json, honour the token."""
    import os
    import shutil
    import subprocess

    import httpx

    exe = shutil.which("kcert")
    if exe is None:
        pytest.skip("the kcert console script is not on PATH")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCERT_")}
    env.update(KCERT_HOME=str(tmp_path / "served"), KCERT_ADMIN_TOKEN=ADMIN)
    proc = subprocess.Popen(
        [exe, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                spec = httpx.get(f"{base}/openapi.json", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        assert "/v1/gate" in spec.json()["paths"]
        assert httpx.get(f"{base}/v1/keys", timeout=5).status_code == 401
        keys = httpx.get(f"{base}/v1/keys", headers={"Authorization": f"Bearer {ADMIN}"})
        assert keys.status_code == 200 and keys.json() == []
        assert (tmp_path / "served" / "registry.db").is_file()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert ADMIN.encode() not in err  # the token never reaches the server's output

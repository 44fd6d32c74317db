"""Revoking API tokens: ``DELETE /v1/tokens/{id}`` and ``kcert token revoke``, embedded and remote.

A revoked token is refused by the next request on every route, the audit log
records the revocation by id in the same transaction, and the token itself is
never written anywhere.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine, select
from sqlmodel import col
from typer.testing import CliRunner

from kcert.api.app import create_app
from kcert.cli.app import app as cli
from kcert.registry.config import Settings
from kcert.registry.db import dispose_engines, read_session
from kcert.registry.log_models import LogEntry

ADMIN = "kcert_revoke_admin_" + "z" * 24
runner = CliRunner()


def leaves(engine: Engine, kind: str) -> list[bytes]:
    with read_session(engine) as session:
        rows = session.connection().execute(
            select(col(LogEntry.leaf)).where(col(LogEntry.kind) == kind)
        )
        return [bytes(r) for r in rows.scalars()]


def test_revoking_through_the_api_is_logged_by_id(
    client: TestClient, admin: dict[str, str], engine: Engine
) -> None:
    made = client.post("/v1/tokens", json={"scopes": ["gate:read"]}, headers=admin).json()
    assert made["id"].startswith("tok_") and made["revoked_at"] is None
    reader = {"Authorization": f"Bearer {made['token']}"}
    assert client.get("/v1/keys", headers=reader).status_code == 200

    revoked = client.delete(f"/v1/tokens/{made['id']}", headers=admin)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["id"] == made["id"] and revoked.json()["revoked_at"]
    assert "token" not in revoked.json()
    assert client.get("/v1/keys", headers=reader).status_code == 401

    logged = leaves(engine, "token.revoked")
    assert len(logged) == 1
    assert json.loads(logged[0])["payload"] == {"token_id": made["id"]}
    assert made["token"].encode() not in logged[0]
    # Revoking again changes nothing and logs nothing.
    again = client.delete(f"/v1/tokens/{made['id']}", headers=admin)
    assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]
    assert len(leaves(engine, "token.revoked")) == 1


def test_revoking_needs_admin_and_an_existing_token(
    client: TestClient, admin: dict[str, str]
) -> None:
    made = client.post("/v1/tokens", json={"scopes": ["gate:read", "promote"]},
                       headers=admin).json()  # fmt: skip
    own = {"Authorization": f"Bearer {made['token']}"}
    assert client.delete(f"/v1/tokens/{made['id']}", headers=own).status_code == 403
    missing = client.delete("/v1/tokens/tok_0000000000000000", headers=admin)
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")
    assert client.delete("/v1/tokens/not-a-token-id", headers=admin).status_code == 422


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(params=["embedded", "remote"])
def registry_env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    for name in ("KCERT_DATABASE_URL", "KCERT_REGISTRY", "KCERT_TOKEN", "KCERT_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    if request.param == "embedded":
        yield request.param
        dispose_engines()
        return
    settings = Settings(home=tmp_path / "home", admin_token=SecretStr(ADMIN))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    monkeypatch.setenv("KCERT_REGISTRY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("KCERT_TOKEN", ADMIN)
    try:
        yield request.param
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        dispose_engines()


def test_kcert_token_revoke(registry_env: str, tmp_path: Path) -> None:
    made = runner.invoke(cli, ["token", "create", "--scope", "gate:read", "--json"])
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)
    out = runner.invoke(cli, ["token", "revoke", created["id"], "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["revoked_at"] is not None
    if registry_env == "remote":
        import os

        url = os.environ["KCERT_REGISTRY"]
        refused = httpx.get(f"{url}/v1/keys", timeout=10,
                            headers={"Authorization": f"Bearer {created['token']}"})  # fmt: skip
        assert refused.status_code == 401
    bad = runner.invoke(cli, ["token", "revoke", "../keys"])
    assert bad.exit_code == 2 and "not a token id" in bad.output
    missing = runner.invoke(cli, ["token", "revoke", "tok_0000000000000000"])
    assert missing.exit_code != 0 and "no API token" in missing.output.replace("\n", " ")

"""The gate's database connections: replaced when the database drops them, and a database
that cannot be read is a 503 problem."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from test_gate_cache import promoted

from kcert.api.app import create_app
from kcert.registry.config import Settings
from kcert.registry.db import make_engine


def gate_backends(database_url: str) -> list[int]:
    """PIDs of the PostgreSQL connections to ``database_url``'s database (the app's pool)."""
    url = make_url(database_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            rows = conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = :d"),
                {"d": url.database},
            )  # fmt: skip
            return [int(r[0]) for r in rows]
    finally:
        admin.dispose()


def terminate(database_url: str, pids: list[int]) -> None:
    admin = create_engine(make_url(database_url).set(database="postgres"),
                          isolation_level="AUTOCOMMIT")  # fmt: skip
    try:
        with admin.connect() as conn:
            for pid in pids:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    finally:
        admin.dispose()


def wait_for(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def needs_postgres(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's connections are remote; SQLite's are in the process")


def test_connections_the_database_dropped_are_replaced_without_an_error(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey, database_url: str
) -> None:
    needs_postgres(database_url)
    _, promo = promoted(client, admin, signing_key)
    assert client.get("/v1/gate", params=promo, headers=admin).json()["allow"] is True
    pids = gate_backends(database_url)
    assert pids, "the gate read through pooled connections"
    terminate(database_url, pids)  # as a database restart or an idle timeout would
    assert wait_for(lambda: not set(pids) & set(gate_backends(database_url)))
    for _ in range(3):  # cached answer (version read) and computed answer alike
        response = client.get("/v1/gate", params=promo, headers=admin)
        assert response.status_code == 200, response.text
        assert response.json()["allow"] is True


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_database_the_gate_cannot_read_is_a_503_problem(
    backend: str, tmp_path: Path, admin: dict[str, str]
) -> None:
    if backend == "sqlite":
        broken = tmp_path / "registry.db"
        broken.write_bytes(b"not a database " * 1000)
        url = f"sqlite:///{broken}"
    else:
        url = "postgresql+psycopg://kcert@127.0.0.1:9/nowhere"  # nothing listens on port 9
    engine: Engine = make_engine(url)
    token = admin["Authorization"].removeprefix("Bearer ")
    settings = Settings(home=tmp_path / "home", database_url=url,
                        admin_token=SecretStr(token))  # fmt: skip
    app = create_app(settings, engine=engine, migrate_on_start=False)
    try:
        query = {"kernel": "sha256:" + "a" * 64, "target": "prod"}
        with TestClient(app) as client:
            response = client.get("/v1/gate", headers=admin, params=query)
    finally:
        engine.dispose()
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == 503 and "could not be read" in body["detail"]
    assert "Traceback" not in response.text

"""The registry's version is raised by the database itself: no write can leave the gate stale.

Every test first shows that the gate answered from its cache (so a missed
invalidation would pass a stale answer through), then writes to the database
without kcert's helpers (no audit leaf, no application code at all: plain SQL
from another process), and asks again.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, Table, inspect, text
from sqlalchemy.sql import visitors
from test_gate_cache import allowed_from_cache, gate_json, gatekeeper, promoted

from kcert.registry import decisions
from kcert.registry.audit import log_size
from kcert.registry.db import read_session
from kcert.registry.models import ApiToken

_NOW = "'2026-01-01 00:00:00'"


def write_elsewhere(database_url: str, *statements: str) -> None:
    """Run ``statements`` in one transaction of a process that never imports kcert."""
    script = (
        "import sys\n"
        "from sqlalchemy import create_engine, text\n"
        "engine = create_engine(sys.argv[1])\n"
        "with engine.begin() as conn:\n"
        "    for statement in sys.argv[2:]:\n"
        "        conn.execute(text(statement))\n"
        "assert 'kcert' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script, database_url, *statements], check=True,
                   timeout=60)  # fmt: skip


def leaves(engine: Engine) -> int:
    with read_session(engine) as session:
        return log_size(session)


@pytest.mark.parametrize(
    ("statements", "reason"),
    [
        ([f"UPDATE certificate SET revoked_at = {_NOW}"], "revoked"),
        ([f"UPDATE trusted_key SET revoked_at = {_NOW}"], "is revoked"),
        (["UPDATE target SET fingerprint = 'sha256:" + "0" * 64 + "'"], "(stale)"),
        (["UPDATE promotion SET status = 'suspended', suspend_reason = 'by hand'"], "suspended"),
        (["DELETE FROM promotion"], "not promoted"),
        (["DELETE FROM certificate_subject"], "no certificate"),
    ],
    ids=["certificate", "key", "target", "promotion-suspended", "promotion-deleted", "subject"],
)
def test_a_write_without_the_audit_helper_changes_the_next_answer(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    engine: Engine, database_url: str, statements: list[str], reason: str,
) -> None:  # fmt: skip
    _, promo = promoted(client, admin, signing_key)
    allowed_from_cache(app, client, promo, admin)
    before = leaves(engine)
    write_elsewhere(database_url, *statements)
    assert leaves(engine) == before, "the write must bypass the audit log to test anything"
    gate = gate_json(client, promo, admin)
    assert gate["allow"] is False, gate
    assert any(reason in r for r in gate["reasons"]), gate


def test_a_token_revoked_without_the_audit_helper_is_refused_next(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    database_url: str,
) -> None:  # fmt: skip
    _, promo = promoted(client, admin, signing_key)
    made = client.post("/v1/tokens", json={"scopes": ["gate:read"]}, headers=admin).json()
    reader = {"Authorization": f"Bearer {made['token']}"}
    allowed_from_cache(app, client, promo, reader)
    write_elsewhere(database_url, f"UPDATE api_token SET revoked_at = {_NOW}")
    refused = client.get("/v1/gate", params=promo, headers=reader)
    assert refused.status_code == 401, refused.text


def test_a_rolled_back_write_leaves_the_cache_valid(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    engine: Engine,
) -> None:  # fmt: skip
    """The version commits with the write, so an aborted write costs no cache entry."""
    _, promo = promoted(client, admin, signing_key)
    gate_json(client, promo, admin)
    with engine.connect() as conn:
        conn.execute(text(f"UPDATE certificate SET revoked_at = {_NOW}"))
        conn.rollback()
    hits = gatekeeper(app).hits
    assert gate_json(client, promo, admin)["allow"] is True
    assert gatekeeper(app).hits == hits + 1


def _tables(statement: object) -> set[str]:
    return {node.name for node in visitors.iterate(statement) if isinstance(node, Table)}  # type: ignore[arg-type]


def test_every_table_the_gate_reads_raises_the_version(engine: Engine) -> None:
    """A table read by the gate's query but without a trigger would let a cached answer go
    stale: the gate's own statements name the tables, the database names the triggers."""
    read = _tables(decisions._GATE_TARGET) | {ApiToken.__tablename__}
    for statement in decisions._CANDIDATES.values():
        read |= _tables(statement)
    assert {"target", "promotion", "certificate", "certificate_subject", "trusted_key"} <= read
    if engine.dialect.name == "sqlite":
        query = "SELECT tbl_name FROM sqlite_master WHERE type = 'trigger' AND sql LIKE :bump"
    else:
        query = (
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_proc p ON p.oid = t.tgfoid WHERE NOT t.tgisinternal AND p.prosrc LIKE :bump"
        )
    with engine.connect() as conn:
        triggered = set(conn.execute(text(query), {"bump": "%registry_version%"}).scalars())
    assert read <= triggered, f"no version trigger on {sorted(read - triggered)}"
    assert "registry_version" in inspect(engine).get_table_names()


@pytest.fixture
def second_app(app: FastAPI, database_url: str, tmp_path: object) -> Iterator[TestClient]:
    """Another server on the same database (its own engine and cache)."""
    from pathlib import Path

    from pydantic import SecretStr

    from kcert.api.app import create_app
    from kcert.registry.config import Settings
    from kcert.registry.db import make_engine

    settings = app.state.settings
    other_engine = make_engine(database_url)
    other = create_app(
        Settings(home=Path(str(tmp_path)) / "other", database_url=database_url,
                 admin_token=SecretStr(settings.admin_token.get_secret_value())),
        engine=other_engine, migrate_on_start=False,
    )  # fmt: skip
    try:
        with TestClient(other) as other_client:
            yield other_client
    finally:
        other_engine.dispose()


def test_writes_racing_gate_reads_never_leave_a_stale_answer(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    engine: Engine, second_app: TestClient,
) -> None:  # fmt: skip
    """A writer flips the target's fingerprint (no helper) while two servers answer the gate.

    After each write commits, both servers' next answer must follow it, whatever
    they cached while the write was in flight.
    """
    _, promo = promoted(client, admin, signing_key)
    with engine.connect() as conn:
        good = conn.execute(text("SELECT fingerprint FROM target WHERE name = 'prod'")).scalar()
    bad = "sha256:" + "f" * 64
    stop = threading.Event()
    errors: list[str] = []

    def hammer(who: TestClient) -> None:
        while not stop.is_set():
            response = who.get("/v1/gate", params=promo, headers=admin)
            if response.status_code != 200:
                errors.append(response.text)

    readers = [threading.Thread(target=hammer, args=(c,)) for c in (client, second_app)]
    for reader in readers:
        reader.start()
    try:
        for step in range(12):
            fingerprint = bad if step % 2 == 0 else good
            with engine.begin() as conn:
                conn.execute(text("UPDATE target SET fingerprint = :f WHERE name = 'prod'"),
                             {"f": fingerprint})  # fmt: skip
            for who in (client, second_app):
                assert gate_json(who, promo, admin)["allow"] is (fingerprint == good), step
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert not errors, errors[:3]
    assert gatekeeper(app).hits > 0, "the race never reached the cache"


"""No route keeps SQLite's write lock after its work is committed (issue 8's convoy).

On SQLite a write transaction holds the database lock from ``BEGIN IMMEDIATE``
on. A route that committed and then read its answer used to open another such
transaction and hold the lock until the session closed, after the response;
concurrent writers then queued on the lock, timed out (503) and exhausted the
pool (500). These tests fail if a write session's reads after its commit take
the write lock again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlmodel import Session

from kcert.api.app import create_app
from kcert.attest.keys import generate_private_key, public_key_hex
from kcert.digest import Digest
from kcert.registry import certificates, decisions, keys, targets, tokens
from kcert.registry.config import Settings
from kcert.registry.db import make_engine, write_session
from kcert.registry.models import ApiTokenCreate, Scope, TargetCreate, TrustedKeyCreate
from kcert.registry.testing import SqliteTemplate, gpu_environment, make_certificate

ADMIN = "kcert_test_admin_" + "w" * 24
THREADS = 50
REPORTS = 3


@pytest.fixture
def sqlite_engine(sqlite_template: SqliteTemplate, tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(sqlite_template.fresh(tmp_path))
    yield engine
    engine.dispose()


def write_lock_is_free(engine: Engine) -> bool:
    """Whether another connection can take the write lock right now, without waiting."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("PRAGMA busy_timeout=0")
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except Exception as exc:  # sqlite3.OperationalError: database is locked
            assert "locked" in str(exc)
            return False
        cursor.execute("ROLLBACK")
        return True
    finally:
        cursor.execute("PRAGMA busy_timeout=30000")
        raw.close()


def test_concurrent_target_reports_through_the_api_all_succeed(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    """The reproduction of issue 8: many threads re-reporting targets with changing drivers."""
    settings = Settings(home=tmp_path / "home", database_url=str(sqlite_engine.url),
                        admin_token=SecretStr(ADMIN))  # fmt: skip
    app = create_app(settings, engine=sqlite_engine)
    headers = {"Authorization": f"Bearer {ADMIN}"}

    def reports(i: int, client: TestClient) -> list[int]:
        codes = []
        for round_ in range(REPORTS):
            env = gpu_environment(driver_version=f"{570 + round_}.{i}")
            body = {"hw_class": "H100", "environment": env}
            codes.append(client.put(f"/v1/targets/t{i}", json=body, headers=headers).status_code)
        return codes

    # One client, one event loop and one thread pool shared by every request, as in uvicorn.
    with TestClient(app) as client, ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(reports, i, client) for i in range(THREADS)]
        codes = [code for f in futures for code in f.result(timeout=120)]
    assert sorted(set(codes)) == [200, 201], codes
    assert codes.count(201) == THREADS


def _store(session: Session, key: Ed25519PrivateKey) -> Any:
    return certificates.store_certificate(session=session, envelope=make_certificate(key).envelope)


@pytest.mark.parametrize(
    "operation",
    ["trust key", "store certificate", "report target (new)", "report target (drift)",
     "promote", "revoke certificate", "revoke key", "create token", "revoke token"],
)  # fmt: skip
def test_a_write_session_frees_the_lock_at_commit(
    sqlite_engine: Engine, signing_key: Ed25519PrivateKey, operation: str
) -> None:
    """Each write operation, then reading its answer in the same session: the lock is free."""
    pub = public_key_hex(signing_key.public_key())
    other = public_key_hex(generate_private_key().public_key())
    env = gpu_environment()
    setup: dict[str, Any] = {}
    with write_session(sqlite_engine) as session:
        keys.trust_key(session=session, key=TrustedKeyCreate(name="ci", public_key=pub))
    if operation not in ("trust key", "store certificate"):
        with write_session(sqlite_engine) as session:
            setup["cert"] = _store(session, signing_key)
        with write_session(sqlite_engine) as session:
            report = TargetCreate(hw_class="H100", environment=env)
            targets.report_target(session=session, name="prod", report=report)
        with write_session(sqlite_engine) as session:
            setup["token"] = tokens.create_token(
                session=session, request=ApiTokenCreate(scopes=[Scope.GATE_READ])
            )
    kernel = Digest.parse(setup["cert"].source_digest if "cert" in setup else "sha256:" + "0" * 64)
    actions: dict[str, Callable[[Session], Any]] = {
        "trust key": lambda s: keys.trust_key(
            session=s, key=TrustedKeyCreate(name="another", public_key=other)
        ),
        "store certificate": lambda s: _store(s, signing_key),
        "report target (new)": lambda s: targets.report_target(
            session=s, name="new", report=TargetCreate(hw_class="H100", environment=env)
        ),
        "report target (drift)": lambda s: targets.report_target(
            session=s,
            name="prod",
            report=TargetCreate(
                hw_class="H100", environment=gpu_environment(driver_version="999.1")
            ),
        ),  # fmt: skip
        "promote": lambda s: decisions.promote(session=s, kernel=kernel, target="prod"),
        "revoke certificate": lambda s: certificates.revoke_certificate(
            session=s, certificate=setup["cert"].id, reason="test"
        ),
        "revoke key": lambda s: keys.revoke_key(
            session=s, keyid=setup["cert"].keyid, reason="test"
        ),  # fmt: skip
        "create token": lambda s: tokens.create_token(
            session=s, request=ApiTokenCreate(scopes=[Scope.GATE_READ])
        ),
        "revoke token": lambda s: tokens.revoke_token(session=s, token_id=setup["token"].id),
    }
    with write_session(sqlite_engine) as session:
        answer = actions[operation](session)
        assert answer is not None
        # The session is still open, as a route's is until after its response.
        assert write_lock_is_free(sqlite_engine), f"{operation} kept the write lock after commit"

"""The registry guards its own log: a restored (rolled-back) or forked database is refused.

The attack (issue: "the log trusts whoever holds the database"): revoke a
certificate, then restore the database from a copy taken before the
revocation. Without the guard the registry signs the rolled-back tree, the
revocation is gone and the gate allows again. With it, the registry refuses to
sign (503 ``log-inconsistent``), ``/v1/log/health`` says so, the gate denies and
writes stop. SQLite is restored from a file copy and the server restarted;
PostgreSQL loses its newest rows while the server runs.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from kcert.api.app import create_app
from kcert.attest.keys import public_key_hex
from kcert.digest import Digest
from kcert.log.leaf import build_leaf
from kcert.registry import audit, checkpoints
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.db import make_engine, write_session
from kcert.registry.testing import gpu_environment, make_certificate

ADMIN_TOKEN = "kcert_test_admin_" + "g" * 24
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
INCONSISTENT = "https://kcert.dev/problems/log-inconsistent"


def _app(home: Path, engine: Engine, interval: float = 0) -> FastAPI:
    settings = Settings(
        home=home, database_url=str(engine.url.render_as_string(hide_password=False)),
        admin_token=SecretStr(ADMIN_TOKEN), checkpoint_interval=interval,
    )  # fmt: skip
    return create_app(settings, engine=engine)


def _assert_inconsistent(response: Any, word: str) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["type"] == INCONSISTENT
    assert word in body["detail"] and "Traceback" not in response.text


def _promoted(client: TestClient, key: Ed25519PrivateKey) -> dict[str, str]:
    cert = make_certificate(key)
    pub = public_key_hex(key.public_key())
    assert client.post("/v1/keys", json={"name": "ci", "public_key": pub},
                       headers=ADMIN).status_code == 201  # fmt: skip
    assert client.post("/v1/certificates", json=cert.envelope.to_json(),
                       headers=ADMIN).status_code == 201  # fmt: skip
    body = {"hw_class": "H100", "environment": gpu_environment()}
    assert client.put("/v1/targets/prod", json=body, headers=ADMIN).status_code == 201
    promo = {"kernel": cert.kernel, "target": "prod"}
    assert client.post("/v1/promotions", json=promo, headers=ADMIN).status_code == 201
    assert client.get("/v1/gate", params=promo, headers=ADMIN).json()["allow"] is True
    return {"id": cert.id, **promo}


def _revoke(client: TestClient, cert: dict[str, str]) -> None:
    revoked = client.post(
        f"/v1/certificates/{cert['id']}/revoke", json={"reason": "bad tail mask"}, headers=ADMIN
    )
    assert revoked.status_code == 200, revoked.text
    gate = client.get("/v1/gate", params={"kernel": cert["kernel"], "target": "prod"},
                      headers=ADMIN)  # fmt: skip
    assert gate.json()["allow"] is False
    assert client.get("/v1/log/checkpoint").status_code == 200  # signs the revocation's tree


def _size(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT size FROM log_state")).scalar_one())


def _delete_newest(engine: Engine, keep: int) -> None:
    """What a restore does to the log's rows: the entries from ``keep`` on are gone."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM log_entry WHERE leaf_index >= :k"), {"k": keep})
        # A node covers [position << level, (position + 1) << level).
        conn.execute(
            text("DELETE FROM log_node WHERE (position + 1) * (1 << level) > :k"), {"k": keep}
        )
        conn.execute(text("UPDATE log_state SET size = :k"), {"k": keep})
        conn.execute(text("UPDATE certificate SET revoked_at = NULL, revoke_reason = NULL"))


def _assert_fails_closed(client: TestClient, cert: dict[str, str], word: str) -> None:
    _assert_inconsistent(client.get("/v1/log/checkpoint"), word)
    _assert_inconsistent(client.get("/v1/log/health"), word)
    gate = client.get("/v1/gate", params={"kernel": cert["kernel"], "target": "prod"},
                      headers=ADMIN)  # fmt: skip
    assert gate.status_code == 200
    assert gate.json()["allow"] is False, "the revocation is gone but the gate must not allow"
    assert any("log-inconsistent" in r for r in gate.json()["reasons"])
    # Writes stop too: a promotion on the rolled-back state is not granted.
    again = client.post("/v1/promotions", json={"kernel": cert["kernel"], "target": "prod"},
                        headers=ADMIN)  # fmt: skip
    _assert_inconsistent(again, word)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_health_is_ok_and_the_checkpoint_file_follows_the_log(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    with TestClient(_app(home, engine)) as client:
        assert client.get("/v1/log/health").json()["status"] == "ok"
        _promoted(client, signing_key)
        note = client.get("/v1/log/checkpoint").text
        assert (home / "log-checkpoint").read_text(encoding="utf-8") == note
        assert client.get("/v1/log/health").json() == {
            "status": "ok", "log_size": _size(engine), "checkpoint_size": _size(engine),
        }  # fmt: skip


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_sqlite_restored_from_a_copy_is_refused(
    database_url: str, home: Path, tmp_path: Path, signing_key: Ed25519PrivateKey
) -> None:
    path = Path(make_url(database_url).database or "")
    engine = make_engine(database_url)
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        assert client.get("/v1/log/checkpoint").status_code == 200
        backup = tmp_path / "backup.db"
        live, copy = sqlite3.connect(path), sqlite3.connect(backup)
        try:
            live.backup(copy)  # the operator's nightly copy, before the revocation
        finally:
            live.close()
            copy.close()
        _revoke(client, cert)
    engine.dispose()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, path)  # the restore, and the server starts again
    restored = make_engine(database_url)
    try:
        with TestClient(_app(home, restored)) as client:
            _assert_fails_closed(client, cert, "rollback")
        # The embedded registry's gate (the CLI without a server) fails closed the same way.
        settings = Settings(home=home, database_url=database_url)
        embedded = EmbeddedRegistry(settings, engine=restored)
        answer = embedded.gate(Digest.parse(cert["kernel"]), "prod")
        assert answer.allow is False and "log-inconsistent" in answer.reasons[0]
        assert "rollback" in answer.reasons[0]
    finally:
        restored.dispose()


@pytest.mark.parametrize("database_url", [pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)  # fmt: skip
def test_postgres_losing_its_newest_rows_is_refused_while_serving(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        keep = _size(engine)
        assert client.get("/v1/log/checkpoint").status_code == 200
        _revoke(client, cert)
        _delete_newest(engine, keep)
        # The gate is asked first: it notices from the log's size alone.
        _assert_fails_closed(client, cert, "rollback")
    with TestClient(_app(home, engine)) as client:  # and after a restart
        _assert_fails_closed(client, cert, "rollback")


def test_a_second_tree_of_the_same_size_is_refused(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        keep = _size(engine)
        _revoke(client, cert)
        signed = _size(engine)
        _delete_newest(engine, keep)
        with write_session(engine) as session:  # other leaves, up to the same size
            audit.record_events(
                session, [("key.trusted", {"keyid": f"other{i}"}) for i in range(signed - keep)]
            )
            session.commit()
        assert _size(engine) == signed
        _assert_fails_closed(client, cert, "fork")


def test_a_longer_tree_that_does_not_extend_it_is_refused(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        keep = _size(engine)
        _revoke(client, cert)
        signed = _size(engine)
        _delete_newest(engine, keep)
        with write_session(engine) as session:
            audit.record_events(
                session, [("key.trusted", {"keyid": f"x{i}"}) for i in range(signed - keep + 3)]
            )
            session.commit()
        _assert_fails_closed(client, cert, "does not extend")


def test_a_forged_checkpoint_file_is_refused_and_the_genuine_one_heals(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        genuine = client.get("/v1/log/checkpoint").text
        # Whoever can write the file but not read the key cannot lower the bar.
        forged = genuine.replace(f"\n{_size(engine)}\n", "\n1\n", 1)
        assert forged != genuine
        (home / "log-checkpoint").write_text(forged, encoding="utf-8")
        _assert_fails_closed(client, cert, "not a checkpoint signed by this log's key")
        (home / "log-checkpoint").write_text(genuine, encoding="utf-8")
        assert client.get("/v1/log/health").json()["status"] == "ok"
        params = {"kernel": cert["kernel"], "target": "prod"}
        assert client.get("/v1/gate", params=params, headers=ADMIN).json()["allow"] is True
        assert client.post("/v1/promotions", json=params, headers=ADMIN).status_code == 201


def _wait_for(what: str, condition: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.05)


def test_the_server_checkpoints_every_change_and_finds_a_fork_unasked(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    """Nobody requests a checkpoint here: the server's publisher signs and checks on its own."""
    checkpoint = home / "log-checkpoint"

    def signed_size() -> int:
        text_ = checkpoint.read_text(encoding="utf-8") if checkpoint.exists() else "\n0\n"
        return int(text_.split("\n")[1])

    with TestClient(_app(home, engine, interval=0.05)) as client:
        cert = _promoted(client, signing_key)
        keep = _size(engine)
        _wait_for("the promotion's checkpoint", lambda: signed_size() == keep)
        revoked = client.post(f"/v1/certificates/{cert['id']}/revoke", json={"reason": "bad"},
                              headers=ADMIN)  # fmt: skip
        assert revoked.status_code == 200
        signed = _size(engine)
        _wait_for("the revocation's checkpoint", lambda: signed_size() == signed)
        _delete_newest(engine, keep)
        with write_session(engine) as session:  # same size, another tree
            audit.record_events(
                session, [("key.trusted", {"keyid": f"f{i}"}) for i in range(signed - keep)]
            )
            session.commit()
        params = {"kernel": cert["kernel"], "target": "prod"}

        def denied_for_the_log() -> bool:
            answer = client.get("/v1/gate", params=params, headers=ADMIN).json()
            return answer["allow"] is False and any(
                "log-inconsistent" in r and "fork" in r for r in answer["reasons"]
            )

        _wait_for("the gate to fail closed", denied_for_the_log)
        assert signed_size() == signed  # the forked tree was never signed


def _rewind_to_revocation(engine: Engine) -> None:
    """Delete the revocation's leaf and all after it; the promotion is active again."""
    with engine.connect() as conn:
        index = conn.execute(text(
            "SELECT leaf_index FROM log_entry WHERE kind = 'certificate.revoked'"
        )).scalar_one()  # fmt: skip
    _delete_newest(engine, int(index))
    with engine.begin() as conn:
        conn.execute(text("UPDATE promotion SET status = 'active', suspended_at = NULL, "
                          "suspend_reason = NULL"))  # fmt: skip


def test_the_gate_never_allows_from_a_fork_padded_past_the_signed_size(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    """Before anyone asks for a checkpoint: the gate proves a larger tree before it allows."""
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        _revoke(client, cert)
        signed = _size(engine)
        _rewind_to_revocation(engine)
        for _ in range(4):  # ordinary writes pad the forked tree past the signed size
            assert client.post("/v1/tokens", json={"scopes": ["gate:read"]},
                               headers=ADMIN).status_code == 201  # fmt: skip
        assert _size(engine) > signed
        gate = client.get("/v1/gate", params={"kernel": cert["kernel"], "target": "prod"},
                          headers=ADMIN).json()  # fmt: skip
        assert gate["allow"] is False, "a revoked certificate allowed from an unproved fork"
        assert "log-inconsistent" in gate["reasons"][0] and "does not extend" in gate["reasons"][0]
        _assert_inconsistent(client.get("/v1/log/health"), "does not extend")


def test_every_worker_of_a_home_follows_the_newest_checkpoint(
    engine: Engine, database_url: str, home: Path, signing_key: Ed25519PrivateKey
) -> None:
    """Worker B started before worker A signed the revocation's tree: B denies the rollback too."""
    other = make_engine(database_url)
    try:
        with TestClient(_app(home, engine)) as a, TestClient(_app(home, other)) as b:
            cert = _promoted(a, signing_key)
            params = {"kernel": cert["kernel"], "target": "prod"}
            assert b.get("/v1/gate", params=params, headers=ADMIN).json()["allow"] is True
            _revoke(a, cert)  # worker A signs the revocation's tree
            _rewind_to_revocation(engine)
            for worker in (a, b):
                gate = worker.get("/v1/gate", params=params, headers=ADMIN).json()
                assert gate["allow"] is False
                assert "rollback" in gate["reasons"][0], gate["reasons"]
    finally:
        other.dispose()


def _rewrite_revocation_leaves(engine: Engine) -> None:
    """Only ``log_entry`` (never ``log_node``): the revocation's leaves become token leaves."""
    with engine.begin() as conn:
        rows = conn.execute(text("SELECT leaf_index, kind FROM log_entry")).all()
        for index, kind in rows:
            if kind in ("certificate.revoked", "promotion.suspended"):
                payload = {"token_id": f"tok{index}", "scopes": ["gate:read"], "expires_at": None}
                fake = build_leaf(index=index, kind="token.created", payload=payload,
                                  time=datetime.now(UTC))  # fmt: skip
                conn.execute(text("UPDATE log_entry SET kind = 'token.created', leaf = :l "
                                  "WHERE leaf_index = :i"), {"l": fake, "i": index})  # fmt: skip
        conn.execute(text("UPDATE certificate SET revoked_at = NULL, revoke_reason = NULL"))
        conn.execute(text("UPDATE promotion SET status = 'active', suspended_at = NULL, "
                          "suspend_reason = NULL"))  # fmt: skip


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed-then-restart"])
def test_leaves_rewritten_without_their_nodes_are_refused(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey, signed: bool
) -> None:
    """The guard hashes the entries it signs: the stored nodes alone do not vouch for them."""
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        assert client.get("/v1/log/checkpoint").status_code == 200
        revoked = client.post(f"/v1/certificates/{cert['id']}/revoke",
                              json={"reason": "bad tail mask"}, headers=ADMIN)  # fmt: skip
        assert revoked.status_code == 200
        if signed:  # the revocation's tree signed (and hashed) by this process
            assert client.get("/v1/log/checkpoint").status_code == 200
        _rewrite_revocation_leaves(engine)
        if not signed:
            _assert_fails_closed(client, cert, "do not hash")
    if signed:  # a process started afterwards hashes every entry once
        with TestClient(_app(home, engine)) as client:
            _assert_fails_closed(client, cert, "do not hash")


def test_a_running_process_hashes_every_entry_again(
    engine: Engine, home: Path, signing_key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries rewritten below the signed size after this process hashed them: found at the
    next full hash (every ``FULL_REHASH_S``), without a restart."""
    with TestClient(_app(home, engine)) as client:
        cert = _promoted(client, signing_key)
        _revoke(client, cert)  # signed and hashed by this process
        _rewrite_revocation_leaves(engine)
        assert client.get("/v1/log/checkpoint").status_code == 200  # not due yet
        monkeypatch.setattr(checkpoints, "FULL_REHASH_S", 0.0)
        _assert_fails_closed(client, cert, "do not hash")


def test_serving_postgres_without_witnesses_warns_about_replicas(
    engine: Engine, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with TestClient(_app(home, engine)):
        pass
    warned = "serving PostgreSQL without witnesses" in caplog.text
    assert warned is (engine.dialect.name == "postgresql")

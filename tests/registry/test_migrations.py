"""The schema comes only from Alembic: upgrade and downgrade on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Boolean, Engine, String, column, insert, inspect, select, table, text
from sqlmodel import SQLModel
from sqlmodel import select as sm_select

import kcert.registry.log_models  # noqa: F401 - the audit log's tables share the metadata
import kcert.registry.models  # noqa: F401
from kcert.attest.dsse import Envelope, Signature
from kcert.attest.keys import generate_private_key, key_id, public_key_hex
from kcert.certify.environment import fingerprint
from kcert.digest import Digest, canonical_json
from kcert.log.leaf import parse_leaf
from kcert.registry.certificates import get_certificate, get_envelope
from kcert.registry.db import (
    ALEMBIC_DIR,
    downgrade,
    make_engine,
    migrate,
    read_session,
    write_session,
)
from kcert.registry.decisions import gate, promote
from kcert.registry.keys import trust_key
from kcert.registry.log_source import DatabaseLogSource
from kcert.registry.models import (
    Certificate,
    CertificateAlias,
    CertificateSubject,
    Promotion,
    StaleCertificate,
    TargetCreate,
    TrustedKeyCreate,
)
from kcert.registry.replay import check_candidates, replay_decision
from kcert.registry.targets import report_target
from kcert.registry.testing import make_certificate, postgres_database, postgres_reachable

REGISTRY_TABLES = {
    "api_token", "certificate", "certificate_subject", "promotion", "stale_certificate",
    "target", "target_history", "trusted_key",
}  # fmt: skip


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
        yield engine
        engine.dispose()
        return
    reason = postgres_reachable()
    if reason is not None:
        pytest.skip(reason)
    with postgres_database() as url:
        engine = make_engine(url)
        yield engine
        engine.dispose()


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def test_alembic_dir_is_found_beside_the_package() -> None:
    assert (ALEMBIC_DIR / "env.py").is_file()
    assert (ALEMBIC_DIR / "versions" / "0001_registry.py").is_file()


def test_upgrade_head_then_downgrade_base_then_upgrade_again(empty_engine: Engine) -> None:
    assert not (_tables(empty_engine) & REGISTRY_TABLES)
    migrate(empty_engine)
    assert REGISTRY_TABLES <= _tables(empty_engine)
    downgrade(empty_engine, "base")
    assert _tables(empty_engine) - {"alembic_version"} == set()
    migrate(empty_engine)
    assert REGISTRY_TABLES <= _tables(empty_engine)


def test_the_token_targets_column_keeps_the_version_triggers(empty_engine: Engine) -> None:
    """0007 adds api_token.targets in place: a revoked token still bumps the gate's version."""
    for _ in range(2):  # after upgrade, and after downgrade 0006 then upgrade again
        migrate(empty_engine)
        with empty_engine.begin() as conn:
            before = conn.execute(text("SELECT version FROM registry_version")).scalar_one()
            conn.execute(text(
                "INSERT INTO api_token (id, token_hash, scopes, targets, created_at) VALUES "
                "('tok_1', :h, '[]', '[\"prod-a\"]', CURRENT_TIMESTAMP)"), {"h": "a" * 64})
            conn.execute(text("UPDATE api_token SET revoked_at = CURRENT_TIMESTAMP"))
            after = conn.execute(text("SELECT version FROM registry_version")).scalar_one()
            assert after > before
            conn.execute(text("DELETE FROM api_token"))
        downgrade(empty_engine, "0006_registry_version")
        assert "targets" not in {c["name"] for c in inspect(empty_engine).get_columns("api_token")}


def test_migrating_twice_is_harmless(empty_engine: Engine) -> None:
    migrate(empty_engine)
    migrate(empty_engine)
    assert REGISTRY_TABLES <= _tables(empty_engine)


def test_migrations_match_the_models(empty_engine: Engine) -> None:
    """What the models describe is exactly what the migrations make (no drift either way)."""
    migrate(empty_engine)
    with empty_engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": False})
        diff = compare_metadata(context, SQLModel.metadata)
    assert diff == []


def test_the_sandbox_migration_fills_the_column_from_stored_envelopes(
    empty_engine: Engine,
) -> None:
    """Rows stored before 0003 get ``sandboxed`` from their own envelopes; downgrade drops it."""
    migrate(empty_engine, "0002_audit_log")
    key = generate_private_key()
    made = {
        "sandboxed": make_certificate(key, sandbox=True),
        "module code, sandboxed": make_certificate(key, sandbox=True, module_code=True),
        "no-sandbox": make_certificate(key, sandbox=False),
        "older certifier": make_certificate(key, sandbox=None),
    }
    certificate = table(
        "certificate", *(column(n) for n in (
            "id", "kernel_name", "source_digest", "keyid", "verdict", "hw_class", "fingerprint",
            "envelope", "environment", "created_at",
        )),
    )  # fmt: skip
    rows = [
        {"id": m.id, "kernel_name": "saxpy", "source_digest": m.kernel, "keyid": "k" * 64,
         "verdict": "pass", "hw_class": "H100", "fingerprint": "sha256:" + "0" * 64,
         "envelope": canonical_json(m.envelope.to_json()).decode(), "environment": "{}",
         "created_at": datetime(2026, 1, 1, tzinfo=UTC)}
        for m in made.values()
    ]  # fmt: skip
    with empty_engine.begin() as conn:
        conn.execute(insert(certificate), rows)
    migrate(empty_engine)
    with empty_engine.connect() as conn:
        filled = table("certificate", column("id", String()), column("sandboxed", Boolean()))
        read = conn.execute(select(filled.c.id, filled.c.sandboxed)).all()
    stored = {row.id: row.sandboxed for row in read}
    assert {what: stored[m.id] for what, m in made.items()} == {
        "sandboxed": True, "module code, sandboxed": True, "no-sandbox": False,
        "older certifier": False,
    }  # fmt: skip
    downgrade(empty_engine, "0002_audit_log")
    columns = {c["name"] for c in inspect(empty_engine).get_columns("certificate")}
    assert "sandboxed" not in columns and "envelope" in columns
    with empty_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM certificate")).scalar_one() == len(made)


def test_the_pae_id_migration_merges_rows_and_old_decisions_still_replay(
    empty_engine: Engine, tmp_path: Path
) -> None:
    """Two rows of one statement (one revoked) become one revoked row under the PAE id;
    references move; a decision logged before 0004 replays the same after it."""
    migrate(empty_engine, "0003_certificate_sandboxed")
    key = generate_private_key()
    keyid = key_id(key.public_key())
    made = make_certificate(key)
    (mine,) = made.envelope.signatures
    hinted = Envelope(made.envelope.payload_type, made.envelope.payload,
                      (Signature(mine.sig, None),))  # fmt: skip
    old = {e: str(Digest.of_json(e.to_json())) for e in (made.envelope, hinted)}
    certificate = table("certificate", *(column(n) for n in (
        "id", "kernel_name", "source_digest", "keyid", "verdict", "hw_class", "fingerprint",
        "envelope", "environment", "created_at", "sandboxed", "revoked_at",
        "revoke_reason")))  # fmt: skip
    subject = table("certificate_subject", column("digest"), column("certificate_id"),
                    column("name"))  # fmt: skip
    with write_session(empty_engine) as session:
        trust_key(session=session, key=TrustedKeyCreate(
            name="ci", public_key=public_key_hex(key.public_key())))  # fmt: skip
        session.commit()
        prod = TargetCreate(hw_class="H100", environment=made.environment)
        report_target(session=session, name="prod", report=prod)
        session.commit()
    with empty_engine.begin() as conn:
        for n, (envelope, cid) in enumerate(old.items()):
            conn.execute(insert(certificate), [{
                "id": cid, "kernel_name": "saxpy", "source_digest": made.kernel, "keyid": keyid,
                "verdict": "pass", "hw_class": "H100",
                "fingerprint": str(fingerprint(made.environment)),
                "envelope": canonical_json(envelope.to_json()).decode(), "environment": "{}",
                "created_at": datetime(2026, 1, 1 + n, tzinfo=UTC), "sandboxed": True,
                "revoked_at": datetime(2026, 2, 1, tzinfo=UTC) if n else None,
                "revoke_reason": "withdrawn" if n else None}])  # fmt: skip
            conn.execute(insert(subject), [{"digest": made.kernel, "certificate_id": cid,
                                            "name": "saxpy.py"}])  # fmt: skip
    with write_session(empty_engine) as session:
        # Granted on the unrevoked row, before the migration: a leaf naming the old ids.
        granted = promote(session=session, kernel=Digest.parse(made.kernel), target="prod")
        session.commit()
    assert granted.certificate == old[made.envelope] and granted.log_index is not None
    with empty_engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO stale_certificate (certificate_id, target_name, generation, "
            "old_fingerprint, new_fingerprint, marked_at) VALUES (:c, 'prod', 1, :f, :f, :t)"
        ), {"c": old[hinted], "f": "sha256:" + "1" * 64, "t": datetime(2026, 3, 1, tzinfo=UTC)})

    source = DatabaseLogSource(empty_engine, tmp_path)
    ((_, data),) = source.entries(granted.log_index, granted.log_index + 1)
    leaf = parse_leaf(granted.log_index, data)

    def served_before(cid: str) -> dict[str, Any]:
        # What a registry before 0004 served: the row's envelope (no alias table yet).
        with empty_engine.connect() as conn:
            sql = text("SELECT envelope FROM certificate WHERE id = :c")
            envelope: dict[str, Any] = json.loads(conn.execute(sql, {"c": cid}).scalar_one())
            return envelope

    before = check_candidates(leaf, served_before)
    assert all(c.status == "same" for c in before), before

    migrate(empty_engine)
    new_id = made.id
    assert new_id == str(Digest.of_bytes(made.envelope.pae()))
    with read_session(empty_engine) as session:
        (row,) = session.exec(sm_select(Certificate)).all()
        assert (row.id, row.keyid, row.revoke_reason) == (new_id, keyid, "withdrawn")
        stored = json.loads(row.envelope)
        assert stored["signatures"] == [{"keyid": keyid, "sig": mine.to_json()["sig"]}]
        assert [s.certificate_id for s in session.exec(sm_select(CertificateSubject))] == [new_id]
        assert session.exec(sm_select(Promotion.certificate_id)).all() == [new_id]
        assert session.exec(sm_select(StaleCertificate.certificate_id)).all() == [new_id]
        aliases = {a.old_id: a.certificate_id for a in session.exec(sm_select(CertificateAlias))}
        assert aliases == dict.fromkeys(old.values(), new_id)
        # Old ids still name the certificate (revoke, show) and serve their own envelope.
        assert get_certificate(session=session, certificate=old[hinted]).id == new_id
        served = get_envelope(session=session, certificate=old[hinted])
        assert str(Digest.of_json(served)) == old[hinted]
        gate_now = gate(session=session, kernel=Digest.parse(made.kernel), target="prod")
    assert not gate_now.allow  # a revoked row was merged in: the certificate is revoked
    assert replay_decision(leaf).same
    after = check_candidates(leaf, source.certificate_envelope)
    assert sorted(c.certificate for c in after) == sorted(old.values())
    assert after == before

    downgrade(empty_engine, "0003_certificate_sandboxed")
    with empty_engine.connect() as conn:
        ids = conn.execute(text("SELECT id, revoke_reason FROM certificate")).all()
        assert dict(ids) == dict.fromkeys(old.values(), "withdrawn")
        refs = conn.execute(text("SELECT certificate_id FROM promotion")).scalars().all()
        assert refs == [min(old.values())]
    assert "certificate_alias" not in _tables(empty_engine)
    migrate(empty_engine)
    assert "certificate_alias" in _tables(empty_engine)

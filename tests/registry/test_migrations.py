"""The schema comes only from Alembic: upgrade and downgrade on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Boolean, Engine, String, column, insert, inspect, select, table, text
from sqlmodel import SQLModel

import kcert.registry.log_models  # noqa: F401 - the audit log's tables share the metadata
import kcert.registry.models  # noqa: F401
from kcert.attest.keys import generate_private_key
from kcert.digest import canonical_json
from kcert.registry.db import ALEMBIC_DIR, downgrade, make_engine, migrate
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

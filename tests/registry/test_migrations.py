"""The schema comes only from Alembic: upgrade and downgrade on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect
from sqlmodel import SQLModel

import kcert.registry.log_models  # noqa: F401 - the audit log's tables share the metadata
import kcert.registry.models  # noqa: F401
from kcert.registry.db import ALEMBIC_DIR, downgrade, make_engine, migrate
from kcert.registry.testing import postgres_database, postgres_reachable

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

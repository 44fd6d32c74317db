"""Fixtures of the audit log tests: databases holding only the log's tables.

The log's tables are made by running the ``0002_audit_log`` migration's own
``upgrade()`` through Alembic's operations API, so these tests exercise the
real migration without depending on the registry's first revision.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from log_db import POSTGRES_URL, apply_log_migration
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from kcert.registry.db import make_engine


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'log.db'}")
    apply_log_migration(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_engine() -> Iterator[Engine]:
    """A fresh database on the test server, dropped afterwards."""
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"kcert_log_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # no server here: the marker says what is needed
        admin.dispose()
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_URL}: {exc.__class__.__name__}")
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        apply_log_migration(engine)
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

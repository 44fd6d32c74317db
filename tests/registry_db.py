"""Database fixtures shared by the registry and API tests: a fresh database per test.

Every test that takes ``database_url`` (or ``engine``) runs once on SQLite and
once on PostgreSQL (``postgres`` marker). The conftests of those folders
import these fixtures by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine

from kcert.attest.keys import generate_private_key
from kcert.registry.db import make_engine
from kcert.registry.testing import PostgresTemplate, SqliteTemplate, postgres_reachable

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> SqliteTemplate:
    return SqliteTemplate(tmp_path_factory.mktemp("registry-template"))


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[PostgresTemplate]:
    reason = postgres_reachable()
    if reason is not None:
        pytest.skip(reason)
    template = PostgresTemplate()
    yield template
    template.close()


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        template: SqliteTemplate = request.getfixturevalue("sqlite_template")
        yield template.fresh(tmp_path)
        return
    pg: PostgresTemplate = request.getfixturevalue("postgres_template")
    with pg.fresh() as url:
        yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def signing_key() -> Ed25519PrivateKey:
    return generate_private_key()

"""Fixtures for the API tests: a fresh database per test on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine

from kcert.api.app import create_app
from kcert.attest.keys import generate_private_key
from kcert.registry.config import Settings
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


ADMIN_TOKEN = "kcert_test_admin_" + "x" * 24


@pytest.fixture
def app(engine: Engine, database_url: str, tmp_path: Path) -> FastAPI:
    settings = Settings(
        home=tmp_path / "home", database_url=database_url, admin_token=SecretStr(ADMIN_TOKEN),
        max_body_bytes=256 * 1024,
    )  # fmt: skip
    return create_app(settings, engine=engine)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as client:
        yield client


@pytest.fixture
def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

"""Fixtures for the API tests: the app and clients over the shared per-test databases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine

from kcert.api.app import create_app
from kcert.registry.config import Settings

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

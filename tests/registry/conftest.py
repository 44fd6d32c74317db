"""The embedded registry over each test's database (SQLite, and PostgreSQL where marked)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings


@pytest.fixture
def registry(engine: Engine, database_url: str) -> EmbeddedRegistry:
    return EmbeddedRegistry(Settings(database_url=database_url), engine=engine)

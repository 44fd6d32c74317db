"""Database helpers of the audit log tests, importable from test modules and spawned workers.

(A test module must not import ``conftest`` by name: with several conftest
files in the tree, that name resolves to whichever was imported first.)
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Engine

from kcert.registry.db import ALEMBIC_DIR

MIGRATION = ALEMBIC_DIR / "versions" / "0002_audit_log.py"
POSTGRES_URL = os.environ.get(
    "KCERT_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def load_migration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kcert_migration_0002", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def apply_log_migration(engine: Engine, direction: str = "upgrade") -> None:
    module = load_migration()
    with engine.begin() as conn:
        with Operations.context(MigrationContext.configure(conn)):
            getattr(module, direction)()

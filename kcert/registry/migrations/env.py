"""Alembic environment for kcert's registry.

The target metadata is ``SQLModel.metadata`` with every kcert table imported;
the URL comes from :class:`kcert.registry.config.Settings` unless the caller
passes a connection (``kcert.registry.db.migrate``) or a URL in the config.
"""

from __future__ import annotations

import importlib
import logging.config

from alembic import context
from sqlalchemy import Connection
from sqlmodel import SQLModel

import kcert.registry.models  # noqa: F401 - registers the registry's tables
from kcert.registry.config import Settings
from kcert.registry.db import make_engine

try:
    # The audit log's tables live in their own module (owned by the log's engineer).
    importlib.import_module("kcert.registry.log_models")
except ModuleNotFoundError as exc:  # pragma: no cover - only before that module exists
    if exc.name != "kcert.registry.log_models":
        raise

config = context.config
if config.config_file_name is not None:
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = SQLModel.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or Settings().resolved_database_url()


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode copies tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    context.configure(
        url=_url(), target_metadata=target_metadata, literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )  # fmt: skip
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.begin() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

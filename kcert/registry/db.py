"""Engines, sessions and migrations.

SQLite needs help to be a good multi-threaded registry: write transactions
start with ``BEGIN IMMEDIATE`` so two writers queue on the database lock
instead of both reading and then one failing to upgrade its lock (that is the
"lost update" a naive setup gets), WAL lets readers run beside a writer, and
foreign keys are switched on. Read-only work (the gate) uses a plain deferred
``BEGIN`` through :func:`read_session` so gates never queue behind each other.

The schema is made only by Alembic; :func:`migrate` upgrades a database to
head programmatically so ``kcert serve`` and the embedded registry are always
current when they start.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

import kcert
from alembic import command
from kcert.registry.errors import RegistryUnavailable

#: ``alembic/`` sits beside the ``kcert`` package in the (editable) checkout.
ALEMBIC_DIR = Path(kcert.__file__).resolve().parent.parent / "alembic"
_READ_ONLY = "kcert_read_only"
_SQLITE_BUSY_MS = 30_000

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def make_engine(url: str) -> Engine:
    """A new engine for ``url``, with kcert's SQLite settings where it is SQLite."""
    try:
        parsed = make_url(url)
    except SQLAlchemyError as exc:
        raise RegistryUnavailable(f"not a database URL: {_redact(url)}") from exc
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": _SQLITE_BUSY_MS / 1000}
    )
    _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver so "begin" below decides.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        read_only = connection.get_execution_options().get(_READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def engine_for(url: str) -> Engine:
    """The process-wide engine for ``url`` (made once, shared by threads)."""
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url)
        return engine


def dispose_engines() -> None:
    """Close every pooled connection (tests and shutdown)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def write_session(engine: Engine) -> Session:
    """A session for changes; on SQLite its transaction holds the write lock from the start."""
    return Session(engine, expire_on_commit=False)


def read_session(engine: Engine) -> Session:
    """A session for reads only; on SQLite it never waits for the write lock."""
    return Session(engine.execution_options(**{_READ_ONLY: True}), expire_on_commit=False)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    with write_session(engine) as session:
        yield session


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config pointing at kcert's migrations (and at ``url`` when given)."""
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    if url is not None:
        # ConfigParser interpolates '%'; URL-encoded passwords contain it.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind ``engine`` to ``revision`` (default: the newest)."""
    config = alembic_config()
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    except SQLAlchemyError as exc:
        raise RegistryUnavailable(
            f"cannot migrate the registry database {_redact(str(engine.url))}: "
            f"{exc.__class__.__name__}"
        ) from exc


_current: set[str] = set()


def ensure_migrated(engine: Engine) -> None:
    """:func:`migrate` once per database per process (each CLI call opens the registry)."""
    key = engine.url.render_as_string(hide_password=False)
    if key in _current:
        return
    migrate(engine)
    _current.add(key)


def downgrade(engine: Engine, revision: str = "base") -> None:
    _current.discard(engine.url.render_as_string(hide_password=False))
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def _redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except SQLAlchemyError:
        return "<unparseable URL>"

"""Engines, sessions and migrations.

SQLite needs help to be a good multi-threaded registry: write transactions
start with ``BEGIN IMMEDIATE`` so two writers queue on the database lock
instead of both reading and then one failing to upgrade its lock (that is the
"lost update" a naive setup gets), WAL lets readers run beside a writer, and
foreign keys are switched on. Read-only work uses a plain deferred ``BEGIN``
through :func:`read_session` so reads never queue behind each other.
A write session's transactions after its first commit are read transactions
too: the answer a route builds after committing must not keep the write lock
(and every other writer) waiting until the session closes.

**Lock order.** Every write transaction takes the registry's write lock
before it reads anything, and takes it first: on SQLite that is the database
lock of ``BEGIN IMMEDIATE``; on PostgreSQL it is the row lock on the audit
log's one ``log_state`` row (``SELECT ... FOR UPDATE``), taken by
:class:`WriteSession` as the first statement of each write transaction
(every writer opens its session with :func:`write_session`: the API's write
routes and the embedded registry do). Every
state change appends a leaf, and appending updates that row, so every writer
needs that lock anyway; taking it first is what makes the order one for all of
them (log state, then target, certificate, key, promotion and token rows, in
whatever order each writer needs). Taking it only when appending, after
reading, let a promotion decide on certificates read before a concurrent
revocation committed, and let a drift report (log lock, then the key-share
locks its foreign keys take on certificate rows) deadlock with a revocation
(certificate row, then log lock). Under this order the row locks a writer
takes later (``FOR UPDATE`` on the target, certificate, key or token it
changes) are never contended by another writer. Readers take no locks: the
gate and every read session run beside the writer. PostgreSQL runs at READ
COMMITTED, so each statement after the lock sees everything committed before.

Pools hold as many connections as the API's thread pool has threads, so a busy
server waits on the database, not on the pool.

The schema is made only by Alembic; :func:`migrate` upgrades a database to
head programmatically so ``kcert serve`` and the embedded registry are always
current when they start.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from kcert.registry.errors import RegistryUnavailable
from kcert.registry.log_models import LOG_STATE_ID

#: The migrations ship inside the package, so an installed wheel can make its own schema
#: (``alembic.ini`` at the repository root points here too, for ``alembic revision``).
ALEMBIC_DIR = Path(__file__).resolve().parent / "migrations"
_READ_ONLY = "kcert_read_only"
_SQLITE_BUSY_MS = 30_000
#: Connections per engine: the API runs sync routes on anyio's default thread pool
#: (40 threads), each holding at most one connection at a time; the gate reads through
#: this pool too (kcert.registry.gatekeeper), one connection per request at a time.
#: PostgreSQL keeps only ``_POOL_KEPT`` of them open between bursts (they are costly).
POOL_MAX = 40
_POOL_KEPT = 10
#: Seconds a request waits for a pooled connection before answering 503.
POOL_TIMEOUT_S = 10

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def make_engine(url: str) -> Engine:
    """A new engine for ``url``, with kcert's SQLite settings where it is SQLite."""
    try:
        parsed = make_url(url)
    except SQLAlchemyError as exc:
        raise RegistryUnavailable(f"not a database URL: {_redact(url)}") from exc
    if parsed.get_backend_name() != "sqlite":
        return create_engine(
            url, pool_pre_ping=True, pool_size=_POOL_KEPT, max_overflow=POOL_MAX - _POOL_KEPT,
            pool_timeout=POOL_TIMEOUT_S,
        )  # fmt: skip
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": _SQLITE_BUSY_MS / 1000},
        pool_size=POOL_MAX, max_overflow=0, pool_timeout=POOL_TIMEOUT_S,
    )  # fmt: skip
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


class WriteSession(Session):
    """A session whose first transaction writes; every one after its first commit only reads.

    Its write transaction holds the registry's write lock from its first statement
    (see "Lock order" in this module).

    On SQLite a write transaction holds the database lock from ``BEGIN
    IMMEDIATE`` to its end. Work done after a commit (reading back the answer)
    would otherwise open another such transaction and hold the lock until the
    session closes, which in the API is after the response: concurrent writers
    then convoy on the lock, time out and fail. Switching the bind at commit
    fixes that for every caller at once, whatever it reads after committing.
    A write after the commit is still possible; on SQLite it upgrades the read
    transaction's lock, as any deferred transaction does.
    """

    def commit(self) -> None:
        super().commit()
        bind = self.bind
        if isinstance(bind, Engine) and not bind.get_execution_options().get(_READ_ONLY):
            self.bind = read_only(bind)


#: The registry's write lock on PostgreSQL (see "Lock order" above).
_WRITE_LOCK = text(f"SELECT size FROM log_state WHERE id = {LOG_STATE_ID} FOR UPDATE")


@event.listens_for(WriteSession, "after_begin")
def _take_write_lock(_session: Session, transaction: Any, connection: Connection) -> None:
    # A savepoint runs inside a transaction that holds the lock already; SQLite took
    # its database lock at BEGIN IMMEDIATE; a read-only bind writes nothing.
    if transaction.nested or connection.dialect.name == "sqlite":
        return
    if connection.get_execution_options().get(_READ_ONLY):
        return
    connection.execute(_WRITE_LOCK)


def read_only(engine: Engine) -> Engine:
    """``engine`` with transactions that never take SQLite's write lock at ``BEGIN``."""
    return engine.execution_options(**{_READ_ONLY: True})


def write_session(engine: Engine) -> Session:
    """A session for changes; on SQLite its transaction holds the write lock from the start
    until its first commit (see :class:`WriteSession`)."""
    return WriteSession(engine, expire_on_commit=False)


def read_session(engine: Engine) -> Session:
    """A session for reads only; on SQLite it never waits for the write lock."""
    return Session(read_only(engine), expire_on_commit=False)


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

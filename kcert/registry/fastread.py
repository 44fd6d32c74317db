"""Read-only Core statements run on the driver's own cursor: SQLAlchemy compiles, the driver runs.

The gate answers every deploy. Through a SQLAlchemy ``Connection`` one small
indexed SELECT costs about 150 µs of Python (execution events, the compiled
cache lookup, result metadata) against about 10 µs in the driver itself, and
a pooled PostgreSQL connection adds a pre-ping and BEGIN/ROLLBACK round trips
on top. :class:`CompiledRead` compiles a Core statement once for a dialect, so
the SQL is the registry's own statement and never written by hand, and it
converts each value with SQLAlchemy's own result processors, so its rows hold
the same Python values a ``Connection`` would return.

:func:`read_connections` gives the connections such reads run on, as an
``async`` interface for the event loop:

- SQLite: the engine's own kind of connection (its connect-time settings
  apply), detached from its pool, with ``query_only`` set. Reads are
  in-process CPU work, so they run right on the loop, each session in one
  deferred transaction (one snapshot).
- PostgreSQL: psycopg's ``AsyncConnection`` with the engine's connect
  arguments, in autocommit, with ``default_transaction_read_only``. A round
  trip is a wait, and the loop serves other requests during it; a blocking
  driver would leave the whole process idle for every round trip.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import namedtuple
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from sqlalchemy import Engine, Select
from sqlalchemy.engine import Dialect

from kcert.registry.errors import RegistryUnavailable

#: PostgreSQL connections one worker process's gate keeps open at most.
MAX_CONNECTIONS = 8
#: How the gate's PostgreSQL connections show in ``pg_stat_activity`` (unless the URL names one).
APPLICATION_NAME = "kcert gate"


class CompiledRead:
    """One SELECT, compiled once for ``dialect``.

    Rows are named tuples whose fields are the statement's column keys, like
    SQLAlchemy's ``Row`` attributes.
    """

    def __init__(self, statement: Select[Any], dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql: str = compiled.string
        self._order = compiled.positiontup if compiled.positional else None
        #: Values fixed in the statement itself (literals SQLAlchemy made parameters).
        self._fixed = {name: bind.effective_value for name, bind in compiled.binds.items()
                       if not bind.required}  # fmt: skip
        self._required = frozenset(compiled.binds) - frozenset(self._fixed)
        columns = list(statement.selected_columns)
        # The names SQLAlchemy's Row gives them (a label, a column's key, a function's name).
        names = list(statement.selected_columns.keys())
        self._row: Any = namedtuple("Row", names)  # type: ignore[misc]
        processors = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
        self._convert: list[tuple[int, Callable[[Any], Any]]] = [
            (i, p) for i, p in enumerate(processors) if p is not None
        ]

    def parameters(self, values: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        """The driver's parameters for ``values`` (every bind the statement names)."""
        if not self._required <= values.keys():
            raise KeyError(f"missing parameters: {sorted(self._required - values.keys())}")
        full = {**self._fixed, **values}
        return full if self._order is None else tuple(full[name] for name in self._order)

    def rows(self, raw_rows: Sequence[Sequence[Any]]) -> list[Any]:
        """The driver's rows as named tuples of converted values."""
        if not self._convert:
            return [self._row._make(raw) for raw in raw_rows]
        out = []
        for raw in raw_rows:
            values = list(raw)
            for i, process in self._convert:
                values[i] = process(values[i])
            out.append(self._row._make(values))
        return out


class Reader(Protocol):
    """Reads in one session (see :meth:`ReadConnections.session`)."""

    async def all(self, read: CompiledRead, values: Mapping[str, Any]) -> list[Any]: ...


async def one_or_none(reader: Reader, read: CompiledRead, values: Mapping[str, Any]) -> Any:
    rows = await reader.all(read, values)
    if len(rows) > 1:
        raise RegistryUnavailable(f"expected at most one row, got {len(rows)}: {read.sql}")
    return rows[0] if rows else None


class ReadConnections:
    """Driver connections for :class:`CompiledRead`, one per concurrent session, reused.

    A connection is popped from the free list for one session and pushed back
    after it, so no two sessions share one; the server's event loop, the
    gate's only caller there, keeps reusing a few. A connection that fails is
    closed, never reused. When the first statement on a reused connection
    finds it disconnected (the database restarted), it runs once more on a new
    one, which is what the pool's pre-ping would have bought. Driver errors
    become :class:`RegistryUnavailable` (the API's 503). :meth:`close` (or
    garbage collection) closes every free connection; a session after it
    opens a new one.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._free: list[Any] = []
        # Not a bound method: the finalizer must not keep this object alive.
        self._finalizer = weakref.finalize(self, _close_all, self._free, type(self)._close_one)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Reader]:
        """A :class:`Reader` on a connection of its own; it must only read."""
        connection = self._take()
        fresh = connection is None
        if connection is None:
            connection = await self._connect()
        session = _Session(self, connection, fresh)
        try:
            await self._begin(connection)
            try:
                yield session
            finally:
                # Also after the caller's own error: a connection goes back with no
                # transaction open, or not at all.
                if session.connection is not None:
                    await self._end(session.connection)
        except self._error as exc:
            self._discard(session)
            raise _unavailable(exc) from exc
        except Exception:
            # The caller's own error (a refused token, say): the connection is sound.
            self._release(session)
            raise
        except BaseException:
            self._discard(session)
            raise
        self._release(session)

    def _take(self) -> Any | None:
        """A free connection, or None."""
        return self._free.pop() if self._free else None

    def _release(self, session: _Session) -> None:
        if session.connection is not None:
            self._free.append(session.connection)
            session.connection = None

    def _discard(self, session: _Session) -> None:
        if session.connection is not None:
            self._close_one(session.connection)
            session.connection = None

    async def _retry(self, session: _Session, exc: Exception) -> bool:
        """After ``exc`` on the first statement of ``session``: swap in a new connection?"""
        dialect: Any = self._engine.dialect
        if session.fresh or not dialect.is_disconnect(exc, self._dbapi(session.connection), None):
            return False
        self._discard(session)
        session.connection, session.fresh = await self._connect(), True
        await self._begin(session.connection)
        return True

    def close(self) -> None:
        """Close every free connection (at shutdown, when no session is running)."""
        _close_all(self._free, self._close_one)

    # Per database: what a connection is and how a statement runs on it.

    async def _connect(self) -> Any:
        raise NotImplementedError

    async def _begin(self, connection: Any) -> None:
        raise NotImplementedError

    async def _end(self, connection: Any) -> None:
        raise NotImplementedError

    async def _execute(self, connection: Any, sql: str, parameters: Any) -> list[Any]:
        raise NotImplementedError

    def _dbapi(self, connection: Any) -> Any:
        return connection

    @staticmethod
    def _close_one(connection: Any) -> None:
        try:
            connection.close()
        except Exception:  # closing a broken connection may fail too; it is gone either way
            pass


class _Session:
    def __init__(self, owner: ReadConnections, connection: Any, fresh: bool) -> None:
        self.owner, self.connection, self.fresh = owner, connection, fresh
        self.started = False

    async def all(self, read: CompiledRead, values: Mapping[str, Any]) -> list[Any]:
        parameters = read.parameters(values)
        first, self.started = not self.started, True
        try:
            raw = await self.owner._execute(self.connection, read.sql, parameters)
        except self.owner._error as exc:
            if not first or not await self.owner._retry(self, exc):
                raise
            raw = await self.owner._execute(self.connection, read.sql, parameters)
        return read.rows(raw)


class _SqliteConnections(ReadConnections):
    """In-process reads: run on the loop, each session one deferred transaction."""

    async def _connect(self) -> Any:
        try:
            fairy = self._engine.raw_connection()
            connection: Any = fairy.driver_connection
            # Detached: the pool no longer counts it, and engine.dispose() leaves it to us.
            fairy.detach()
            # Autocommit already (kcert.registry.db sets isolation_level None); never writes.
            connection.execute("PRAGMA query_only = 1")
        except Exception as exc:  # the pool's errors and the driver's alike
            raise _unavailable(exc) from exc
        return connection

    async def _begin(self, connection: Any) -> None:
        connection.execute("BEGIN")

    async def _end(self, connection: Any) -> None:
        connection.execute("ROLLBACK")

    async def _execute(self, connection: Any, sql: str, parameters: Any) -> list[Any]:
        rows: list[Any] = connection.execute(sql, parameters).fetchall()
        return rows


class _PostgresConnections(ReadConnections):
    """psycopg's async connections: the loop serves other requests during each round trip.

    An async connection belongs to the event loop that made it, so a free
    connection is reused only on the same loop (a server has one; a test
    client may start several in turn). At most :data:`MAX_CONNECTIONS` sessions
    run at once per loop; more wait for one to end, so a burst of requests
    never opens more database connections than that per worker process.
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Reader]:
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Semaphore(MAX_CONNECTIONS)
        async with slots, super().session() as reader:
            yield reader

    async def _connect(self) -> Any:
        # lazy: only a PostgreSQL registry needs its driver
        import psycopg

        _, params = self._engine.dialect.create_connect_args(self._engine.url)
        params.setdefault("application_name", APPLICATION_NAME)
        try:
            connection = await psycopg.AsyncConnection.connect(**params, autocommit=True)
            await connection.execute("SET default_transaction_read_only = on")
        except Exception as exc:
            raise _unavailable(exc) from exc
        return (asyncio.get_running_loop(), connection)

    def _take(self) -> Any | None:
        loop = asyncio.get_running_loop()
        while self._free:
            entry = self._free.pop()
            if entry[0] is loop:
                return entry
            self._close_one(entry)
        return None

    async def _begin(self, connection: Any) -> None:
        pass  # autocommit: every statement its own snapshot, as read committed gives

    async def _end(self, connection: Any) -> None:
        pass

    async def _execute(self, connection: Any, sql: str, parameters: Any) -> list[Any]:
        cursor = connection[1].cursor()
        try:
            await cursor.execute(sql, parameters)
            rows: list[Any] = await cursor.fetchall()
        finally:
            await cursor.close()
        return rows

    def _dbapi(self, connection: Any) -> Any:
        return connection[1]

    @staticmethod
    def _close_one(connection: Any) -> None:
        # Synchronous on purpose: also from a finalizer or another loop, where nothing
        # can be awaited. Closing the socket is all a read-only autocommit connection needs.
        try:
            connection[1].pgconn.finish()
        except Exception:
            pass


def read_connections(engine: Engine) -> ReadConnections:
    """The :class:`ReadConnections` for ``engine``'s database."""
    if engine.dialect.name == "sqlite":
        return _SqliteConnections(engine)
    if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg":
        return _PostgresConnections(engine)
    raise RegistryUnavailable(
        f"the gate reads SQLite or PostgreSQL through psycopg, not {engine.dialect.name}"
        f"+{engine.dialect.driver}"
    )


def _unavailable(exc: BaseException) -> RegistryUnavailable:
    return RegistryUnavailable(f"the registry database could not be read ({type(exc).__name__})")


def _close_all(free: list[Any], close: Callable[[Any], None]) -> None:
    while free:
        close(free.pop())

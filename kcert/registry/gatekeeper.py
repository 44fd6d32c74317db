"""The gate's cache: answers kept per process, reused only at the registry's current version.

The registry's version (``registry_version``, migration ``0005``) is a counter
that database triggers raise on every insert, update or delete of a table the
gate reads: targets, promotions, certificates, their subjects, trusted keys
and tokens. No write can skip it, whichever code or process makes it, and it
commits with the write, so every process on the database sees it together
with the rows it describes.

Per request, :class:`Gatekeeper` reads the version (with the log's size, for
the log guard) after the request arrived. An answer for (kernel, target) and
the presented token's row each cached at that very version are reused; the
token is checked again either way (scope, revocation, and expiry against the
clock). Anything else is read in the same session: the token's row
(:func:`kcert.registry.tokens.stored_record`) and the decision
(:func:`kcert.registry.decisions.gate`, the registry's one gate query). So a
revocation, a drift or a suspension changes the very next answer in every
process; there is no time-based staleness.

The version is read before anything it guards: in the same snapshot on
SQLite (one deferred transaction), in an earlier one on PostgreSQL (read
committed). An answer is therefore cached under a version no newer than the
state it saw; a write committed in between only makes the entry stale at once.

The gate fails closed when the log is unhealthy (:class:`LogHealth`, the
registry's :class:`kcert.registry.checkpoints.CheckpointGuard`): a log size
below a size the log signed (read before the size, so never a false alarm) or
an inconsistency the guard found makes every answer a deny, never cached.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import anyio
from sqlalchemy import Connection, Engine
from sqlalchemy import select as sa_select
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from kcert.digest import Digest
from kcert.registry import decisions
from kcert.registry.db import read_only
from kcert.registry.errors import RegistryUnavailable
from kcert.registry.log_models import LOG_STATE_ID, LogState
from kcert.registry.models import REGISTRY_VERSION_ID, RegistryVersion, Scope, utcnow
from kcert.registry.policy import Decision
from kcert.registry.tokens import (
    TokenRecord,
    hash_token,
    presented_hash,
    principal_of,
    stored_record,
)

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

#: The registry's version and the log's size, as read together.
_Stamp = tuple[int, int]

#: Distinct (kernel, target) answers, and tokens, kept per process before a cache starts over.
MAX_ENTRIES = 65_536

_version = RegistryVersion.__table__  # type: ignore[attr-defined]
_state = LogState.__table__  # type: ignore[attr-defined]

#: The registry's version and the log's size, in one round trip (each table holds one row).
_VERSION = sa_select(
    sa_select(_version.c.version)
    .where(_version.c.id == REGISTRY_VERSION_ID)
    .scalar_subquery()
    .label("version"),
    sa_select(_state.c.size).where(_state.c.id == LOG_STATE_ID).scalar_subquery().label("size"),
)


class LogHealth(Protocol):
    """The log's own guard (:class:`kcert.registry.checkpoints.CheckpointGuard`), in memory."""

    def floor(self) -> int:
        """A size the log has signed; read before the database's log size."""
        ...

    def needs_verifying(self, size: int) -> bool:
        """Whether the tree at ``size`` is larger than any proved consistent (no I/O)."""
        ...

    def verify(self) -> None:
        """Prove the database's tree extends the last signed checkpoint (blocking I/O)."""
        ...

    def refusal(self, size: int, floor: int) -> str | None:
        """Why no gate may allow at log size ``size``, or ``None``."""
        ...


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """A gate answer as the caller rendered it, and whether it came from the cache."""

    rendered: T
    cached: bool


class Gatekeeper(Generic[T]):
    """Gate answers for one database, cached per process and checked against its version.

    ``render`` turns a :class:`Decision` into what the caller serves (the API
    renders the JSON bytes once, so a cache hit serializes nothing). Entries
    are immutable ``(version, value)`` pairs replaced whole.
    """

    def __init__(
        self, engine: Engine, *, admin_token: str | None, render: Callable[[Decision], T],
        max_entries: int = MAX_ENTRIES, health: LogHealth | None = None,
    ) -> None:  # fmt: skip
        self._engine = engine
        self._health = health
        # SQLite reads are in-process CPU work: a hop to a thread costs more than the read and
        # buys nothing under the GIL, and a pool checkout costs more than the read too, so
        # each thread that answers (the event loop's) keeps one read-only connection. A
        # PostgreSQL round trip is a wait: it runs off the loop, on a pooled connection.
        self._inline = engine.dialect.name == "sqlite"
        self._reader = read_only(engine)
        # The registry's statement, rendered once with its constants inline (a supported
        # compile option), for the driver's cursor.
        self._version_sql = str(
            _VERSION.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True})
        )
        self._held = threading.local()
        self._opened: list[Connection] = []
        self._opened_lock = threading.Lock()
        self._admin_hash = hash_token(admin_token) if admin_token else None
        self._render = render
        self._max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[_Stamp, T]] = {}
        #: Known tokens' rows by hash, with the version they were read at.
        self._tokens: dict[str, tuple[_Stamp, TokenRecord]] = {}
        #: Answers served from the cache and computed (for tests and diagnostics, never
        #: for decisions).
        self.hits = 0
        self.misses = 0

    async def answer(self, *, token: str | None, kernel: str, target: str) -> Answer[T]:
        """Authenticate ``token`` (scope ``gate:read``) and answer the gate for (kernel, target).

        Raises :class:`~kcert.registry.errors.Unauthenticated` or
        :class:`~kcert.registry.errors.Forbidden` as the other routes do,
        :class:`~kcert.digest.DigestError` for a kernel that is not a digest, and
        :class:`~kcert.registry.errors.RegistryUnavailable` when the database fails.
        """
        presented = presented_hash(token)
        kernel_digest = Digest.parse(kernel)
        # Before any read: a size the log signed. A log below it is a rolled-back database.
        floor = self._health.floor() if self._health else 0
        try:
            if self._inline:
                log_size, answer = self._read(presented, kernel_digest, target)
            else:
                log_size, answer = await anyio.to_thread.run_sync(
                    self._read, presented, kernel_digest, target
                )
        except DBAPIError as exc:
            # The driver's message may quote SQL and values: only its kind goes on.
            raise RegistryUnavailable(
                f"the registry database could not be read ({type(exc.orig).__name__})"
            ) from exc
        return await self._refused(log_size, floor) or answer

    def _read(self, presented: str, kernel: Digest, target: str) -> tuple[int, Answer[T]]:
        """The log's size, and the answer: cached at the current version, or decided now."""
        key = (str(kernel), target)
        with self._connection() as connection:
            if self._inline:
                # A cached answer on SQLite: the version on the driver's cursor, outside any
                # transaction (so its own snapshot); SQLAlchemy's execute costs several times
                # the read itself, and this read is all most gate requests need.
                stamp = self._driver_stamp(connection)
                cached = self._cached(presented, key, stamp)
                if cached is not None:
                    return stamp[1], cached
            # One snapshot on SQLite (a deferred transaction); on PostgreSQL (read committed)
            # each statement sees at least what the version read saw, so an answer is never
            # cached under a version newer than the state it was decided from.
            with connection.begin(), Session(bind=connection) as session:
                stamp = _stamp(connection.execute(_VERSION).one())
                cached = self._cached(presented, key, stamp)
                if cached is not None:
                    return stamp[1], cached
                known = self._tokens.get(presented)
                if known is not None and known[0] == stamp:
                    record: TokenRecord | None = known[1]
                else:
                    record = stored_record(session, presented)
                    if record is not None:  # unknown tokens are not kept: guessing fills no cache
                        self._remember(self._tokens, presented, (stamp, record))
                self._authorize(presented, record)
                entry = self._entries.get(key)
                if entry is not None and entry[0] == stamp:
                    self.hits += 1
                    return stamp[1], Answer(entry[1], cached=True)
                decision = decisions.gate(session=session, kernel=kernel, target=target)
        self.misses += 1
        rendered = self._render(decision)
        self._remember(self._entries, key, (stamp, rendered))
        return stamp[1], Answer(rendered, cached=False)

    def _cached(self, presented: str, key: tuple[str, str], stamp: _Stamp) -> Answer[T] | None:
        """The cached answer when it and the token's row were both read at ``stamp``."""
        entry = self._entries.get(key)
        if entry is None or entry[0] != stamp:
            return None
        known = self._tokens.get(presented)
        if known is not None and known[0] == stamp:
            record: TokenRecord | None = known[1]
        elif self._admin_hash is not None and hmac.compare_digest(presented, self._admin_hash):
            record = None  # the admin token is never stored: nothing to read
        else:
            return None
        self._authorize(presented, record)
        self.hits += 1
        return Answer(entry[1], cached=True)

    def _authorize(self, presented: str, record: TokenRecord | None) -> None:
        principal_of(presented, self._admin_hash, record, now=utcnow()).require(Scope.GATE_READ)

    def _driver_stamp(self, connection: Connection) -> _Stamp:
        # SQLite's driver runs in autocommit (kcert.registry.db: isolation_level None), and
        # no SQLAlchemy transaction is open on this connection here.
        driver = connection.connection.driver_connection
        assert driver is not None
        return _stamp(driver.execute(self._version_sql).fetchone())

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """A read-only connection: this thread's own on SQLite, a pooled one on PostgreSQL."""
        if not self._inline:
            with self._reader.connect() as connection:
                yield connection
            return
        held: Connection | None = getattr(self._held, "connection", None)
        if held is None or held.closed or held.invalidated:
            if held is not None:
                held.close()
            held = self._held.connection = self._reader.connect()
            with self._opened_lock:
                self._opened.append(held)
        yield held

    def close(self) -> None:
        """Close the connections kept by the threads that answered (at shutdown)."""
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for connection in opened:
            connection.close()

    async def _refused(self, log_size: int, floor: int) -> Answer[T] | None:
        """A deny when the log is unhealthy or unproved: the gate fails closed (never cached).

        A tree larger than any the guard proved (someone wrote since) is proved
        first, off the event loop: the gate never allows from a tree that may
        be a fork padded past the signed size. Reads that find no new entry
        cost nothing here.
        """
        if self._health is None:
            return None
        if self._health.needs_verifying(log_size):
            await anyio.to_thread.run_sync(self._health.verify)
        reason = self._health.refusal(log_size, floor)
        if reason is None:
            return None
        return Answer(self._render(Decision(False, None, (reason,))), cached=False)

    def _remember(self, cache: dict[K, V], key: K, value: V) -> None:
        if len(cache) >= self._max_entries:
            cache.clear()
        cache[key] = value

    def clear(self) -> None:
        """Forget every cached answer and token (tests; never needed for correctness)."""
        self._entries = {}
        self._tokens = {}


def _stamp(row: Any) -> _Stamp:
    """The cache's stamp from a row of :data:`_VERSION`: the version and the log's size.

    The log's size too: a database restored from an older copy under running servers
    can climb back to a version number they cached at. With the size in the stamp,
    ordinary writes (each a leaf) make that a rolled-back or forked log, which the log
    guard refuses; only writes that also bypass the log could still meet an old stamp,
    so servers are restarted after a restore (docs/api.md).
    """
    if row is None or row[0] is None or row[1] is None:
        raise _not_migrated()
    return int(row[0]), int(row[1])


def _not_migrated() -> RegistryUnavailable:
    # Only a database without the version or the audit log's state row.
    return RegistryUnavailable(
        "the registry database has no registry version; run its migrations (upgrade head)"
    )

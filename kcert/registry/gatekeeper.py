"""The gate's fast path: authentication and a cached decision for one short database read.

Every state change that can alter a gate answer or a token (a certificate
stored or revoked, a key trusted or revoked, a target reported, a promotion
granted, denied or suspended, a token made or revoked) appends a leaf to the
audit log in the transaction that makes it (:func:`kcert.registry.audit.record_event`),
and every append raises the log's size. The size is therefore the registry's
version: it changes exactly when the recorded state may have, it commits with
the change, and it is visible to every process on the database.

Per request, :class:`Gatekeeper` reads the current version, always after the
request arrived. When it holds both an answer for (kernel, target) and the
presented token's row, each read at that version, that one read is all: the
answer is reused, and the token is checked again (scope, revocation, and its
expiry against the clock). Anything else takes one indexed query that returns
the version, the token's row, the target and the promotion together, and a
second for the kernel's certificates when the answer must be computed. So a
revocation, a drift or a suspension changes the very next answer, whichever
process made it; there is no time-based staleness. On PostgreSQL concurrent
requests share version reads (:class:`SharedReads`), each only one sent after
it arrived. Reads run on the driver's own cursor over read-only connections
of the gate's own (:mod:`kcert.registry.fastread`: the registry's Core
statements compiled once, without SQLAlchemy's per-execute cost or the
pool's pre-ping), and PostgreSQL's round trips are awaited, not blocked on.

A decision computed on a miss reads after the version, in the same snapshot
on SQLite and in later ones on PostgreSQL (read committed, autocommit), so it
is cached under a version no newer than the state it saw: a change committed
in between only makes the entry stale at once, never a stale answer current.
The decision itself is :func:`kcert.registry.decisions.gate_decision` over the
same two reads as :func:`kcert.registry.decisions.gate`: the cache only
remembers its answers.

The gate fails closed when the log is unhealthy (:class:`LogHealth`, the
registry's :class:`kcert.registry.checkpoints.CheckpointGuard`): a version
below a size the log signed (read before the version, so never a false
alarm) or an inconsistency the guard found makes every answer a deny, in
memory, without a read of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import anyio
from sqlalchemy import Engine, and_, bindparam
from sqlalchemy import select as sa_select

from kcert.digest import Digest
from kcert.registry.decisions import candidates_statement, gate_decision, needs_environment
from kcert.registry.errors import RegistryUnavailable
from kcert.registry.fastread import CompiledRead, one_or_none, read_connections
from kcert.registry.log_models import LOG_STATE_ID, LogState
from kcert.registry.models import ApiToken, Promotion, Scope, Target, utcnow
from kcert.registry.policy import Decision
from kcert.registry.tokens import (
    TokenRecord,
    hash_token,
    presented_hash,
    principal_of,
)

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

#: Distinct (kernel, target) answers kept per process before the cache starts over.
MAX_ENTRIES = 65_536

_state = LogState.__table__  # type: ignore[attr-defined]
_token = ApiToken.__table__  # type: ignore[attr-defined]
_target = Target.__table__  # type: ignore[attr-defined]
_promotion = Promotion.__table__  # type: ignore[attr-defined]

#: In one round trip: the version, the presented token's row, and what the gate needs of
#: the target and of the (kernel, target) promotion (:func:`decisions.gate_decision`). The
#: state row always exists, so the outer joins answer exactly one row (each joined key
#: is unique) whether or not the token, the target or the promotion exist.
_VERSION_TOKEN_TARGET = (
    sa_select(
        _state.c.size,
        _token.c.id,
        _token.c.token_hash,
        _token.c.scopes,
        _token.c.expires_at,
        _token.c.revoked_at,
        _target.c.hw_class,
        _target.c.fingerprint,
        _target.c.drift_fields,
        _promotion.c.status,
        _promotion.c.suspend_reason,
    )  # fmt: skip
    .select_from(
        _state.outerjoin(_token, _token.c.token_hash == bindparam("token_hash"))
        .outerjoin(_target, _target.c.name == bindparam("target"))
        .outerjoin(
            _promotion,
            and_(
                _promotion.c.target_name == _target.c.name,
                _promotion.c.kernel == bindparam("kernel"),
            ),
        )
    )
    .where(_state.c.id == LOG_STATE_ID)
)


#: The registry's version alone: what a cached answer needs checked.
_VERSION = sa_select(_state.c.size).where(_state.c.id == LOG_STATE_ID)


class LogHealth(Protocol):
    """The log's own guard (:class:`kcert.registry.checkpoints.CheckpointGuard`), in memory."""

    def floor(self) -> int:
        """A size the log has signed; read before the database's version."""
        ...

    def needs_verifying(self, version: int) -> bool:
        """Whether the tree at ``version`` is larger than any proved consistent (no I/O)."""
        ...

    def verify(self) -> None:
        """Prove the database's tree extends the last signed checkpoint (blocking I/O)."""
        ...

    def refusal(self, version: int, floor: int) -> str | None:
        """Why no gate may allow at ``version``, or ``None``."""
        ...


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """A gate answer as the caller rendered it, and whether it came from the cache."""

    rendered: T
    cached: bool


class SharedReads:
    """Concurrent callers share reads of one value, each only a read sent after it asked.

    At most one read is in flight. A caller that asks while one is in flight
    waits for the next, which starts when that one ends and serves everyone
    who asked meanwhile: under load one database round trip answers many
    requests, and still no caller gets a value read before it asked (so a
    change committed before a request arrived is always seen by it). State
    belongs to one event loop; a new loop starts afresh.
    """

    def __init__(self, fetch: Callable[[], Awaitable[int]]) -> None:
        self._fetch = fetch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next: asyncio.Future[int] | None = None
        self._running: asyncio.Task[None] | None = None

    async def get(self) -> int:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._next, self._running = loop, None, None
        if self._next is None:
            self._next = loop.create_future()
        waiting = self._next
        if self._running is None:
            self._running = loop.create_task(self._rounds())
        # Shielded: one caller going away (a client that hung up) must not cancel the
        # read the others wait for.
        return await asyncio.shield(waiting)

    async def _rounds(self) -> None:
        try:
            while self._next is not None:
                # Everyone waiting now asked before this read is sent; later callers join
                # the next round.
                current, self._next = self._next, None
                try:
                    current.set_result(await self._fetch())
                except Exception as exc:
                    current.set_exception(exc)
                except BaseException:  # this task cancelled (the loop is closing)
                    current.cancel()
                    raise
        finally:
            self._running = None


class Gatekeeper(Generic[T]):
    """Gate answers for one database, cached per process and checked against its version.

    ``render`` turns a :class:`Decision` into what the caller serves (the API
    renders the JSON bytes once, so a cache hit serializes nothing). Entries
    are immutable ``(version, value)`` pairs replaced whole, and each database
    session has a connection of its own (:mod:`kcert.registry.fastread`).
    """

    def __init__(
        self, engine: Engine, *, admin_token: str | None, render: Callable[[Decision], T],
        max_entries: int = MAX_ENTRIES, health: LogHealth | None = None,
    ) -> None:  # fmt: skip
        self._health = health
        self._reads = read_connections(engine)
        self._version_read = CompiledRead(_VERSION, engine.dialect)
        self._hot = CompiledRead(_VERSION_TOKEN_TARGET, engine.dialect)
        self._candidates = {
            flag: CompiledRead(candidates_statement(environment=flag), engine.dialect)
            for flag in (False, True)
        }
        # SQLite reads run on the loop without yielding, so no request can arrive during
        # one: nothing to share. PostgreSQL's round trips are awaited, and shared.
        self._shared = SharedReads(self._version) if engine.dialect.name != "sqlite" else None
        self._admin_hash = hash_token(admin_token) if admin_token else None
        self._render = render
        self._max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[int, T]] = {}
        #: Known tokens' rows by hash, with the version they were read at.
        self._tokens: dict[str, tuple[int, TokenRecord]] = {}
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
        key = (str(Digest.parse(kernel)), target)
        # Before any read: a size the log signed. A version below it is a rolled-back database.
        floor = self._health.floor() if self._health else 0
        entry = self._entries.get(key)
        known = self._tokens.get(presented)
        if entry is not None and known is not None:
            # Both cached: the version alone says whether they still hold. Every change to
            # a token bumps it too, so the token's row is current when the version is.
            version = await (self._shared.get() if self._shared else self._version())
            if entry[0] == version and known[0] == version:
                self._authorize(presented, known[1])
                refused = await self._refused(version, floor)
                if refused is not None:
                    return refused
                self.hits += 1
                return Answer(entry[1], cached=True)
        return await self._compute(presented, key, floor)

    async def _refused(self, version: int, floor: int) -> Answer[T] | None:
        """A deny when the log is unhealthy or unproved: the gate fails closed (never cached).

        A tree larger than any the guard proved (someone wrote since) is proved
        first, off the event loop: the gate never allows from a tree that may
        be a fork padded past the signed size. Reads that find no new entry
        cost nothing here.
        """
        if self._health is None:
            return None
        if self._health.needs_verifying(version):
            await anyio.to_thread.run_sync(self._health.verify)
        reason = self._health.refusal(version, floor)
        if reason is None:
            return None
        return Answer(self._render(Decision(False, None, (reason,))), cached=False)

    async def _version(self) -> int:
        async with self._reads.session() as reader:
            row = await one_or_none(reader, self._version_read, {})
        if row is None:
            raise _not_migrated()
        return int(row.size)

    def _authorize(self, presented: str, record: TokenRecord | None) -> None:
        principal_of(presented, self._admin_hash, record, now=utcnow()).require(Scope.GATE_READ)

    async def _compute(self, presented: str, key: tuple[str, str], floor: int) -> Answer[T]:
        """The version, the token's row and the target in one read; the decision if needed."""
        kernel, target = key
        params = {"token_hash": presented, "target": target, "kernel": kernel}
        async with self._reads.session() as reader:
            row = await one_or_none(reader, self._hot, params)
            if row is None:
                raise _not_migrated()
            version = int(row.size)
            record = (
                TokenRecord(
                    row.id, row.token_hash, tuple(row.scopes), row.expires_at, row.revoked_at
                )  # fmt: skip
                if row.id is not None
                else None
            )
            self._authorize(presented, record)
            if record is not None:  # unknown tokens are not kept: guessing fills no cache
                self._remember(self._tokens, presented, (version, record))
            refused = await self._refused(version, floor)
            if refused is not None:
                return refused
            entry = self._entries.get(key)
            if entry is not None and entry[0] == version:
                self.hits += 1
                return Answer(entry[1], cached=True)
            # Read after the version: the decision sees the state at `version` (SQLite: the
            # same snapshot) or a newer one (PostgreSQL), never an older one.
            statement = self._candidates[needs_environment(row)]
            candidates = await reader.all(statement, {"kernel": kernel})
        self.misses += 1
        decision = gate_decision(kernel=kernel, target=target, row=row, candidates=candidates)
        rendered = self._render(decision)
        self._remember(self._entries, key, (version, rendered))
        return Answer(rendered, cached=False)

    def _remember(self, cache: dict[K, V], key: K, value: V) -> None:
        if len(cache) >= self._max_entries:
            cache.clear()
        cache[key] = value

    def clear(self) -> None:
        """Forget every cached answer and token (tests; never needed for correctness)."""
        self._entries = {}
        self._tokens = {}

    def close(self) -> None:
        """Close the gate's database connections (at shutdown)."""
        self._reads.close()


def _not_migrated() -> RegistryUnavailable:
    # Only a database without the audit log's state row.
    return RegistryUnavailable(
        "the registry database has no audit log; run its migrations (upgrade head)"
    )

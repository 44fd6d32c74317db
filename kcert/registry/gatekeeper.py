"""The gate's fast path: authentication and a cached decision for one short database read.

Every state change that can alter a gate answer or a token (a certificate
stored or revoked, a key trusted or revoked, a target reported, a promotion
granted, denied or suspended, a token made or revoked) appends a leaf to the
audit log in the transaction that makes it (:func:`kcert.registry.audit.record_event`),
and every append raises the log's size. The size is therefore the registry's
version: it changes exactly when the recorded state may have, it commits with
the change, and it is visible to every process on the database.

Per request, :class:`Gatekeeper` runs one indexed query that returns the
version and the presented token's row together. A decision for (kernel,
target) is reused only while the version it was computed at is still the
current one, so a revocation, a drift or a suspension changes the very next
answer, whichever process made it; there is no time-based staleness. Token
revocation bumps the version too, but the token's row is read on every request
anyway, and its expiry is compared with the clock on every request.

A decision computed on a miss reads after the version, in the same snapshot
on SQLite and in later ones on PostgreSQL (read committed, autocommit), so it
is cached under a version no newer than the state it saw: a change committed
in between only makes the entry stale at once, never a stale answer current.
The decision itself is :func:`kcert.registry.decisions.gate_on`, the same path
as :func:`kcert.registry.decisions.gate`: the cache only remembers its answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import Engine, and_, bindparam
from sqlalchemy import select as sa_select

from kcert.digest import Digest
from kcert.registry.db import read_only
from kcert.registry.decisions import gate_on
from kcert.registry.errors import RegistryUnavailable
from kcert.registry.log_models import LOG_STATE_ID, LogState
from kcert.registry.models import ApiToken, Promotion, Scope, Target, utcnow
from kcert.registry.policy import Decision
from kcert.registry.tokens import (
    Principal,
    TokenRecord,
    hash_token,
    presented_hash,
    principal_of,
)

T = TypeVar("T")

#: Distinct (kernel, target) answers kept per process before the cache starts over.
MAX_ENTRIES = 65_536

_state = LogState.__table__  # type: ignore[attr-defined]
_token = ApiToken.__table__  # type: ignore[attr-defined]
_target = Target.__table__  # type: ignore[attr-defined]
_promotion = Promotion.__table__  # type: ignore[attr-defined]

#: In one round trip: the version, the presented token's row, and what the gate needs of
#: the target and of the (kernel, target) promotion (:func:`decisions.gate_on`). The
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


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """A gate answer as the caller rendered it, and whether it came from the cache."""

    rendered: T
    cached: bool


class Gatekeeper(Generic[T]):
    """Gate answers for one database, cached per process and checked against its version.

    ``render`` turns a :class:`Decision` into what the caller serves (the API
    renders the JSON bytes once, so a cache hit serializes nothing).
    Thread-safe: entries are immutable ``(version, rendered)`` pairs replaced
    whole, so a reader sees either the old pair or the new one.
    """

    def __init__(
        self, engine: Engine, *, admin_token: str | None, render: Callable[[Decision], T],
        max_entries: int = MAX_ENTRIES,
    ) -> None:  # fmt: skip
        if engine.dialect.name == "sqlite":
            # A deferred read transaction: one snapshot for the version and the decision's
            # reads, and the gate never waits for the write lock.
            self._engine = read_only(engine)
        else:
            # PostgreSQL's read committed gives every statement its own snapshot anyway, so
            # a transaction adds nothing here but two round trips (BEGIN, ROLLBACK).
            self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._admin_hash = hash_token(admin_token) if admin_token else None
        self._render = render
        self._max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[int, T]] = {}
        #: Answers served from the cache and computed (approximate under threads; for
        #: tests and diagnostics, never for decisions).
        self.hits = 0
        self.misses = 0

    def answer(self, *, token: str | None, kernel: str, target: str) -> Answer[T]:
        """Authenticate ``token`` (scope ``gate:read``) and answer the gate for (kernel, target).

        Raises :class:`~kcert.registry.errors.Unauthenticated` or
        :class:`~kcert.registry.errors.Forbidden` as the other routes do, and
        :class:`~kcert.digest.DigestError` for a kernel that is not a digest.
        """
        presented = presented_hash(token)
        key = (str(Digest.parse(kernel)), target)
        params = {"token_hash": presented, "target": target, "kernel": key[0]}
        with self._engine.connect() as conn:
            row = conn.execute(_VERSION_TOKEN_TARGET, params).one_or_none()
            if row is None:
                # Only a database without the audit log's state row (not migrated).
                raise RegistryUnavailable(
                    "the registry database has no audit log; run its migrations (upgrade head)"
                )
            record = (
                TokenRecord(
                    row.id, row.token_hash, tuple(row.scopes), row.expires_at, row.revoked_at
                )  # fmt: skip
                if row.id is not None
                else None
            )
            principal: Principal = principal_of(presented, self._admin_hash, record, now=utcnow())
            principal.require(Scope.GATE_READ)
            version = int(row.size)
            entry = self._entries.get(key)
            if entry is not None and entry[0] == version:
                self.hits += 1
                return Answer(entry[1], cached=True)
            self.misses += 1
            # Read after the version: the decision sees the state at `version` (SQLite: the
            # same snapshot) or a newer one (PostgreSQL), never an older one.
            decision = gate_on(conn, kernel=key[0], target=target, row=row)
        rendered = self._render(decision)
        if len(self._entries) >= self._max_entries:
            self._entries = {}
        self._entries[key] = (version, rendered)
        return Answer(rendered, cached=False)

    def clear(self) -> None:
        """Forget every cached answer (tests; never needed for correctness)."""
        self._entries = {}

"""The registry's audit log: append leaves in the caller's transaction, serve proofs.

Every state change calls :func:`record_event` inside the transaction that makes
the change, so a change and its leaf commit or roll back together.

**Leaf format.** A leaf is the RFC 8785 canonical JSON of::

    {"format": "kcert-log-leaf/v1", "index": N, "kind": "<event kind>",
     "payload": {...}, "time": "<RFC 3339 UTC, microseconds>"}

``index`` binds the leaf to its position (a dropped or reordered leaf is named
by the first index that does not match), ``payload`` is the caller's event with
every input needed to re-decide it (for a promotion: the full
``PromotionInputs.to_json()``, the decision and its reasons). The leaf's bytes
are stored exactly as hashed, and served exactly so.

**Order.** The index is allocated by ``UPDATE log_state SET size = size + k
... RETURNING size`` on the one state row. On PostgreSQL the update holds that
row's lock until the transaction ends, so concurrent writers from any number of
processes append one after the other; on SQLite the registry opens write
transactions with ``BEGIN IMMEDIATE``, which serializes them the same way.

**Storage cost.** Each append reads the O(log n) right-edge nodes of the tree,
writes the leaf and the perfect subtrees it completes (two on average); a proof
reads O(log n) nodes in one query.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, TextClause, insert, select, text, update
from sqlalchemy.orm import Session

from kcert.log import merkle
from kcert.log.errors import LogError, LogRangeError
from kcert.log.leaf import build_leaf
from kcert.log.merkle import CompactRange, NodeKey
from kcert.log.note import Checkpoint, Signer, load_or_create_signer
from kcert.registry.log_models import LOG_STATE_ID, LogEntry, LogNode, LogState

#: The most entries one call to :func:`read_entries` returns.
MAX_ENTRIES_PAGE = 1000
#: File name of the log's signing key inside ``KCERT_HOME``.
LOG_KEY_FILE = "log-key.pem"

# The event kinds of docs/log.md ("Leaf types"): every state change is a leaf.
CERTIFICATE_STORED = "certificate.stored"
CERTIFICATE_REVOKED = "certificate.revoked"
#: Signatures by further trusted keys merged into a stored certificate.
CERTIFICATE_COSIGNED = "certificate.cosigned"
#: A certificate's signer was revoked and another key that signed it stands in.
CERTIFICATE_RESIGNED = "certificate.resigned"
CERTIFICATE_INVALIDATED = "certificate.invalidated"
KEY_TRUSTED = "key.trusted"
KEY_REVOKED = "key.revoked"
FINGERPRINT_REPORTED = "target.reported"
PROMOTION_GRANTED = "promotion.granted"
PROMOTION_DENIED = "promotion.denied"
PROMOTION_SUSPENDED = "promotion.suspended"
TOKEN_CREATED = "token.created"
TOKEN_REVOKED = "token.revoked"
#: A target's runtime policy set (what a confirmed mismatch does, the latency limit).
TARGET_POLICY = "target.policy"
#: A runtime mismatch reported by ``kcert.guard``, with what it did (record or suspend).
OBSERVATION_MISMATCH = "observation.mismatch"

_KIND = re.compile(r"^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*$")

_state = LogState.__table__  # type: ignore[attr-defined]
_entry = LogEntry.__table__  # type: ignore[attr-defined]
_node = LogNode.__table__  # type: ignore[attr-defined]


def record_event(session: Session, kind: str, payload: Mapping[str, Any]) -> int:
    """Append one leaf in ``session``'s current transaction; return its index."""
    return record_events(session, [(kind, payload)])[0]


def record_events(session: Session, events: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
    """Append several leaves at once (same transaction, consecutive indices)."""
    if not events:
        return []
    for kind, payload in events:
        if len(kind) > 64 or not _KIND.match(kind):
            raise ValueError(f"event kind {kind!r} is not a dotted lowercase slug")
        if not isinstance(payload, Mapping):
            raise TypeError("an event payload is a JSON object")
    conn = session.connection()
    new_size = conn.execute(
        update(_state)
        .where(_state.c.id == LOG_STATE_ID)
        .values(size=_state.c.size + len(events))
        .returning(_state.c.size)
    ).scalar_one_or_none()
    if new_size is None:
        raise LogError("the registry database has no audit log; run its migrations (upgrade head)")
    first = int(new_size) - len(events)
    edge_keys = CompactRange.edge_keys(first)
    edge = NodeStore(conn).nodes(edge_keys)
    tree = CompactRange(first, [edge[key] for key in edge_keys])
    now = datetime.now(UTC)
    entries: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    for offset, (kind, payload) in enumerate(events):
        leaf = build_leaf(index=first + offset, kind=kind, payload=payload, time=now)
        entries.append(
            {"leaf_index": first + offset, "kind": kind, "leaf": leaf, "recorded_at": now}
        )
        for key, value in tree.append(merkle.leaf_hash(leaf)):
            nodes.append({"level": key.level, "position": key.index, "hash": value})
    conn.execute(insert(_entry), entries)
    conn.execute(insert(_node), nodes)
    return list(range(first, first + len(events)))


@functools.lru_cache(maxsize=256)
def _node_lookup(count: int) -> TextClause:
    """``SELECT`` of ``count`` nodes by primary key, one statement per count (so it is cached).

    An OR of key lookups, not a row-value ``IN``: SQLite scans the whole table
    for ``(level, position) IN (...)`` but searches the primary key once per OR
    term, which is what keeps a read O(log n). Plain SQL text, because building
    the same expression with SQLAlchemy's operators cost more than the query.
    """
    terms = " OR ".join(f"(level = :l{i} AND position = :p{i})" for i in range(count))
    return text(f"SELECT level, position, hash FROM log_node WHERE {terms}")


class NodeStore:
    """Perfect-subtree hashes read from the database; counts what it reads."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        #: Nodes fetched so far (tests use it to show a proof costs O(log n)).
        self.reads = 0
        self.queries = 0

    def nodes(self, keys: Collection[NodeKey]) -> dict[NodeKey, bytes]:
        if not keys:
            return {}
        params: dict[str, int] = {}
        for i, key in enumerate(keys):
            params[f"l{i}"], params[f"p{i}"] = key.level, key.index
        rows = self._conn.execute(_node_lookup(len(keys)), params).all()
        self.queries += 1
        self.reads += len(rows)
        got = {NodeKey(int(level), int(position)): bytes(value) for level, position, value in rows}
        missing = set(keys) - got.keys()
        if missing:
            first = min(missing)
            raise LogError(
                f"the audit log is damaged: node (level {first.level}, position {first.index}) "
                "is missing from the database"
            )
        return got


def log_size(session: Session) -> int:
    size = (
        session.connection()
        .execute(select(_state.c.size).where(_state.c.id == LOG_STATE_ID))
        .scalar_one_or_none()
    )
    if size is None:
        raise LogError("the registry database has no audit log; run its migrations (upgrade head)")
    return int(size)


def root_hash(session: Session, size: int | None = None) -> bytes:
    current = log_size(session)
    size = current if size is None else size
    if not 0 <= size <= current:
        raise LogRangeError(f"size {size} is outside the log (it holds {current} entries)")
    return merkle.root(size, NodeStore(session.connection()))


@dataclass(frozen=True, slots=True)
class LeafRecord:
    index: int
    leaf: bytes


def read_entries(session: Session, start: int, end: int) -> list[LeafRecord]:
    """Leaves ``[start, end)``, at most :data:`MAX_ENTRIES_PAGE` of them.

    ``end`` past the log's size or the page limit is cut short (callers page on
    from the last index they got); an empty or negative range is an error.
    """
    size = log_size(session)
    if start < 0 or end <= start:
        raise LogRangeError(f"entries need 0 <= start < end; got start={start}, end={end}")
    if start >= size:
        raise LogRangeError(f"start {start} is past the end of the log ({size} entries)")
    end = min(end, size, start + MAX_ENTRIES_PAGE)
    rows = (
        session.connection()
        .execute(
            select(_entry.c.leaf_index, _entry.c.leaf)
            .where(_entry.c.leaf_index >= start, _entry.c.leaf_index < end)
            .order_by(_entry.c.leaf_index)
        )
        .all()
    )
    return [LeafRecord(int(index), bytes(leaf)) for index, leaf in rows]


def inclusion_proof(session: Session, index: int, size: int) -> list[bytes]:
    """RFC 9162 inclusion proof of leaf ``index`` in the tree of ``size`` leaves."""
    _check_size(session, size)
    return merkle.inclusion_proof(index, size, NodeStore(session.connection()))


def consistency_proof(session: Session, first: int, second: int) -> list[bytes]:
    """RFC 9162 consistency proof from the tree of ``first`` leaves to that of ``second``."""
    _check_size(session, second)
    return merkle.consistency_proof(first, second, NodeStore(session.connection()))


def _check_size(session: Session, size: int) -> None:
    current = log_size(session)
    if not 0 < size <= current:
        raise LogRangeError(f"tree size {size} is outside 1..{current}, the log's sizes")


def checkpoint(session: Session, signer: Signer) -> Checkpoint:
    """The current size and root under the signer's origin (unsigned)."""
    size = log_size(session)
    return Checkpoint(signer.name, size, merkle.root(size, NodeStore(session.connection())))


def signed_checkpoint(session: Session, signer: Signer) -> str:
    """The current checkpoint as a C2SP signed note."""
    return checkpoint(session, signer).sign(signer)


def log_signer(home: Path, origin: str | None = None) -> Signer:
    """The registry's log key, ``<home>/log-key.pem``, made (mode 600) on first use."""
    return load_or_create_signer(home / LOG_KEY_FILE, origin)

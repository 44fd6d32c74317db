"""Does the log explain the registry's state? Prove the log, fold it, read the tables, compare.

The log is the registry's history: every state change is a leaf written in the
transaction that makes it. So the state the leaves fold to
(:mod:`kcert.registry.history`) must be exactly the state in the tables. This
module reads both in one snapshot and names every difference, by kind:

- ``log``: a leaf that does not hash to what a checkpoint commits to (named by
  its index). Every leaf hash and the tree root are recomputed from the leaves
  and held against the tree the log's nodes store, signed with the log key when
  the caller holds it (what the server serves), and against every further
  signed checkpoint the caller passes (the server's last signed checkpoint, an
  auditor's): folding leaves that were rewritten in place would explain a
  rewritten state;
- ``key``: a key trusted, revoked or with a public key the log does not say;
- ``certificate``: a certificate stored, missing, or signed by another key;
- ``revocation``: a certificate revoked in one and not the other (an
  out-of-band ``UPDATE certificate SET revoked_at = NULL`` is one);
- ``target``: hardware class, fingerprint, drift fields or generation;
- ``promotion``: status or certificate of a (kernel, target) promotion;
- ``stale``: a stale mark (certificate, target, generation) in one only;
- ``token``: an API token created, revoked, with scopes or an expiry the log
  does not say (never its secret or hash: the log holds neither);
- ``history``: a leaf that does not follow from the leaves before it (a
  decision whose recorded inputs are not the state the log had reached);
- ``unverified``: a decision input that could not be checked (a candidate
  whose envelope cannot be read to fingerprint it over a target's drift fields).

Leaves written before migration 0004 name certificates by their old ids; they
are read through ``certificate_alias``, as the migration merged the rows.

Nothing is written. Times are not compared (the log records when it was told,
the tables when they were written), except a token's expiry, which its leaf
records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kcert.log import merkle
from kcert.log.errors import LogError, NoteError, SignatureError
from kcert.log.leaf import LeafError
from kcert.log.merkle import MemoryTree
from kcert.log.monitor import prove_leaves
from kcert.log.note import Checkpoint, Signer, Verifier, open_checkpoint
from kcert.registry import audit
from kcert.registry.errors import LogUnexplained
from kcert.registry.history import (
    FingerprintOf,
    HistoryReplay,
    LoggedState,
    envelope_fingerprints,
    replay_history,
)
from kcert.registry.log_models import LogEntry
from kcert.registry.models import (
    ApiToken,
    Certificate,
    CertificateAlias,
    Promotion,
    StaleCertificate,
    Target,
    TrustedKey,
)

#: On PostgreSQL every statement of the check sees one snapshot (SQLite's read
#: transaction is one already).
_REPEATABLE_READ = {"isolation_level": "REPEATABLE READ"}
#: Leaves read per query while folding the log.
_PAGE = 1000

_certificate = Certificate.__table__  # type: ignore[attr-defined]
_entry = LogEntry.__table__  # type: ignore[attr-defined]
_alias = CertificateAlias.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class StateDifference:
    #: log | key | certificate | revocation | target | promotion | stale | token | history
    #: | unverified
    kind: str
    subject: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "subject": self.subject, "message": self.message}


@dataclass(frozen=True)
class Commitments:
    """Signed checkpoints the log's leaves must hash to, and the key that opens them."""

    #: The log's public key.
    verifier: Verifier
    #: The log's signing key, when the caller holds it: the checkpoint of the
    #: snapshot's tree is signed with it, as the server would serve it.
    signer: Signer | None = None
    #: ``(label, signed note)``: checkpoints signed earlier (the server's last
    #: one, an auditor's); the log must still extend each.
    notes: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True, slots=True)
class StateCheck:
    entries: int
    decisions: int
    differences: list[StateDifference]
    #: The checkpoints every leaf was proved against, by label.
    proved_against: tuple[str, ...] = ()

    @property
    def consistent(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        return {
            "consistent": self.consistent,
            "entries": self.entries,
            "decisions": self.decisions,
            "proved_against": list(self.proved_against),
            "differences": [d.to_json() for d in self.differences],
        }


def check_state(*, session: Session, commitments: Commitments | None = None) -> StateCheck:
    """Prove and fold the whole log and compare it with the tables, in one snapshot of
    ``session``.

    The leaves are always held against the tree root the log's nodes store; with
    ``commitments``, against the checkpoint signed with the log key and every
    signed note given too. Call it on a fresh session: on PostgreSQL it asks for
    a repeatable-read transaction, so a writer committing meanwhile is seen by
    neither side.
    """
    snapshot = {} if session.get_bind().dialect.name == "sqlite" else _REPEATABLE_READ
    connection = session.connection(execution_options=snapshot)
    count = 0
    tree = MemoryTree()

    def entries() -> Iterator[tuple[int, bytes]]:
        nonlocal count
        start = 0
        while True:
            rows = connection.execute(
                select(_entry.c.leaf_index, _entry.c.leaf)
                .where(_entry.c.leaf_index >= start)
                .order_by(_entry.c.leaf_index)
                .limit(_PAGE)
            ).all()
            for index, leaf in rows:
                count += 1
                tree.append(merkle.leaf_hash(bytes(leaf)))
                yield int(index), bytes(leaf)
            if len(rows) < _PAGE:
                return
            start = int(rows[-1][0]) + 1

    rows = connection.execute(select(_alias.c.old_id, _alias.c.certificate_id)).all()
    aliases = {str(old): str(new) for old, new in rows}
    try:
        history = replay_history(
            entries(), fingerprint_of=_envelope_fingerprints(session), aliases=aliases
        )
    except LeafError as exc:
        raise LogUnexplained(f"the log cannot be folded: {exc}") from exc
    differences, proved = _prove(session, tree, commitments)
    differences += [
        StateDifference("history", f"entry {d.index}", str(d)) for d in history.differences
    ]
    differences += [
        StateDifference("unverified", f"entry {d.index}", str(d)) for d in history.unverified
    ]
    differences += compare(history, session)
    return StateCheck(count, history.decisions, differences, proved)


class _SnapshotProofs:
    """Consistency proofs from the log's nodes, in the check's own snapshot."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        return audit.consistency_proof(self._session, first, second)


def _prove(
    session: Session, tree: MemoryTree, commitments: Commitments | None
) -> tuple[list[StateDifference], tuple[str, ...]]:
    """Every leaf (hashed into ``tree``) against the log's checkpoints; the labels proved."""
    differences: list[StateDifference] = []
    size = audit.log_size(session)
    if size != tree.size:
        differences.append(
            StateDifference(
                "log", "size", f"the log counts {size} entries; {tree.size} leaves are stored"
            )
        )
    checkpoints: list[tuple[str, Checkpoint]] = []
    try:
        root = merkle.root(size, audit.NodeStore(session.connection()))
    except LogError as exc:
        differences.append(StateDifference("log", "nodes", exc.diagnostics()))
    else:
        if commitments is not None and commitments.signer is not None:
            signer = commitments.signer
            note = Checkpoint(signer.name, size, root).sign(signer)
            label = "the log's signed checkpoint"
            try:
                checkpoints.append((label, open_checkpoint(note, commitments.verifier)))
            except (SignatureError, NoteError) as exc:
                differences.append(StateDifference("log", "checkpoint", f"{label}: {exc}"))
        else:
            checkpoints.append(("the tree root the log's nodes store", Checkpoint("", size, root)))
    if commitments is not None:
        for label, text in commitments.notes:
            try:
                checkpoints.append((label, open_checkpoint(text, commitments.verifier)))
            except (SignatureError, NoteError) as exc:
                differences.append(StateDifference("log", "checkpoint", f"{label}: {exc}"))
    proved: list[str] = []
    for label, checkpoint in checkpoints:
        findings = prove_leaves(tree, [(label, checkpoint)], _SnapshotProofs(session))
        for finding in findings:
            subject = "tree" if finding.index is None else f"entry {finding.index}"
            differences.append(StateDifference("log", subject, finding.message))
        if not findings:
            proved.append(f"{label} (size {checkpoint.size})")
    return differences, tuple(proved)


def _envelope_fingerprints(session: Session) -> FingerprintOf:
    """Certificates' fingerprints over a target's drift fields, from their stored envelopes."""

    def read(cid: str) -> bytes | None:
        text = (
            session.connection()
            .execute(select(_certificate.c.envelope).where(_certificate.c.id == cid))
            .scalar_one_or_none()
        )
        return None if text is None else str(text).encode("utf-8")

    return envelope_fingerprints(read)


def compare(history: HistoryReplay, session: Session) -> list[StateDifference]:
    """Every difference between the folded ``history`` and the tables ``session`` reads."""
    logged = history.state
    return [
        *_keys(logged, session),
        *_certificates(logged, session),
        *_targets(logged, session),
        *_promotions(logged, session),
        *_stale(logged, session),
        *_tokens(logged, session),
    ]


def _keys(logged: LoggedState, session: Session) -> Iterator[StateDifference]:
    rows = {r.keyid: r for r in session.scalars(select(TrustedKey))}
    for keyid in sorted(rows.keys() | logged.keys.keys()):
        row, key = rows.get(keyid), logged.keys.get(keyid)
        if key is None:
            yield StateDifference(
                "key", keyid, f"key {keyid} is in the database; no entry trusts it"
            )
        elif row is None:
            yield StateDifference(
                "key", keyid, f"key {keyid} is trusted by the log; the database lacks it"
            )
        else:
            if row.public_key != key.public_key:
                yield StateDifference(
                    "key", keyid, f"key {keyid}: the database holds another public key than the log"
                )
            if (row.revoked_at is not None) != key.revoked:
                yield StateDifference(
                    "key",
                    keyid,
                    f"key {keyid} is {_revoked(row.revoked_at is not None)} "
                    f"in the database, {_revoked(key.revoked)} in the log",
                )


def _revoked(flag: bool) -> str:
    return "revoked" if flag else "not revoked"


def _certificates(logged: LoggedState, session: Session) -> Iterator[StateDifference]:
    rows = {r.id: r for r in session.scalars(select(Certificate))}
    for cid in sorted(rows.keys() | logged.certificates.keys()):
        row, cert = rows.get(cid), logged.certificates.get(cid)
        if cert is None:
            yield StateDifference(
                "certificate", cid, f"certificate {cid} is in the database; no entry stores it"
            )
            continue
        if row is None:
            yield StateDifference(
                "certificate", cid, f"certificate {cid} is stored by the log; the database lacks it"
            )
            continue
        for name, have, want in (
            ("signer", row.keyid, cert.keyid), ("verdict", row.verdict, cert.verdict),
            ("hardware class", row.hw_class, cert.hw_class),
            ("fingerprint", row.fingerprint, cert.fingerprint),
        ):  # fmt: skip
            if have != want:
                yield StateDifference(
                    "certificate", cid, f"certificate {cid} {name}: database {have!r}, log {want!r}"
                )
        if (row.revoked_at is not None) != cert.revoked:
            yield StateDifference(
                "revocation",
                cid,
                f"certificate {cid} is "
                f"{_revoked(row.revoked_at is not None)} in the database, "
                f"{_revoked(cert.revoked)} in the log",
            )


def _targets(logged: LoggedState, session: Session) -> Iterator[StateDifference]:
    rows = {r.name: r for r in session.scalars(select(Target))}
    for name in sorted(rows.keys() | logged.targets.keys()):
        row, target = rows.get(name), logged.targets.get(name)
        if target is None:
            yield StateDifference(
                "target", name, f"target {name!r} is in the database; no entry reports it"
            )
            continue
        if row is None:
            yield StateDifference(
                "target", name, f"target {name!r} is reported in the log; the database lacks it"
            )
            continue
        for field, have, want in (
            ("hardware class", row.hw_class, target.hw_class),
            ("fingerprint", row.fingerprint, target.fingerprint),
            ("drift fields", row.drift_fields or None, target.drift_fields),
            ("generation", row.generation, target.generation),
        ):  # fmt: skip
            if have != want:
                yield StateDifference(
                    "target", name, f"target {name!r} {field}: database {have!r}, log {want!r}"
                )


def _promotions(logged: LoggedState, session: Session) -> Iterator[StateDifference]:
    rows = {(r.kernel, r.target_name): r for r in session.scalars(select(Promotion))}
    for key in sorted(rows.keys() | logged.promotions.keys()):
        row, promotion = rows.get(key), logged.promotions.get(key)
        subject = f"{key[0]} on {key[1]!r}"
        if promotion is None:
            yield StateDifference(
                "promotion",
                subject,
                f"promotion of {subject} is in the database; no entry grants it",
            )
            continue
        if row is None:
            yield StateDifference(
                "promotion",
                subject,
                f"promotion of {subject} is granted by the log; the database lacks it",
            )
            continue
        if row.status != promotion.status:
            yield StateDifference(
                "promotion",
                subject,
                f"promotion of {subject} is "
                f"{row.status} in the database, {promotion.status} in the log",
            )
        if row.certificate_id != promotion.certificate:
            yield StateDifference(
                "promotion",
                subject,
                f"promotion of {subject} rests on "
                f"{row.certificate_id} in the database, "
                f"{promotion.certificate} in the log",
            )


def _stale(logged: LoggedState, session: Session) -> Iterator[StateDifference]:
    rows = {
        (r.certificate_id, r.target_name, r.generation)
        for r in session.scalars(select(StaleCertificate))
    }
    for cid, target, generation in sorted(rows ^ logged.stale):
        where = "the database" if (cid, target, generation) in rows else "the log"
        other = "the log" if where == "the database" else "the database"
        yield StateDifference(
            "stale",
            cid,
            f"certificate {cid} is stale for {target!r} from "
            f"generation {generation} in {where}, not in {other}",
        )


def _tokens(logged: LoggedState, session: Session) -> Iterator[StateDifference]:
    """Token rows against the log: id, scopes, expiry, revocation (never a secret or hash)."""
    rows = {r.id: r for r in session.scalars(select(ApiToken))}
    for token_id in sorted(rows.keys() | logged.tokens.keys()):
        row, token = rows.get(token_id), logged.tokens.get(token_id)
        if token is None:
            yield StateDifference(
                "token", token_id, f"token {token_id} is in the database; no entry creates it"
            )
            continue
        if row is None:
            # A token the log knows and the database dropped can do nothing: named all the same.
            yield StateDifference(
                "token", token_id, f"token {token_id} is created by the log; the database lacks it"
            )
            continue
        scopes = tuple(sorted(str(s) for s in row.scopes))
        if scopes != token.scopes:
            yield StateDifference(
                "token",
                token_id,
                f"token {token_id} scopes: database {list(scopes)!r}, log {list(token.scopes)!r}",
            )
        if _instant(row.expires_at) != _instant(token.expires_at):
            yield StateDifference(
                "token",
                token_id,
                f"token {token_id} expires at {_shown(row.expires_at)} in the database, "
                f"{_shown(token.expires_at)} in the log",
            )
        if (row.revoked_at is not None) != token.revoked:
            yield StateDifference(
                "token",
                token_id,
                f"token {token_id} is {_revoked(row.revoked_at is not None)} in the database, "
                f"{_revoked(token.revoked)} in the log",
            )


def _instant(value: datetime | str | None) -> datetime | None:
    """A time as an aware UTC datetime (SQLite hands back naive UTC ones)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _shown(value: datetime | str | None) -> str:
    when = _instant(value)
    return "never" if when is None else when.isoformat()

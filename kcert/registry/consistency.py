"""Does the log explain the registry's state? Fold the log, read the tables, compare.

The log is the registry's history: every state change is a leaf written in the
transaction that makes it. So the state the leaves fold to
(:mod:`kcert.registry.history`) must be exactly the state in the tables. This
module reads both in one snapshot and names every difference, by kind:

- ``key``: a key trusted, revoked or with a public key the log does not say;
- ``certificate``: a certificate stored, missing, or signed by another key;
- ``revocation``: a certificate revoked in one and not the other (an
  out-of-band ``UPDATE certificate SET revoked_at = NULL`` is one);
- ``target``: hardware class, fingerprint, drift fields or generation;
- ``promotion``: status or certificate of a (kernel, target) promotion;
- ``stale``: a stale mark (certificate, target, generation) in one only;
- ``history``: a leaf that does not follow from the leaves before it (a
  decision whose recorded inputs are not the state the log had reached).

Leaves written before migration 0004 name certificates by their old ids; they
are read through ``certificate_alias``, as the migration merged the rows.

Nothing is written. Token rows are not compared (their leaves name the token's
id and scopes only), nor times: the log records when it was told, the tables
when they were written.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kcert.attest.certificate import certificate_id, inspect_envelope, parse_envelope
from kcert.errors import KcertError
from kcert.log.leaf import LeafError
from kcert.registry.environment import fingerprint_over
from kcert.registry.errors import RegistryError
from kcert.registry.history import HistoryReplay, LoggedState, replay_history
from kcert.registry.log_models import LogEntry
from kcert.registry.models import (
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


class LogUnexplained(RegistryError):
    """The log cannot be folded at all (a leaf is missing or unreadable)."""

    kind = "log-unexplained"


@dataclass(frozen=True, slots=True)
class StateDifference:
    kind: str  # key | certificate | revocation | target | promotion | stale | history
    subject: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "subject": self.subject, "message": self.message}


@dataclass(frozen=True, slots=True)
class StateCheck:
    entries: int
    decisions: int
    differences: list[StateDifference]

    @property
    def consistent(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        return {
            "consistent": self.consistent,
            "entries": self.entries,
            "decisions": self.decisions,
            "differences": [d.to_json() for d in self.differences],
        }


def check_state(*, session: Session) -> StateCheck:
    """Fold the whole log and compare it with the tables, in one snapshot of ``session``.

    Call it on a fresh session: on PostgreSQL it asks for a repeatable-read
    transaction, so a writer committing meanwhile is seen by neither side.
    """
    snapshot = {} if session.get_bind().dialect.name == "sqlite" else _REPEATABLE_READ
    connection = session.connection(execution_options=snapshot)
    count = 0

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
    differences = [
        StateDifference("history", f"entry {d.index}", str(d)) for d in history.differences
    ]
    differences += compare(history, session)
    return StateCheck(entries=count, decisions=history.decisions, differences=differences)


def _envelope_fingerprints(session: Session) -> Any:
    """Certificates' fingerprints over a target's drift fields, from their signed envelopes."""

    @functools.lru_cache(maxsize=4096)
    def environment(cid: str) -> tuple[str, dict[str, Any]] | None:
        text = (
            session.connection()
            .execute(select(_certificate.c.envelope).where(_certificate.c.id == cid))
            .scalar_one_or_none()
        )
        if text is None:
            return None
        try:
            envelope = parse_envelope(text.encode("utf-8"))
            contents = inspect_envelope(envelope)
        except KcertError:
            return None
        if str(certificate_id(envelope)) != cid:
            return None
        fields = contents.predicate.get("environment", {}).get("fields", {})
        return str(contents.fingerprint), dict(fields)

    def fingerprint_of(cid: str, drift_fields: Sequence[str]) -> str | None:
        found = environment(cid)
        return None if found is None else fingerprint_over(found[0], found[1], drift_fields)

    return fingerprint_of


def compare(history: HistoryReplay, session: Session) -> list[StateDifference]:
    """Every difference between the folded ``history`` and the tables ``session`` reads."""
    logged = history.state
    return [
        *_keys(logged, session),
        *_certificates(logged, session),
        *_targets(logged, session),
        *_promotions(logged, session),
        *_stale(logged, session),
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

"""Targets (named fleets): what they report, how they drift, and what drift invalidates.

A report carries the fleet's hardware class and environment; the registry
derives the fingerprint from the target's drift fields. When the hardware,
the fingerprint or the drift fields change, in one transaction:

- the new state is appended to the target's history;
- every certificate that was valid for the target and no longer is gets a
  stale mark (and a log leaf);
- every active promotion on the target left without a valid certificate is
  suspended (and logged with the inputs that decided it).

Every answer is built inside the transaction, before its commit: nothing is
committed that the answer then fails to describe.

Concurrent reports queue on the registry's write lock, taken before anything
is read (:mod:`kcert.registry.db`, "Lock order"), so no report overwrites
another unseen, and none deadlocks with a revocation or a promotion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from kcert.digest import Digest, DigestError
from kcert.registry import audit
from kcert.registry.decisions import lock_target, recheck_promotions
from kcert.registry.environment import (
    certificate_fingerprint,
    normalized_drift_fields,
    target_fingerprint,
)
from kcert.registry.errors import InvalidInput, NotFound
from kcert.registry.models import (
    MAX_ENVIRONMENT_FIELDS,
    Certificate,
    Promotion,
    PromotionStatus,
    StaleCertificate,
    StaleCertificatePublic,
    Target,
    TargetCreate,
    TargetHistory,
    TargetHistoryPublic,
    TargetPublic,
    TargetReported,
    TrustedKey,
    as_utc,
    utcnow,
)
from kcert.registry.policy import (
    CERTIFICATE_VALID,
    Candidate,
    PromotionInputs,
    evaluate,
)


def report_target(*, session: Session, name: str, report: TargetCreate) -> TargetReported:
    """Create or re-report target ``name``; apply drift if its state changed."""
    if len(report.environment) > MAX_ENVIRONMENT_FIELDS:
        raise InvalidInput(
            f"the environment has {len(report.environment)} fields; at most "
            f"{MAX_ENVIRONMENT_FIELDS} are accepted"
        )
    drift_fields = normalized_drift_fields(report.drift_fields)
    new_fp = target_fingerprint(report.environment, drift_fields)
    try:
        # Checked before any write: the log records this digest of the whole environment.
        Digest.of_json(dict(report.environment))
    except DigestError as exc:
        raise InvalidInput(f"the environment cannot be recorded: {exc.diagnostics()}") from exc
    target = lock_target(session, name)
    if target is None:
        target = _create(session, name, report, drift_fields, new_fp)
        if target is not None:
            reported = target_reported(
                session, target, created=True, changed=True, stale=[], suspended=[]
            )
            session.commit()
            return reported
        # Another writer created it first: re-read it under its lock and carry on.
        target = lock_target(session, name)
        assert target is not None
    old_hw, old_fp, old_fields = target.hw_class, target.fingerprint, target.drift_fields
    changed = (old_hw, old_fp, old_fields) != (report.hw_class, new_fp, drift_fields)
    now = utcnow()
    target.environment = dict(report.environment)
    target.updated_at = now
    if not changed:
        audit.record_event(session, audit.FINGERPRINT_REPORTED, _report_payload(target, old_fp))
        session.add(target)
        reported = target_reported(
            session, target, created=False, changed=False, stale=[], suspended=[]
        )
        session.commit()
        return reported
    before = _valid_certificates(session, target)
    target.hw_class, target.fingerprint, target.drift_fields = report.hw_class, new_fp, drift_fields
    target.generation += 1
    session.add(target)
    session.add(_history(target))
    audit.record_event(session, audit.FINGERPRINT_REPORTED, _report_payload(target, old_fp))
    session.flush()
    after = {c.id for c in _valid_certificates(session, target)}
    stale = [c for c in before if c.id not in after]
    for cert in stale:
        session.add(
            StaleCertificate(
                certificate_id=cert.id, target_name=name, generation=target.generation,
                old_fingerprint=old_fp, new_fingerprint=new_fp, marked_at=now,
            )
        )  # fmt: skip
        audit.record_event(
            session,
            audit.CERTIFICATE_INVALIDATED,
            {
                "certificate": cert.id,
                "target": name,
                "generation": target.generation,
                "old_fingerprint": old_fp,
                "new_fingerprint": new_fp,
                "old_hw_class": old_hw,
                "new_hw_class": target.hw_class,
            },
        )
    active = session.exec(
        select(Promotion)
        .where(Promotion.target_name == name, Promotion.status == PromotionStatus.ACTIVE)
        .order_by(col(Promotion.id))
    ).all()
    suspended = recheck_promotions(session, active, cause=f"target {name!r} drifted")
    reported = target_reported(
        session, target, created=False, changed=True, stale=[c.id for c in stale],
        suspended=[s.kernel for s in suspended],
    )  # fmt: skip
    session.commit()
    return reported


def get_target(*, session: Session, name: str) -> TargetPublic:
    target = session.get(Target, name)
    if target is None:
        raise NotFound(f"no target {name!r}; report it first with `kcert target report`")
    return target_public(session, target)


def target_public(session: Session, target: Target) -> TargetPublic:
    return TargetPublic(**_public_fields(session, target))


def target_reported(
    session: Session, target: Target, *, created: bool, changed: bool, stale: Sequence[str],
    suspended: Sequence[str],
) -> TargetReported:  # fmt: skip
    return TargetReported(
        **_public_fields(session, target),
        created=created,
        changed=changed,
        stale_certificates=list(stale),
        suspended_promotions=list(suspended),
    )


def _public_fields(session: Session, target: Target) -> dict[str, Any]:
    # lazy: kcert.certify.environment (GPU probing) stays out of the server's imports
    from kcert.certify.environment import default_drift_fields

    history = session.exec(
        select(TargetHistory)
        .where(TargetHistory.target_name == target.name)
        .order_by(col(TargetHistory.id))
    ).all()
    stale = session.exec(
        select(StaleCertificate)
        .where(StaleCertificate.target_name == target.name)
        .order_by(col(StaleCertificate.id))
    ).all()
    return {
        "name": target.name,
        "hw_class": target.hw_class,
        "fingerprint": target.fingerprint,
        "drift_fields": list(target.drift_fields or default_drift_fields(target.environment)),
        "environment": dict(target.environment),
        "generation": target.generation,
        "created_at": as_utc(target.created_at),
        "updated_at": as_utc(target.updated_at),
        "history": [
            TargetHistoryPublic(
                generation=h.generation,
                hw_class=h.hw_class,
                fingerprint=h.fingerprint,
                drift_fields=h.drift_fields,
                reported_at=as_utc(h.reported_at),
            )  # fmt: skip
            for h in history
        ],
        "stale": [
            StaleCertificatePublic(
                certificate_id=s.certificate_id,
                generation=s.generation,
                old_fingerprint=s.old_fingerprint,
                new_fingerprint=s.new_fingerprint,
                marked_at=as_utc(s.marked_at),
            )  # fmt: skip
            for s in stale
        ],
    }


def _create(
    session: Session, name: str, report: TargetCreate, drift_fields: list[str] | None,
    fingerprint: str,
) -> Target | None:  # fmt: skip
    """Insert a new target and its first history row, uncommitted; ``None`` if another
    writer won."""
    now = utcnow()
    target = Target(
        name=name, hw_class=report.hw_class, fingerprint=fingerprint, drift_fields=drift_fields,
        environment=dict(report.environment), generation=1, created_at=now, updated_at=now,
    )  # fmt: skip
    try:
        with session.begin_nested():
            session.execute(insert(Target).values(**target.model_dump()))
    except IntegrityError:
        return None
    session.add(_history(target))
    audit.record_event(session, audit.FINGERPRINT_REPORTED, _report_payload(target, None))
    session.flush()
    created = session.get(Target, name)
    assert created is not None
    return created


def _history(target: Target) -> TargetHistory:
    return TargetHistory(
        target_name=target.name, generation=target.generation, hw_class=target.hw_class,
        fingerprint=target.fingerprint, drift_fields=target.drift_fields,
        environment=dict(target.environment), reported_at=target.updated_at,
    )  # fmt: skip


def _report_payload(target: Target, previous: str | None) -> dict[str, Any]:
    return {
        "target": target.name,
        "generation": target.generation,
        "hw_class": target.hw_class,
        "fingerprint": target.fingerprint,
        "previous_fingerprint": previous,
        "drift_fields": target.drift_fields,
        "environment_digest": str(Digest.of_json(dict(target.environment))),
    }


def _valid_certificates(session: Session, target: Target) -> list[Certificate]:
    """Certificates valid for ``target`` in its current state, by the promotion policy's checks."""
    statement = (
        select(Certificate)
        .join(TrustedKey, col(TrustedKey.keyid) == col(Certificate.keyid))
        .where(
            Certificate.hw_class == target.hw_class,
            col(Certificate.revoked_at).is_(None),
            col(TrustedKey.revoked_at).is_(None),
        )
        .order_by(col(Certificate.id))
    )
    if not target.drift_fields:
        # Default drift fields: the stored fingerprint is comparable, and indexed.
        statement = statement.where(Certificate.fingerprint == target.fingerprint)
    rows = session.exec(statement).all()
    valid: list[Certificate] = []
    for cert in rows:
        inputs = PromotionInputs(
            kernel=cert.source_digest, target=target.name, target_hw_class=target.hw_class,
            target_fingerprint=target.fingerprint, trusted_keys=(cert.keyid,), revoked_keys=(),
            revoked_certificates=(), candidates=(),
        )  # fmt: skip
        candidate = Candidate(
            id=cert.id, keyid=cert.keyid, verdict=cert.verdict, hw_class=cert.hw_class,
            fingerprint=certificate_fingerprint(cert, target.drift_fields),
            sandboxed=cert.sandboxed,
        )  # fmt: skip
        if not evaluate(inputs, candidate, CERTIFICATE_VALID):
            valid.append(cert)
    return valid

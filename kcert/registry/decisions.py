"""Promotions and the gate: gather the recorded inputs, run the pure policy, act on it.

:func:`gather_inputs` is the only place that reads the database for a decision;
:func:`kcert.registry.policy.decide_promotion` is the only place that decides.
A promotion decision (granted or denied) is written to the audit log with the
full inputs in the same transaction. The gate reads with indexed lookups only
(subject digest, key ids, target name, the (kernel, target) promotion) and
writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Row, Select, and_, bindparam, update
from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from kcert.digest import Digest
from kcert.registry import audit
from kcert.registry.environment import fingerprint_over
from kcert.registry.errors import InvalidInput, PromotionDenied
from kcert.registry.models import (
    Certificate,
    CertificateSubject,
    Promotion,
    PromotionPublic,
    PromotionStatus,
    Target,
    TrustedKey,
    as_utc,
    utcnow,
)
from kcert.registry.policy import (
    Candidate,
    Decision,
    PromotionInputs,
    PromotionState,
    decide_gate,
    decide_promotion,
)


def lock_target(session: Session, name: str) -> Target | None:
    """The target row, locked for the rest of the transaction (PostgreSQL ``FOR UPDATE``).

    A write session holds the registry's write lock already (see "Lock order" in
    :mod:`kcert.registry.db`), so this row lock is never contended by another writer.
    """
    return session.exec(select(Target).where(Target.name == name).with_for_update()).first()


_certificate = Certificate.__table__  # type: ignore[attr-defined]
_subject = CertificateSubject.__table__  # type: ignore[attr-defined]
_key = TrustedKey.__table__  # type: ignore[attr-defined]
_target = Target.__table__  # type: ignore[attr-defined]
_promotion = Promotion.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class TargetState:
    """What a decision needs of a target."""

    hw_class: str
    fingerprint: str
    drift_fields: list[str] | None

    @classmethod
    def of(cls, target: Target | None) -> TargetState | None:
        if target is None:
            return None
        return cls(target.hw_class, target.fingerprint, target.drift_fields)


def kernel_certificates(session: Session, kernel: str) -> list[Certificate]:
    """Every certificate with ``kernel`` among its subjects, newest first (ties by id)."""
    statement = (
        select(Certificate)
        .join(CertificateSubject, col(CertificateSubject.certificate_id) == col(Certificate.id))
        .where(CertificateSubject.digest == kernel)
        .order_by(col(Certificate.created_at).desc(), col(Certificate.id))
    )
    return list(session.exec(statement).all())


def _candidates_statement(*, environment: bool) -> Select[Any]:
    columns = [
        _certificate.c.id, _certificate.c.keyid, _certificate.c.verdict,
        _certificate.c.hw_class, _certificate.c.fingerprint, _certificate.c.sandboxed,
        _certificate.c.revoked_at,
        _key.c.keyid.label("key_known"), _key.c.revoked_at.label("key_revoked_at"),
    ]  # fmt: skip
    if environment:
        columns.append(_certificate.c.environment)
    return (
        sa_select(*columns)
        .select_from(
            _subject.join(_certificate, _certificate.c.id == _subject.c.certificate_id).outerjoin(
                _key, _key.c.keyid == _certificate.c.keyid
            )
        )
        .where(_subject.c.digest == bindparam("kernel"))
        .order_by(_certificate.c.created_at.desc(), _certificate.c.id)
    )


#: Built once: building a statement costs more than running it (the gate runs these on
#: every deploy), and a prebuilt one is found in SQLAlchemy's compiled cache at once.
_CANDIDATES = {flag: _candidates_statement(environment=flag) for flag in (False, True)}


def _connection(source: Session | Connection) -> Connection:
    return source.connection() if isinstance(source, Session) else source


def _candidate_rows(
    source: Session | Connection, kernel: str, *, environment: bool
) -> Sequence[Row[Any]]:
    """One indexed query: the kernel's certificates (subject index) with their signers' state.

    Core SQL rather than ORM objects: the gate runs this on every deploy.
    """
    return _connection(source).execute(_CANDIDATES[environment], {"kernel": kernel}).all()


def gather_inputs(
    session: Session | Connection, *, kernel: str, target_name: str, target: TargetState | None,
    full_key_set: bool,
) -> PromotionInputs:  # fmt: skip
    """Read what the policy needs for (kernel, target).

    With ``full_key_set`` the inputs name every trusted, unrevoked key (what the
    log records, so an auditor sees the whole trust root); without it, only the
    keys that signed a candidate, which is all the decision depends on and keeps
    the gate to indexed lookups.
    """
    drift_fields = target.drift_fields if target is not None else None
    rows = _candidate_rows(session, kernel, environment=bool(drift_fields))
    trusted_keys = None
    if full_key_set:
        trusted = _connection(session).execute(
            sa_select(_key.c.keyid).where(_key.c.revoked_at.is_(None))
        )
        trusted_keys = tuple(sorted(trusted.scalars()))
    return inputs_from_rows(
        rows, kernel=kernel, target_name=target_name, target=target, trusted_keys=trusted_keys
    )


def inputs_from_rows(
    rows: Iterable[Any], *, kernel: str, target_name: str, target: TargetState | None,
    trusted_keys: tuple[str, ...] | None,
) -> PromotionInputs:  # fmt: skip
    """The policy's inputs from the rows of ``_CANDIDATES`` (pure).

    ``trusted_keys`` ``None`` means: only the keys that signed a candidate.
    """
    rows = list(rows)
    drift_fields = target.drift_fields if target is not None else None
    revoked_keys = tuple(sorted({r.keyid for r in rows if r.key_revoked_at is not None}))
    if trusted_keys is None:
        trusted_keys = tuple(
            sorted({r.keyid for r in rows if r.key_known and r.key_revoked_at is None})
        )
    candidates = tuple(
        Candidate(
            id=r.id,
            keyid=r.keyid,
            verdict=r.verdict,
            hw_class=r.hw_class,
            fingerprint=fingerprint_over(
                r.fingerprint, r.environment if drift_fields else None, drift_fields
            ),
            sandboxed=bool(r.sandboxed),
        )
        for r in rows
    )
    return PromotionInputs(
        kernel=kernel,
        target=target_name,
        target_hw_class=target.hw_class if target is not None else None,
        target_fingerprint=target.fingerprint if target is not None else None,
        trusted_keys=trusted_keys,
        revoked_keys=revoked_keys,
        revoked_certificates=tuple(sorted(r.id for r in rows if r.revoked_at is not None)),
        candidates=candidates,
    )


#: The target and the (kernel, target) promotion in one query (built once, like _CANDIDATES).
_GATE_TARGET = (
    sa_select(
        _target.c.hw_class,
        _target.c.fingerprint,
        _target.c.drift_fields,
        _promotion.c.status,
        _promotion.c.suspend_reason,
    )  # fmt: skip
    .select_from(
        _target.outerjoin(
            _promotion,
            and_(
                _promotion.c.target_name == _target.c.name,
                _promotion.c.kernel == bindparam("kernel"),
            ),
        )  # fmt: skip
    )
    .where(_target.c.name == bindparam("target"))
)


def gate(*, session: Session, kernel: Digest, target: str) -> Decision:
    """May ``kernel`` run on ``target`` now? Read-only; never logs; two indexed queries."""
    kernel_id = str(kernel)
    connection = session.connection()
    row = connection.execute(_GATE_TARGET, {"kernel": kernel_id, "target": target}).first()
    rows = _candidate_rows(connection, kernel_id, environment=needs_environment(row))
    return gate_decision(kernel=kernel_id, target=target, row=row, candidates=rows)


def needs_environment(row: Any) -> bool:
    """Whether the gate's candidates need the certificates' environment column: when the
    target in ``row`` (the columns of ``_GATE_TARGET``) names its own drift fields."""
    state = gate_target(row)
    return state is not None and bool(state.drift_fields)


def gate_target(row: Any) -> TargetState | None:
    """The target in a row with the columns of ``_GATE_TARGET`` (all ``None``, or ``row``
    itself ``None``, when there is no such target)."""
    if row is None or row.hw_class is None:
        return None
    return TargetState(row.hw_class, row.fingerprint, row.drift_fields)


def gate_decision(*, kernel: str, target: str, row: Any, candidates: Iterable[Any]) -> Decision:
    """The gate's decision from its target row and the kernel's candidate rows (pure).

    ``candidates`` are the rows of ``_CANDIDATES``, with the environment column
    exactly when :func:`needs_environment` says so, as :func:`gate` reads them.
    """
    state = gate_target(row)
    inputs = inputs_from_rows(
        candidates, kernel=kernel, target_name=target, target=state, trusted_keys=None
    )
    promotion = (
        PromotionState(status=row.status, reason=row.suspend_reason)
        if state is not None and row.status is not None
        else None
    )
    return decide_gate(inputs, promotion)


def decision_payload(inputs: PromotionInputs, decision: Decision, **extra: Any) -> dict[str, Any]:
    """The audit-log payload of a decision: enough to re-decide it from the leaf alone."""
    return {"inputs": inputs.to_json(), "decision": decision.to_json(), **extra}


def promote(
    *, session: Session, kernel: Digest, target: str, replaces: Digest | None = None
) -> PromotionPublic:
    """Grant (and record) a promotion, or record the denial and raise :class:`PromotionDenied`.

    ``replaces`` names the kernel this one replaces on ``target`` (by default the target's
    active kernel of the same name): with a latency limit in the target's policy, the
    canary's p99 is held against it (policy ``kcert-promotion/3``).
    """
    kernel_id = str(kernel)
    target_row = lock_target(session, target)
    inputs = gather_inputs(
        session, kernel=kernel_id, target_name=target, target=TargetState.of(target_row),
        full_key_set=True,
    )  # fmt: skip
    if replaces is not None and str(replaces) == kernel_id:
        raise InvalidInput("a kernel does not replace itself (--replaces)")
    # lazy: perf loads the latency tables' queries, which only a promotion needs
    from kcert.registry.perf import implied_replaces, latency_inputs

    # Without --replaces the target's active kernel of that name is the yardstick, so a
    # latency limit cannot be skipped by leaving the flag out; the leaf records which.
    old = str(replaces) if replaces is not None else implied_replaces(
        session, target=target, kernel=kernel_id)  # fmt: skip
    if old is not None:
        latency = latency_inputs(session, target=target, kernel=kernel_id, replaces=old,
                                 implied=replaces is None)  # fmt: skip
        inputs = replace(inputs, latency=latency)
    decision = decide_promotion(inputs)
    kind = audit.PROMOTION_GRANTED if decision.allow else audit.PROMOTION_DENIED
    log_index = audit.record_event(session, kind, decision_payload(inputs, decision))
    existing = session.exec(
        select(Promotion).where(Promotion.kernel == kernel_id, Promotion.target_name == target)
    ).first()
    if not decision.allow:
        if existing is not None and existing.status == PromotionStatus.ACTIVE:
            _suspend(session, existing, inputs, decision, cause="promotion denied")
        session.commit()
        raise PromotionDenied(
            f"promotion of {kernel_id} to target {target!r} denied",
            reasons=decision.reasons,
            log_index=log_index,
        )
    assert target_row is not None and decision.certificate is not None  # allow implies both
    now = utcnow()
    if existing is None:
        existing = Promotion(kernel=kernel_id, target_name=target, status="", certificate_id="")
    existing.status = PromotionStatus.ACTIVE
    existing.certificate_id = decision.certificate
    existing.granted_at = now
    existing.suspended_at = None
    existing.suspend_reason = None
    existing.log_index = log_index
    session.add(existing)
    session.commit()
    return promotion_public(existing, reasons=decision.reasons)


def promotion_public(row: Promotion, *, reasons: Sequence[str] = ()) -> PromotionPublic:
    return PromotionPublic(
        kernel=row.kernel,
        target=row.target_name,
        status=PromotionStatus(row.status),
        certificate=row.certificate_id,
        granted_at=as_utc(row.granted_at),
        suspended_at=as_utc(row.suspended_at) if row.suspended_at else None,
        suspend_reason=row.suspend_reason,
        reasons=list(reasons),
        log_index=row.log_index,
    )


def list_promotions(*, session: Session, target: str | None = None) -> list[PromotionPublic]:
    statement = select(Promotion).order_by(col(Promotion.target_name), col(Promotion.kernel))
    if target is not None:
        statement = statement.where(Promotion.target_name == target)
    return [promotion_public(p) for p in session.exec(statement).all()]


@dataclass(frozen=True, slots=True)
class Suspension:
    kernel: str
    target: str
    log_index: int


def recheck_promotions(
    session: Session, promotions: Iterable[Promotion], *, cause: str
) -> list[Suspension]:
    """Suspend each active promotion that no longer has a valid certificate; log each.

    Called inside the transaction of a drift report or a revocation, after the
    change is written, so the inputs read here are the new state.
    """
    suspended: list[Suspension] = []
    targets: dict[str, TargetState | None] = {}
    for promotion in promotions:
        if promotion.status != PromotionStatus.ACTIVE:
            continue
        name = promotion.target_name
        if name not in targets:
            targets[name] = TargetState.of(session.get(Target, name))
        inputs = gather_inputs(
            session, kernel=promotion.kernel, target_name=name, target=targets[name],
            full_key_set=True,
        )  # fmt: skip
        decision = decide_promotion(inputs)
        if decision.allow:
            continue
        index = _suspend(session, promotion, inputs, decision, cause=cause)
        suspended.append(Suspension(kernel=promotion.kernel, target=name, log_index=index))
    return suspended


def promotions_of_kernels(session: Session, kernels: Iterable[str]) -> list[Promotion]:
    wanted = sorted(set(kernels))
    if not wanted:
        return []
    return list(
        session.exec(
            select(Promotion)
            .where(col(Promotion.kernel).in_(wanted), Promotion.status == PromotionStatus.ACTIVE)
            .order_by(col(Promotion.id))
        ).all()
    )


def subjects_of(session: Session, certificate_ids: Iterable[str]) -> list[str]:
    wanted = sorted(set(certificate_ids))
    if not wanted:
        return []
    rows = session.exec(
        select(CertificateSubject.digest).where(col(CertificateSubject.certificate_id).in_(wanted))
    ).all()
    return sorted(set(rows))


def _suspend(
    session: Session, promotion: Promotion, inputs: PromotionInputs, decision: Decision,
    *, cause: str,
) -> int:  # fmt: skip
    index = audit.record_event(
        session,
        audit.PROMOTION_SUSPENDED,
        decision_payload(
            inputs, decision, kernel=promotion.kernel, target=promotion.target_name, cause=cause
        ),
    )
    session.execute(
        update(Promotion)
        .where(col(Promotion.id) == promotion.id)
        .values(status=PromotionStatus.SUSPENDED, suspended_at=utcnow(), suspend_reason=cause)
    )
    session.refresh(promotion)
    return index

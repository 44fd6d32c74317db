"""Runtime reports from ``kcert.guard``: checked, stored, logged, and acted on.

:func:`record_observations` takes one batch (``POST /v1/observations``). It
checks every report before it writes anything, so a batch is taken whole or
not at all: the target and the certificate must exist, the certificate must
name the kernel, a report with mismatches must be about a kernel the target
promoted, and every evidence array must anchor to what its mismatch names.
Then, in the write transaction, each report is stored once (the same report
sent again is counted as a duplicate and changes nothing), its latency
histogram feeds the perf store, and each mismatch is a log leaf
(``observation.mismatch``) recording the inputs of its action and the action
(:func:`kcert.registry.runtime_policy.decide_mismatch`). A suspension updates
the promotion in the same transaction, so the gate's next answer denies.

Target policies (:func:`set_target_policy`) are logged as ``target.policy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlmodel import Session, col, select

from kcert.digest import Digest, DigestError
from kcert.registry import audit
from kcert.registry.errors import InvalidInput, NotFound
from kcert.registry.evidence import (
    DecodedEvidence,
    decode_evidence,
    encode_arrays,
    manifest_bytes,
)
from kcert.registry.models import (
    Certificate,
    CertificateAlias,
    CertificateSubject,
    Promotion,
    PromotionStatus,
    Target,
    as_utc,
    utcnow,
)
from kcert.registry.observation_models import (
    LatencyHistogramRow,
    MismatchPublic,
    MismatchReport,
    ObservationBatch,
    ObservationMismatch,
    ObservationReport,
    ObservationReportRow,
    ObservationsAccepted,
    TargetPolicy,
    TargetPolicyPublic,
    TargetPolicyUpdate,
)
from kcert.registry.runtime_policy import RUNTIME_MISMATCH, MismatchInputs, decide_mismatch

#: Evidence per mismatch, unless ``KCERT_OBSERVATION_EVIDENCE_MAX`` says otherwise.
DEFAULT_EVIDENCE_MAX = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Checked:
    report: ObservationReport
    kernel: str
    certificate: str
    digest: str
    evidence: list[DecodedEvidence | None]


def _check(session: Session, report: ObservationReport, where: str,
           max_evidence_bytes: int) -> _Checked:  # fmt: skip
    try:
        kernel = str(Digest.parse(report.kernel))
        named = str(Digest.parse(report.certificate))
    except DigestError as exc:
        raise InvalidInput(f"{where}: {exc.diagnostics()}") from exc
    if session.get(Target, report.target) is None:
        raise NotFound(f"{where}: no target {report.target!r}")
    certificate = named if session.get(Certificate, named) is not None else None
    if certificate is None:
        alias = session.get(CertificateAlias, named)
        if alias is None:
            raise NotFound(f"{where}: no certificate {named}")
        certificate = alias.certificate_id
    if session.get(CertificateSubject, (kernel, certificate)) is None:
        raise InvalidInput(f"{where}: certificate {certificate} does not certify kernel {kernel}")
    if report.mismatches and _promotion(session, kernel, report.target) is None:
        raise InvalidInput(
            f"{where}: target {report.target!r} never promoted kernel {kernel}; the registry "
            "takes mismatches only for promoted kernels"
        )
    evidence = [
        decode_evidence(m, max_bytes=max_evidence_bytes, where=f"{where}, mismatches[{i}]")
        for i, m in enumerate(report.mismatches)
    ]
    digest = str(Digest.of_json(report.model_dump(mode="json")))
    return _Checked(report, kernel, certificate, digest, evidence)


def _promotion(session: Session, kernel: str, target: str) -> Promotion | None:
    return session.exec(
        select(Promotion).where(Promotion.kernel == kernel, Promotion.target_name == target)
    ).first()


def record_observations(
    *, session: Session, batch: ObservationBatch, max_evidence_bytes: int = DEFAULT_EVIDENCE_MAX
) -> ObservationsAccepted:
    """Check the whole batch, then store it and act on its mismatches (one transaction)."""
    checked = [
        _check(session, report, f"reports[{i}]", max_evidence_bytes)
        for i, report in enumerate(batch.reports)
    ]
    accepted = duplicates = logged = 0
    suspended: list[str] = []
    ids: list[int] = []
    seen: set[str] = set()
    for item in checked:
        exists = session.exec(
            select(ObservationReportRow.id).where(ObservationReportRow.digest == item.digest)
        ).first()
        if exists is not None or item.digest in seen:
            duplicates += 1
            continue
        seen.add(item.digest)
        row = _store_report(session, item)
        accepted += 1
        for mismatch, evidence in zip(item.report.mismatches, item.evidence, strict=True):
            stored = _record_mismatch(session, item, row, mismatch, evidence)
            logged += 1
            assert stored.id is not None
            ids.append(stored.id)
            if stored.suspended and item.report.target not in suspended:
                suspended.append(item.report.target)
    session.commit()
    return ObservationsAccepted(accepted=accepted, duplicates=duplicates,
                                mismatches_logged=logged, suspended=suspended,
                                mismatch_ids=ids)  # fmt: skip


def _store_report(session: Session, item: _Checked) -> ObservationReportRow:
    report = item.report
    row = ObservationReportRow(
        digest=item.digest, kernel=item.kernel, target_name=report.target,
        certificate_id=item.certificate, window_start=report.window.start,
        window_end=report.window.end, calls_seen=report.calls_seen,
        calls_checked=report.calls_checked, dropped=report.dropped,
        out_of_scope=report.out_of_scope,
    )  # fmt: skip
    session.add(row)
    session.flush()
    assert row.id is not None
    if report.latency is not None and any(report.latency.counts):
        session.add(LatencyHistogramRow(
            report_id=row.id, kernel=item.kernel, target_name=report.target,
            bounds=list(report.latency.bounds), counts=list(report.latency.counts),
        ))  # fmt: skip
    return row


def _record_mismatch(
    session: Session, item: _Checked, row: ObservationReportRow, mismatch: MismatchReport,
    evidence: DecodedEvidence | None,
) -> ObservationMismatch:  # fmt: skip
    target = item.report.target
    promotion = _promotion(session, item.kernel, target)
    policy = session.get(TargetPolicy, target)
    # A mismatch that anchors no input and no output holds nothing to re-run: with an empty
    # evidence map it would otherwise be "confirmed" and suspend on a guard token alone.
    confirmed = (
        evidence is not None
        and bool(mismatch.inputs)
        and bool(mismatch.outputs)
        and set(mismatch.inputs) <= set(evidence.manifest)
    )
    inputs = MismatchInputs(
        kernel=item.kernel, target=target,
        on_mismatch=policy.on_mismatch if policy is not None else "record",
        promotion=promotion.status if promotion is not None else None, confirmed=confirmed,
    )  # fmt: skip
    decision = decide_mismatch(inputs)
    described = mismatch.model_dump(mode="json", exclude={"evidence", "outputs_evidence"})
    described["evidence"] = evidence.manifest if evidence is not None else None
    described["outputs_evidence"] = evidence.outputs if evidence is not None else None
    described["evidence_digest"] = evidence.digest if evidence is not None else None
    stored = ObservationMismatch(
        report_id=row.id or 0, kernel=item.kernel, target_name=target,
        certificate_id=item.certificate, at=mismatch.at, report=described, confirmed=confirmed,
        suspended=decision.suspend, evidence=evidence.blob if evidence is not None else None,
    )  # fmt: skip
    session.add(stored)
    session.flush()
    index = audit.record_event(session, audit.OBSERVATION_MISMATCH, {
        "mismatch_id": stored.id, "kernel": item.kernel, "target": target,
        "certificate": item.certificate, "report": item.digest, "mismatch": described,
        "inputs": inputs.to_json(), "decision": decision.to_json(),
    })  # fmt: skip
    stored.log_index = index
    session.add(stored)
    if decision.suspend and promotion is not None:
        promotion.status = PromotionStatus.SUSPENDED
        promotion.suspended_at = utcnow()
        promotion.suspend_reason = (
            f"{RUNTIME_MISMATCH}: log entry {index}, max error {mismatch.max_error} "
            f"(evidence: /v1/observations/mismatches/{stored.id}/evidence)"
        )
        session.add(promotion)
    return stored


def get_mismatch(*, session: Session, mismatch_id: int) -> MismatchPublic:
    row = session.get(ObservationMismatch, mismatch_id)
    if row is None:
        raise NotFound(f"no mismatch {mismatch_id}")
    assert row.id is not None
    return MismatchPublic(id=row.id, kernel=row.kernel, target=row.target_name,
                          certificate=row.certificate_id, report=row.report,
                          confirmed=row.confirmed, suspended=row.suspended,
                          log_index=row.log_index)  # fmt: skip


def get_evidence(*, session: Session, mismatch_id: int) -> dict[str, Any]:
    """The evidence as the guard sent it (each array with its anchor), or 404."""
    row = session.get(ObservationMismatch, mismatch_id)
    if row is None:
        raise NotFound(f"no mismatch {mismatch_id}")
    manifest = row.report.get("evidence")
    if manifest is None or row.evidence is None:
        raise NotFound(f"mismatch {mismatch_id} came without evidence (over the size cap)")
    blob = bytes(row.evidence)
    outputs = row.report.get("outputs_evidence")
    return {"mismatch_id": mismatch_id, "log_index": row.log_index,
            "evidence_digest": row.report.get("evidence_digest"),
            "arrays": encode_arrays(manifest, blob),
            "outputs": encode_arrays(outputs, blob, manifest_bytes(manifest))
            if outputs is not None else None}  # fmt: skip


def list_mismatches(*, session: Session, target: str, kernel: str | None = None,
                    limit: int = 100) -> list[MismatchPublic]:  # fmt: skip
    statement = select(ObservationMismatch).where(ObservationMismatch.target_name == target)
    if kernel is not None:
        statement = statement.where(ObservationMismatch.kernel == kernel)
    rows = session.exec(statement.order_by(col(ObservationMismatch.id)).limit(limit)).all()
    return [get_mismatch(session=session, mismatch_id=r.id) for r in rows if r.id is not None]


# --- target policies --------------------------------------------------------------------------


def get_target_policy(*, session: Session, target: str) -> TargetPolicyPublic:
    if session.get(Target, target) is None:
        raise NotFound(f"no target {target!r}")
    row = session.get(TargetPolicy, target)
    if row is None:
        return TargetPolicyPublic(target=target)
    return TargetPolicyPublic(
        target=target, on_mismatch=row.on_mismatch,
        max_p99_regression_pct=row.max_p99_regression_pct, min_samples=row.min_samples,
        updated_at=as_utc(row.updated_at), log_index=row.log_index,
    )  # fmt: skip


def set_target_policy(
    *, session: Session, target: str, update: TargetPolicyUpdate
) -> TargetPolicyPublic:
    """Set (and log) what a confirmed mismatch does on ``target`` and its latency limit."""
    if session.get(Target, target) is None:
        raise NotFound(f"no target {target!r}; report it first (PUT /v1/targets/{target})")
    index = audit.record_event(session, audit.TARGET_POLICY, {
        "target": target, **update.model_dump(mode="json"),
    })  # fmt: skip
    row = session.get(TargetPolicy, target) or TargetPolicy(target_name=target)
    row.on_mismatch = update.on_mismatch
    row.max_p99_regression_pct = update.max_p99_regression_pct
    row.min_samples = update.min_samples
    row.updated_at = utcnow()
    row.log_index = index
    session.add(row)
    session.commit()
    return get_target_policy(session=session, target=target)

"""Routes for what targets see after promotion: guard reports, evidence, latency, policies."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, status

from kcert.api.deps import ReadSessionDep, SessionDep, SettingsDep, require
from kcert.api.problems import PROBLEM_MEDIA_TYPE
from kcert.registry import observations, perf
from kcert.registry.models import DIGEST_PATTERN, NAME_PATTERN, Scope
from kcert.registry.observation_models import (
    MismatchPublic,
    ObservationBatch,
    ObservationsAccepted,
    PerfIngest,
    PerfIngested,
    TargetPolicyPublic,
    TargetPolicyUpdate,
)

router = APIRouter(prefix="/v1")

TargetPath = Annotated[str, Path(max_length=128, pattern=NAME_PATTERN)]
KernelQuery = Annotated[str, Query(max_length=71, pattern=DIGEST_PATTERN)]
Reader = Depends(require(Scope.GATE_READ))
Writer = Depends(require(Scope.OBSERVATIONS_WRITE))
#: The target (or a certificate) a body or query names does not exist.
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such target or certificate", "content": {PROBLEM_MEDIA_TYPE: {}}}
}


@router.post("/observations", status_code=status.HTTP_201_CREATED, dependencies=[Writer],
             responses=_NOT_FOUND)  # fmt: skip
def post_observations(
    body: ObservationBatch, session: SessionDep, settings: SettingsDep
) -> ObservationsAccepted:
    """Runtime reports of ``kcert.guard``; each mismatch is logged, and may suspend."""
    return observations.record_observations(
        session=session, batch=body, max_evidence_bytes=settings.observation_evidence_max
    )


@router.get("/observations/mismatches/{mismatch_id}", dependencies=[Reader])
def get_mismatch(
    mismatch_id: Annotated[int, Path(ge=1, le=2**62)], session: ReadSessionDep
) -> MismatchPublic:
    return observations.get_mismatch(session=session, mismatch_id=mismatch_id)


@router.get("/observations/mismatches/{mismatch_id}/evidence", dependencies=[Reader])
def get_evidence(
    mismatch_id: Annotated[int, Path(ge=1, le=2**62)], session: ReadSessionDep
) -> dict[str, Any]:
    """The mismatch's evidence arrays (base64), as the guard sent them, with their anchors."""
    return observations.get_evidence(session=session, mismatch_id=mismatch_id)


@router.get("/targets/{name}/policy", dependencies=[Reader])
def get_policy(name: TargetPath, session: ReadSessionDep) -> TargetPolicyPublic:
    return observations.get_target_policy(session=session, target=name)


@router.put("/targets/{name}/policy", dependencies=[Depends(require(Scope.TARGETS_WRITE))])
def put_policy(
    name: TargetPath, body: TargetPolicyUpdate, session: SessionDep
) -> TargetPolicyPublic:
    """What a confirmed runtime mismatch does on this target, and its p99 limit (logged)."""
    return observations.set_target_policy(session=session, target=name, update=body)


@router.post("/perf", status_code=status.HTTP_201_CREATED, dependencies=[Writer],
             responses=_NOT_FOUND)  # fmt: skip
def post_perf(body: PerfIngest, session: SessionDep) -> PerfIngested:
    """Latency samples of a kernel on a target (from a trace)."""
    return perf.ingest_samples(session=session, ingest=body)


@router.get("/perf/compare", dependencies=[Reader], responses=_NOT_FOUND)
def get_compare(
    session: ReadSessionDep,
    target: Annotated[str, Query(max_length=128, pattern=NAME_PATTERN)],
    before: KernelQuery,
    after: KernelQuery,
    seed: Annotated[int, Query(ge=0, le=2**32)] = 0,
    resamples: Annotated[int, Query(ge=10, le=10_000)] = 1000,
    confidence: Annotated[float, Query(gt=0, lt=1)] = 0.95,
) -> perf.PerfComparison:
    return perf.compare(session=session, target=target, before=before, after=after, seed=seed,
                        resamples=resamples, confidence=confidence)  # fmt: skip

"""Routes for targets, promotions and the gate."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response, status

from kcert.api.deps import ReadSessionDep, SessionDep, require
from kcert.api.problems import PROBLEM_MEDIA_TYPE
from kcert.digest import Digest
from kcert.registry import decisions, targets
from kcert.registry.models import (
    DIGEST_PATTERN,
    NAME_PATTERN,
    GateDecision,
    PromotionCreate,
    PromotionPublic,
    Scope,
    TargetCreate,
    TargetPublic,
    TargetReported,
)

router = APIRouter(prefix="/v1")

TargetPath = Annotated[str, Path(max_length=128, pattern=NAME_PATTERN)]
Reader = Depends(require(Scope.GATE_READ))
_PROBLEM: dict[str, Any] = {"content": {PROBLEM_MEDIA_TYPE: {}}}


@router.put(
    "/targets/{name}",
    dependencies=[Depends(require(Scope.TARGETS_WRITE))],
    responses={201: {"model": TargetReported, "description": "Target created"}},
)
def report_target(
    name: TargetPath, body: TargetCreate, session: SessionDep, response: Response
) -> TargetReported:
    """Report a target's environment; the registry derives its fingerprint and applies drift."""
    reported = targets.report_target(session=session, name=name, report=body)
    if reported.created:
        response.status_code = status.HTTP_201_CREATED
    return reported


@router.get("/targets/{name}", dependencies=[Reader])
def get_target(name: TargetPath, session: ReadSessionDep) -> TargetPublic:
    return targets.get_target(session=session, name=name)


@router.post(
    "/promotions",
    status_code=status.HTTP_201_CREATED,
    dependencies=[Depends(require(Scope.PROMOTE))],
    responses={409: {"description": "Denied, with every reason", **_PROBLEM}},
)
def promote(body: PromotionCreate, session: SessionDep) -> PromotionPublic:
    """Promote a kernel to a target: granted only with a valid certificate; always logged."""
    return decisions.promote(session=session, kernel=Digest.parse(body.kernel), target=body.target)


@router.get("/promotions", dependencies=[Reader])
def list_promotions(
    session: ReadSessionDep,
    target: Annotated[str | None, Query(max_length=128, pattern=NAME_PATTERN)] = None,
) -> list[PromotionPublic]:
    return decisions.list_promotions(session=session, target=target)


@router.get("/gate", dependencies=[Reader])
def gate(
    session: ReadSessionDep,
    kernel: Annotated[str, Query(max_length=71, pattern=DIGEST_PATTERN)],
    target: Annotated[str, Query(max_length=128, pattern=NAME_PATTERN)],
) -> GateDecision:
    """May this kernel run on this target now? Read-only."""
    decision = decisions.gate(session=session, kernel=Digest.parse(kernel), target=target)
    return GateDecision(
        allow=decision.allow, reasons=list(decision.reasons), certificate=decision.certificate
    )

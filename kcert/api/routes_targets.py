"""Routes for targets, promotions and the gate."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status
from pydantic import TypeAdapter

from kcert.api.deps import BearerTokenDep, ReadSessionDep, SessionDep, require
from kcert.api.problems import PROBLEM_MEDIA_TYPE
from kcert.digest import Digest
from kcert.registry import decisions, targets
from kcert.registry.gatekeeper import Gatekeeper
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
from kcert.registry.policy import Decision

router = APIRouter(prefix="/v1")
#: The gate alone, mounted before every other router: routes are matched in order, and
#: the gate is the route every deploy calls.
gate_router = APIRouter(prefix="/v1")

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
    replaces = Digest.parse(body.replaces) if body.replaces else None
    return decisions.promote(
        session=session, kernel=Digest.parse(body.kernel), target=body.target, replaces=replaces
    )


@router.get("/promotions", dependencies=[Reader])
def list_promotions(
    session: ReadSessionDep,
    target: Annotated[str | None, Query(max_length=128, pattern=NAME_PATTERN)] = None,
) -> list[PromotionPublic]:
    return decisions.list_promotions(session=session, target=target)


@gate_router.get("/gate", response_model=GateDecision)
async def gate(
    request: Request,
    token: BearerTokenDep,
    kernel: Annotated[str, Query(max_length=71, pattern=DIGEST_PATTERN)],
    target: Annotated[str, Query(max_length=128, pattern=NAME_PATTERN)],
) -> Response:
    """May this kernel run on this target now? Read-only. Needs the scope ``gate:read``."""
    # The hot route, without session or principal dependency layers: the gatekeeper reads the
    # registry's version and answers from its cache, or reads the token and the decision.
    gatekeeper: Gatekeeper[bytes] = request.app.state.gatekeeper
    answer = await gatekeeper.answer(token=token, kernel=kernel, target=target)
    return Response(answer.rendered, media_type="application/json")


def render_gate(decision: Decision) -> bytes:
    """The gate's JSON, exactly as FastAPI serializes a returned :class:`GateDecision`."""
    body = GateDecision(
        allow=decision.allow, reasons=list(decision.reasons), certificate=decision.certificate
    )
    return _GATE_JSON.dump_json(body)


_GATE_JSON = TypeAdapter(GateDecision)

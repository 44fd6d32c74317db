"""``GET /v1/log/health``: is the registry's audit log one it may keep signing?

Public, like the log routes: it reveals nothing the log does not. It proves
the database's tree extends the last checkpoint the registry signed
(:mod:`kcert.registry.checkpoints`) and answers 200, or 503 with the stable
problem type ``https://kcert.dev/problems/log-inconsistent``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from kcert.api.deps import ReadSessionDep
from kcert.api.problems import PROBLEM_MEDIA_TYPE
from kcert.registry.checkpoints import CheckpointGuard

router = APIRouter(prefix="/v1/log")

_UNHEALTHY: dict[str, Any] = {
    "content": {PROBLEM_MEDIA_TYPE: {}},
    "description": "log-inconsistent: the database's tree does not extend the last checkpoint "
    "the registry signed (rolled back or forked)",
}


class HealthPublic(BaseModel):
    status: str
    #: Entries in the log now.
    log_size: int
    #: Size of the last checkpoint the registry signed (0 before the first).
    checkpoint_size: int


@router.get("/health", responses={503: _UNHEALTHY})
def health(request: Request, session: ReadSessionDep) -> HealthPublic:
    guard: CheckpointGuard = request.app.state.log_guard
    current = guard.check(session)
    return HealthPublic(status="ok", log_size=current.size, checkpoint_size=guard.signed_size)

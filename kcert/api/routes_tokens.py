"""Routes for API tokens (admin only)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, status

from kcert.api.deps import SessionDep, require
from kcert.registry import tokens
from kcert.registry.models import ApiTokenCreate, ApiTokenCreated, Scope

router = APIRouter(prefix="/v1")


@router.post(
    "/tokens", status_code=status.HTTP_201_CREATED, dependencies=[Depends(require(Scope.ADMIN))]
)
def create_token(body: ApiTokenCreate, session: SessionDep) -> ApiTokenCreated:
    """Make a token with the given scopes. The token is in this answer only."""
    return tokens.create_token(session=session, request=body)

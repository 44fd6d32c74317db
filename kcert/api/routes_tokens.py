"""Routes for API tokens (admin only): make one, revoke one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, status

from kcert.api.deps import SessionDep, require
from kcert.registry import tokens
from kcert.registry.models import ApiTokenCreate, ApiTokenCreated, ApiTokenPublic, Scope

router = APIRouter(prefix="/v1")

Admin = Depends(require(Scope.ADMIN))
TokenIdPath = Annotated[str, Path(max_length=32, pattern=r"^tok_[0-9a-f]{1,28}$")]


@router.post("/tokens", status_code=status.HTTP_201_CREATED, dependencies=[Admin])
def create_token(body: ApiTokenCreate, session: SessionDep) -> ApiTokenCreated:
    """Make a token with the given scopes. The token is in this answer only; ``id`` names it."""
    return tokens.create_token(session=session, request=body)


@router.delete("/tokens/{token_id}", dependencies=[Admin])
def revoke_token(token_id: TokenIdPath, session: SessionDep) -> ApiTokenPublic:
    """Revoke a token: every route refuses it from the next request on. Logged (by id)."""
    return tokens.revoke_token(session=session, token_id=token_id)

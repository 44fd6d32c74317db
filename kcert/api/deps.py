"""FastAPI dependencies as ``Annotated`` aliases: settings, sessions and the caller.

The application keeps its :class:`Settings` and its engine on ``app.state``
(set by :func:`kcert.api.app.create_app`); tests build an app around a test
database or override :func:`get_session` / :func:`get_read_session`. Writes
and reads get different sessions because on SQLite a write transaction takes
the database lock at ``BEGIN``, which reads (the gate above all) must not queue
behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlmodel import Session

from kcert.registry.config import Settings
from kcert.registry.db import read_session, write_session
from kcert.registry.errors import Unauthenticated
from kcert.registry.models import Scope
from kcert.registry.tokens import Principal, authenticate


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def get_session(
    request: Request, engine: Annotated[Engine, Depends(get_engine)]
) -> Iterator[Session]:
    # Fail closed: no write extends a log that does not extend its own last checkpoint.
    guard = getattr(request.app.state, "log_guard", None)
    if guard is not None and guard.alarm is not None:
        raise guard.alarm
    with write_session(engine) as session:
        yield session


def get_read_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    with read_session(engine) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
#: Sessions close as soon as the route function returns (``scope="function"``), not after
#: the response is sent: on SQLite a write route that read and decided not to write (an
#: idempotent repeat, a 404) would otherwise keep the write lock while its answer travels.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
ReadSessionDep = Annotated[Session, Depends(get_read_session, scope="function")]


#: Declares the scheme in the OpenAPI document; missing tokens are our 401, not FastAPI's.
_bearer = HTTPBearer(auto_error=False, description="A kcert API token")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class _RequiredBearer(HTTPBearer):
    """The bearer scheme, answering the token itself; no token is our 401 problem at once.

    One dependency layer for the gate (which authenticates in its own single
    database round trip), declared under the same OpenAPI scheme as ``_bearer``.
    """

    async def __call__(self, request: Request) -> str:  # type: ignore[override]
        credentials = await super().__call__(request)
        if credentials is None:
            raise Unauthenticated("missing or malformed bearer token")
        return credentials.credentials


bearer_token = _RequiredBearer(
    auto_error=False, scheme_name="HTTPBearer", description="A kcert API token"
)


#: The presented token (401 when there is none), for routes that authenticate themselves.
BearerTokenDep = Annotated[str, Depends(bearer_token)]


def get_principal(
    credentials: BearerDep, settings: SettingsDep, session: ReadSessionDep
) -> Principal:
    admin = settings.admin_token.get_secret_value() if settings.admin_token else None
    token = credentials.credentials if credentials is not None else None
    principal = authenticate(session=session, token=token, admin_token=admin)
    # Release the read transaction now: the route may need the write lock next.
    session.rollback()
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require(scope: Scope) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency that passes only callers holding ``scope`` (or ``admin``)."""

    # Async, like the getters above, because it does no I/O: FastAPI then runs it on
    # the event loop instead of hopping to a worker thread (the gate is hot).
    async def check(principal: PrincipalDep) -> Principal:
        principal.require(scope)
        return principal

    check.__name__ = f"require_{scope.value.replace(':', '_')}"
    return check

"""API tokens: bearer secrets with scopes, stored only as their SHA-256.

A token is 256 bits from :mod:`secrets`, so a plain SHA-256 is a sound way to
store it (there is nothing to brute-force). Lookups go by hash; the final
comparison uses :func:`hmac.compare_digest`. The first admin token is
``KCERT_ADMIN_TOKEN``: it is never stored, only compared by hash. No function
here logs or returns a token except :func:`create_token`, once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlmodel import Session, select

from kcert.registry import audit
from kcert.registry.errors import Forbidden, Unauthenticated
from kcert.registry.models import (
    ApiToken,
    ApiTokenCreate,
    ApiTokenCreated,
    Scope,
    as_utc,
    utcnow,
)

TOKEN_PREFIX = "kcert_"
ADMIN_PRINCIPAL = "admin-env"
#: Tokens longer than this are refused before hashing.
MAX_TOKEN_LENGTH = 512


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, and what they may do."""

    id: str
    scopes: frozenset[Scope]

    def require(self, scope: Scope) -> None:
        if Scope.ADMIN in self.scopes or scope in self.scopes:
            return
        raise Forbidden(f"this token lacks the scope {scope.value!r}", needed=scope.value)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(*, session: Session, request: ApiTokenCreate) -> ApiTokenCreated:
    """Make a token; the secret is in the answer and nowhere else."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    row = ApiToken(
        id="tok_" + secrets.token_hex(8),
        token_hash=hash_token(secret),
        scopes=sorted({s.value for s in request.scopes}),
        description=request.description,
        created_at=now,
        expires_at=now + timedelta(seconds=request.expires_in) if request.expires_in else None,
    )
    session.add(row)
    audit.record_event(
        session,
        "token.created",
        {
            "token_id": row.id,
            "scopes": row.scopes,
            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
        },
    )
    session.commit()
    return ApiTokenCreated(
        id=row.id,
        scopes=[Scope(s) for s in row.scopes],
        description=row.description,
        created_at=now,
        expires_at=row.expires_at,
        token=secret,
    )


def authenticate(*, session: Session, token: str | None, admin_token: str | None) -> Principal:
    """The principal behind ``token``, or :class:`Unauthenticated` (never saying why in detail)."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        raise Unauthenticated("missing or malformed bearer token")
    presented = hash_token(token)
    if admin_token and hmac.compare_digest(presented, hash_token(admin_token)):
        return Principal(id=ADMIN_PRINCIPAL, scopes=frozenset({Scope.ADMIN}))
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == presented)).first()
    if row is None or not hmac.compare_digest(row.token_hash, presented):
        raise Unauthenticated("unknown bearer token")
    if row.revoked_at is not None:
        raise Unauthenticated("this token was revoked")
    if row.expires_at is not None and as_utc(row.expires_at) <= utcnow():
        raise Unauthenticated("this token has expired; ask an admin for a new one")
    return Principal(id=row.id, scopes=frozenset(Scope(s) for s in row.scopes))

"""API tokens: bearer secrets with scopes, stored only as their SHA-256.

A token is 256 bits from :mod:`secrets`, so a plain SHA-256 is a sound way to
store it (there is nothing to brute-force). Lookups go by hash; the final
comparison uses :func:`hmac.compare_digest`. The first admin token is
``KCERT_ADMIN_TOKEN``: it is never stored, only compared by hash. No function
here logs or returns a token except :func:`create_token`, once.

:func:`principal_of` is the one place that decides whether a presented token
is good (unknown, revoked, expired); :func:`authenticate` and the gate's
cache (:mod:`kcert.registry.gatekeeper`) both go through it, and both check
expiry against the clock on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import Session, select

from kcert.registry import audit
from kcert.registry.errors import Forbidden, NotFound, Unauthenticated
from kcert.registry.models import (
    ApiToken,
    ApiTokenCreate,
    ApiTokenCreated,
    ApiTokenPublic,
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


ADMIN = Principal(id=ADMIN_PRINCIPAL, scopes=frozenset({Scope.ADMIN}))


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
        audit.TOKEN_CREATED,
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


def revoke_token(*, session: Session, token_id: str) -> ApiTokenPublic:
    """Revoke a token: from the next request on it is refused everywhere.

    The log records the token's id, never the token. Revoking twice keeps the
    first record. The admin token of ``KCERT_ADMIN_TOKEN`` is not stored, so it
    cannot be revoked here: change the variable and restart the server.
    """
    row = session.exec(select(ApiToken).where(ApiToken.id == token_id).with_for_update()).first()
    if row is None:
        raise NotFound(f"no API token {token_id!r} in this registry (ids look like tok_...)")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.add(row)
        audit.record_event(session, audit.TOKEN_REVOKED, {"token_id": row.id})
        session.commit()
    return token_public(row)


def token_public(row: ApiToken) -> ApiTokenPublic:
    return ApiTokenPublic(
        id=row.id,
        scopes=[Scope(s) for s in row.scopes],
        description=row.description,
        created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at) if row.expires_at else None,
        revoked_at=as_utc(row.revoked_at) if row.revoked_at else None,
    )


def presented_hash(token: str | None) -> str:
    """The hash to look ``token`` up by, or :class:`Unauthenticated` when it cannot be a token."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        raise Unauthenticated("missing or malformed bearer token")
    return hash_token(token)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What authentication needs of a stored token (no ORM object on the gate's hot path)."""

    id: str
    token_hash: str
    scopes: tuple[str, ...]
    expires_at: datetime | None
    revoked_at: datetime | None


def principal_of(
    presented: str, admin_hash: str | None, record: TokenRecord | None, *, now: datetime
) -> Principal:
    """The principal for the token hashed to ``presented``, whose stored row is ``record``."""
    if admin_hash and hmac.compare_digest(presented, admin_hash):
        return ADMIN
    if record is None or not hmac.compare_digest(record.token_hash, presented):
        raise Unauthenticated("unknown bearer token")
    if record.revoked_at is not None:
        raise Unauthenticated("this token was revoked")
    if record.expires_at is not None and as_utc(record.expires_at) <= now:
        raise Unauthenticated("this token has expired; ask an admin for a new one")
    return Principal(id=record.id, scopes=frozenset(Scope(s) for s in record.scopes))


def authenticate(*, session: Session, token: str | None, admin_token: str | None) -> Principal:
    """The principal behind ``token``, or :class:`Unauthenticated` (never saying why in detail)."""
    presented = presented_hash(token)
    admin_hash = hash_token(admin_token) if admin_token else None
    if admin_hash and hmac.compare_digest(presented, admin_hash):
        return ADMIN
    return principal_of(presented, admin_hash, stored_record(session, presented), now=utcnow())


def stored_record(session: Session, presented: str) -> TokenRecord | None:
    """The stored row of the token hashed to ``presented``, or ``None`` when there is none."""
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == presented)).first()
    if row is None:
        return None
    return TokenRecord(row.id, row.token_hash, tuple(row.scopes), row.expires_at, row.revoked_at)

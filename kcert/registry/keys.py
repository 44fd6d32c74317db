"""Trusted signing keys: trust one, revoke one, hand the verifier the live set.

A revoked key stays in the table (with when and why) so that every
certificate it signed is refused at push and invalid at the gate; a revoked
key is never trusted again under the same id. A certificate that another
trusted, unrevoked key also signed (merged signatures, see
:mod:`kcert.registry.certificates`) moves to that signer instead, with a
``certificate.resigned`` leaf, and stays valid.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlmodel import Session, col, select

from kcert.attest.dsse import parse_envelope
from kcert.attest.keys import key_id, public_key_from_hex
from kcert.errors import KcertError
from kcert.registry import audit
from kcert.registry.decisions import promotions_of_kernels, recheck_promotions, subjects_of
from kcert.registry.errors import InvalidInput, KeyConflict, NotFound
from kcert.registry.models import (
    Certificate,
    TrustedKey,
    TrustedKeyCreate,
    TrustedKeyPublic,
    as_utc,
    utcnow,
)

#: The eight Ed25519 points of small order (canonical encodings). A signature "by" one
#: of them says nothing about who signed, so such a key is never trusted.
SMALL_ORDER_KEYS = frozenset(
    {
        "0100000000000000000000000000000000000000000000000000000000000000",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    }
)


def trust_key(*, session: Session, key: TrustedKeyCreate) -> tuple[TrustedKeyPublic, bool]:
    """Trust ``key``; return it and whether it is new. Trusting it again changes nothing."""
    if key.public_key.lower() in SMALL_ORDER_KEYS:
        raise InvalidInput("that public key is a point of small order, not a real signing key")
    try:
        public = public_key_from_hex(key.public_key)
    except KcertError as exc:
        raise InvalidInput(f"not an Ed25519 public key: {exc.diagnostics()}") from exc
    keyid = key_id(public)
    existing = session.get(TrustedKey, keyid)
    if existing is not None:
        if existing.revoked_at is not None:
            raise KeyConflict(
                f"key {keyid} was revoked ({existing.revoke_reason}); a revoked key cannot be "
                "trusted again: generate a new key"
            )
        return key_public(existing), False
    row = TrustedKey(keyid=keyid, name=key.name, public_key=key.public_key.lower())
    session.add(row)
    audit.record_event(
        session, audit.KEY_TRUSTED, {"keyid": keyid, "name": key.name, "public_key": row.public_key}
    )
    session.commit()
    return key_public(row), True


def revoke_key(*, session: Session, keyid: str, reason: str) -> TrustedKeyPublic:
    """Revoke a key: every certificate it signed stops being valid, promotions resting
    only on them are suspended. Revoking twice keeps the first record."""
    row = session.exec(
        select(TrustedKey).where(TrustedKey.keyid == keyid.lower()).with_for_update()
    ).first()
    if row is None:
        raise NotFound(f"no trusted key {keyid!r}; `kcert keys trust` lists what is trusted")
    if row.revoked_at is not None:
        return key_public(row)
    row.revoked_at = utcnow()
    row.revoke_reason = reason
    session.add(row)
    audit.record_event(session, audit.KEY_REVOKED, {"keyid": row.keyid, "reason": reason})
    session.flush()
    _move_to_cosigners(session, row.keyid)
    signed = session.exec(select(Certificate.id).where(Certificate.keyid == row.keyid)).all()
    promotions = promotions_of_kernels(session, subjects_of(session, signed))
    recheck_promotions(session, promotions, cause=f"key {row.keyid} revoked")
    session.commit()
    return key_public(row)


def _move_to_cosigners(session: Session, revoked: str) -> None:
    """Name another live signer on each certificate ``revoked`` was the signer of, if any."""
    live = set(trusted_public_keys(session))
    rows = session.exec(select(Certificate).where(Certificate.keyid == revoked)).all()
    events: list[tuple[str, dict[str, str]]] = []
    for cert in rows:
        signers = {s.keyid for s in parse_envelope(cert.envelope.encode("utf-8")).signatures}
        others = sorted(k for k in signers & live if k is not None)
        if not others:
            continue
        cert.keyid = others[0]
        session.add(cert)
        payload = {"certificate": cert.id, "keyid": cert.keyid, "previous": revoked}
        events.append((audit.CERTIFICATE_RESIGNED, payload))
    if events:
        audit.record_events(session, events)
        session.flush()


def list_keys(*, session: Session) -> list[TrustedKeyPublic]:
    rows = session.exec(select(TrustedKey).order_by(col(TrustedKey.created_at))).all()
    return [key_public(r) for r in rows]


def trusted_public_keys(session: Session) -> dict[str, Ed25519PublicKey]:
    """The keys a certificate may be signed with now: trusted and not revoked."""
    rows = session.exec(select(TrustedKey).where(col(TrustedKey.revoked_at).is_(None))).all()
    return {r.keyid: public_key_from_hex(r.public_key) for r in rows}


def key_public(row: TrustedKey) -> TrustedKeyPublic:
    return TrustedKeyPublic(
        keyid=row.keyid,
        name=row.name,
        public_key=row.public_key,
        created_at=as_utc(row.created_at),
        revoked_at=as_utc(row.revoked_at) if row.revoked_at else None,
        revoke_reason=row.revoke_reason,
    )

"""The content-addressed certificate store.

A certificate is stored under its id (``sha256:`` of the DSSE PAE: the signed
bytes, see :func:`kcert.attest.certificate.certificate_id`) and indexed by
every subject digest, so the gate finds a kernel's certificates with one index
lookup. One canonical envelope is kept per id: only signatures that verify
against a trusted key, one per key, each named by its real key id, sorted.

Storing is idempotent: a push of an id already stored answers that certificate
(``created`` false) whatever its unsigned fields say. A signature on it by a
trusted, unrevoked key that the stored envelope lacks is merged in, and that
merge is a state change with its own log leaf (``certificate.cosigned``);
a push that adds nothing writes nothing. Signatures that do not verify are
dropped, never stored. A revoked certificate stays revoked and is not changed
by any push: revocation belongs to the id, not to an envelope. The row's
``keyid`` is the signer the gate checks: the key that first verified it, until
that key is revoked and another live key has signed it too
(:mod:`kcert.registry.keys`, and a merge onto such a certificate). Ids from before the PAE id
(migration 0004) still resolve through ``certificate_alias``.

A certificate is accepted only when it
verifies against a trusted, unrevoked key and its statement and predicate
validate; a failed verdict is stored too (it is evidence), but never counts.
So is a certificate made outside the sandbox: the row records whether it was
(``sandboxed``) and the promotion policy refuses it.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from kcert.attest.certificate import (
    canonical_envelope,
    certificate_id,
    parse_envelope,
    verify_envelope,
)
from kcert.attest.dsse import Envelope, verified_signatures
from kcert.attest.errors import CertificateFormatError, VerificationError
from kcert.digest import Digest, DigestError, canonical_json
from kcert.registry import audit
from kcert.registry.decisions import (
    kernel_certificates,
    promotions_of_kernels,
    recheck_promotions,
    subjects_of,
)
from kcert.registry.errors import CertificateRejected, NotFound
from kcert.registry.keys import trusted_public_keys
from kcert.registry.models import (
    Certificate,
    CertificateAlias,
    CertificatePublic,
    CertificateStored,
    CertificateSubject,
    TrustedKey,
    as_utc,
    utcnow,
)
from kcert.registry.policy import records_sandbox


def envelope_from_json(value: Any) -> Envelope:
    """Parse a JSON value (already decoded) as a DSSE envelope, strictly."""
    try:
        return parse_envelope(json.dumps(value).encode("utf-8"))
    except CertificateFormatError as exc:
        raise CertificateRejected(exc.diagnostics()) from exc


def store_certificate(*, session: Session, envelope: Envelope) -> CertificateStored:
    """Verify and store ``envelope``; ``created`` says whether it is new here."""
    cid = str(certificate_id(envelope))
    existing = session.exec(
        select(Certificate).where(Certificate.id == cid).with_for_update()
    ).first()
    if existing is not None:
        return _merge(session, existing, envelope)
    trusted = trusted_public_keys(session)
    try:
        verified = verify_envelope(envelope, trusted)
    except VerificationError as exc:
        raise CertificateRejected(_rejection(session, envelope, exc)) from exc
    canonical = canonical_envelope(envelope, trusted)
    _check_fits(verified.kernel_name, verified.hw_class, str(verified.verdict))
    predicate = verified.predicate
    environment = dict(predicate.get("environment", {}).get("fields", {}))
    row = Certificate(
        id=cid,
        kernel_name=verified.kernel_name,
        source_digest=str(verified.source_digest),
        keyid=verified.keyid,
        verdict=str(verified.verdict),
        hw_class=verified.hw_class,
        fingerprint=str(verified.fingerprint),
        envelope=canonical_json(canonical.to_json()).decode("utf-8"),
        environment=environment,
        sandboxed=records_sandbox(predicate),
    )
    subjects = {str(digest): name for name, digest in verified.subjects}
    try:
        session.add(row)
        # Flush the certificate before its subjects: the index rows reference it.
        session.flush()
        for digest, name in subjects.items():
            session.add(CertificateSubject(digest=digest, certificate_id=cid, name=name[:512]))
        index = audit.record_event(
            session,
            audit.CERTIFICATE_STORED,
            {
                "certificate": cid,
                "keyid": verified.keyid,
                "signers": [str(s.keyid) for s in canonical.signatures],
                "kernel_name": verified.kernel_name,
                "subjects": sorted(subjects),
                "verdict": row.verdict,
                "hw_class": row.hw_class,
                "fingerprint": row.fingerprint,
                "sandboxed": row.sandboxed,
            },
        )
        session.commit()
    except IntegrityError:
        # Another writer stored the same envelope between our read and our insert.
        session.rollback()
        winner = session.get(Certificate, cid)
        if winner is None:
            raise
        return _stored(session, winner, created=False, log_index=None)
    return _stored(session, row, created=True, log_index=index)


def _merge(session: Session, row: Certificate, envelope: Envelope) -> CertificateStored:
    """A push of a stored id: add the trusted signatures it lacks, drop everything else."""
    if row.revoked_at is not None:
        return _stored(session, row, created=False, log_index=None)
    stored = parse_envelope(row.envelope.encode("utf-8"))
    have = {s.keyid for s in stored.signatures}
    live = trusted_public_keys(session)
    trusted = {k: v for k, v in live.items() if k not in have}
    added = verified_signatures(envelope, trusted) if trusted else ()
    if not added:
        return _stored(session, row, created=False, log_index=None)
    signatures = tuple(sorted((*stored.signatures, *added), key=lambda s: str(s.keyid)))
    merged = Envelope(stored.payload_type, stored.payload, signatures)
    row.envelope = canonical_json(merged.to_json()).decode("utf-8")
    if row.keyid not in live:
        # The signer it was stored under is revoked: a live co-signer stands in.
        row.keyid = str(added[0].keyid)
    session.add(row)
    index = audit.record_event(
        session,
        audit.CERTIFICATE_COSIGNED,
        {
            "certificate": row.id,
            "added": [str(s.keyid) for s in added],
            "keyid": row.keyid,
            "signers": [str(s.keyid) for s in signatures],
        },
    )
    session.commit()
    return _stored(session, row, created=False, log_index=index)


def get_certificate(*, session: Session, certificate: str) -> CertificatePublic:
    row = session.get(Certificate, _resolve(session, certificate))
    if row is None:
        raise NotFound(f"no certificate {certificate} in this registry")
    return certificate_public(session, row)


def get_envelope(*, session: Session, certificate: str) -> dict[str, Any]:
    """The stored envelope; for an id from before 0004, the envelope stored under it then
    (which hashes to that id by the old rule, so a replay of an old leaf can check it)."""
    key = _certificate_key(certificate)
    alias = session.get(CertificateAlias, key)
    text = alias.envelope if alias is not None else None
    if text is None:
        row = session.get(Certificate, key)
        if row is None:
            raise NotFound(f"no certificate {certificate} in this registry")
        text = row.envelope
    envelope: dict[str, Any] = json.loads(text)
    return envelope


def certificates_of_kernel(*, session: Session, kernel: Digest) -> list[CertificatePublic]:
    return [certificate_public(session, c) for c in kernel_certificates(session, str(kernel))]


def revoke_certificate(*, session: Session, certificate: str, reason: str) -> CertificatePublic:
    """Revoke one certificate; promotions left without a valid certificate are suspended."""
    cid = _resolve(session, certificate)
    row = session.exec(select(Certificate).where(Certificate.id == cid).with_for_update()).first()
    if row is None:
        raise NotFound(f"no certificate {certificate} in this registry")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        row.revoke_reason = reason
        session.add(row)
        audit.record_event(
            session, audit.CERTIFICATE_REVOKED, {"certificate": cid, "reason": reason}
        )
        session.flush()
        promotions = promotions_of_kernels(session, subjects_of(session, [cid]))
        recheck_promotions(session, promotions, cause=f"certificate {cid} revoked")
        session.commit()
    return certificate_public(session, row)


def certificate_public(session: Session, row: Certificate) -> CertificatePublic:
    return CertificatePublic(**_public_fields(session, row))


def _stored(
    session: Session, row: Certificate, *, created: bool, log_index: int | None
) -> CertificateStored:
    return CertificateStored(**_public_fields(session, row), created=created, log_index=log_index)


def _public_fields(session: Session, row: Certificate) -> dict[str, Any]:
    subjects = session.exec(
        select(CertificateSubject.digest)
        .where(CertificateSubject.certificate_id == row.id)
        .order_by(col(CertificateSubject.digest))
    ).all()
    return {
        "id": row.id,
        "kernel_name": row.kernel_name,
        "source_digest": row.source_digest,
        "keyid": row.keyid,
        "verdict": row.verdict,
        "hw_class": row.hw_class,
        "fingerprint": row.fingerprint,
        "sandboxed": row.sandboxed,
        "subjects": list(subjects),
        "created_at": as_utc(row.created_at),
        "revoked_at": as_utc(row.revoked_at) if row.revoked_at else None,
        "revoke_reason": row.revoke_reason,
    }


def _check_fits(kernel_name: str, hw_class: str, verdict: str) -> None:
    """Refuse (rather than fail to store) a signed certificate whose fields exceed the schema."""
    for what, value, limit in (
        ("kernel name", kernel_name, 256), ("hardware class", hw_class, 64),
        ("verdict", verdict, 16),
    ):  # fmt: skip
        if not value or len(value) > limit:
            raise CertificateRejected(
                f"the certificate's {what} is empty or longer than {limit} characters"
            )


def _certificate_key(text: str) -> str:
    try:
        return str(Digest.parse(text))
    except DigestError as exc:
        raise NotFound(f"{text!r} is not a certificate id (sha256:<64 hex>)") from exc


def _resolve(session: Session, text: str) -> str:
    """The id a certificate has now: ids from before the PAE id map through their alias."""
    key = _certificate_key(text)
    alias = session.get(CertificateAlias, key)
    return alias.certificate_id if alias is not None else key


def _rejection(session: Session, envelope: Envelope, exc: VerificationError) -> str:
    """Say which key was the problem when a signature names a revoked or unknown key."""
    hints = [s.keyid for s in envelope.signatures if s.keyid]
    if hints:
        revoked = session.exec(
            select(TrustedKey).where(
                col(TrustedKey.keyid).in_(hints), col(TrustedKey.revoked_at).is_not(None)
            )
        ).first()
        if revoked is not None:
            return (
                f"signed by key {revoked.keyid}, which is revoked ({revoked.revoke_reason}); "
                "certificates signed by a revoked key are refused"
            )
    return exc.diagnostics()

"""Routes for certificates, the kernels they index, and trusted keys."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response, status

from kcert.api.deps import ReadSessionDep, SessionDep, require
from kcert.digest import Digest
from kcert.registry import certificates, keys
from kcert.registry.models import (
    DIGEST_PATTERN,
    TEXT_PATTERN,
    CertificateCreate,
    CertificatePublic,
    CertificateRevoke,
    CertificateStored,
    Scope,
    TrustedKeyCreate,
    TrustedKeyPublic,
)

router = APIRouter(prefix="/v1")

DigestPath = Annotated[
    str, Path(max_length=71, pattern=DIGEST_PATTERN, description="sha256:<64 hex>")
]
KeyIdPath = Annotated[str, Path(max_length=64, pattern=r"^[0-9a-fA-F]{64}$")]
Writer = Depends(require(Scope.CERTIFICATES_WRITE))
Reader = Depends(require(Scope.GATE_READ))
Admin = Depends(require(Scope.ADMIN))


@router.post(
    "/certificates",
    status_code=status.HTTP_201_CREATED,
    dependencies=[Writer],
    responses={200: {"model": CertificateStored, "description": "Already stored"}},
)
def push_certificate(
    body: CertificateCreate, session: SessionDep, response: Response
) -> CertificateStored:
    """Store a DSSE certificate: 201 when new, 200 when it was already here."""
    envelope = certificates.envelope_from_json(body.envelope())
    stored = certificates.store_certificate(session=session, envelope=envelope)
    # The answer's reads reopened a transaction (on SQLite: the write lock); end it here, not
    # at dependency teardown, or 50 concurrent pushes convoy on the lock (issue 8).
    session.commit()
    if not stored.created:
        response.status_code = status.HTTP_200_OK
    return stored


@router.get("/certificates/{certificate_id}", dependencies=[Reader])
def get_certificate(certificate_id: DigestPath, session: ReadSessionDep) -> CertificatePublic:
    return certificates.get_certificate(session=session, certificate=certificate_id)


@router.get("/certificates/{certificate_id}/envelope", dependencies=[Reader])
def get_envelope(certificate_id: DigestPath, session: ReadSessionDep) -> dict[str, Any]:
    """The stored DSSE envelope, for anyone who wants to verify it themselves."""
    return certificates.get_envelope(session=session, certificate=certificate_id)


@router.post("/certificates/{certificate_id}/revoke", dependencies=[Admin])
def revoke_certificate(
    certificate_id: DigestPath, body: CertificateRevoke, session: SessionDep
) -> CertificatePublic:
    return certificates.revoke_certificate(
        session=session, certificate=certificate_id, reason=body.reason
    )


@router.get("/kernels/{digest}/certificates", dependencies=[Reader])
def kernel_certificates(digest: DigestPath, session: ReadSessionDep) -> list[CertificatePublic]:
    return certificates.certificates_of_kernel(session=session, kernel=Digest.parse(digest))


@router.post(
    "/keys",
    status_code=status.HTTP_201_CREATED,
    dependencies=[Admin],
    responses={
        200: {"model": TrustedKeyPublic, "description": "Already trusted"},
        409: {"description": "The key was revoked; a revoked key cannot be trusted again"},
    },
)
def trust_key(body: TrustedKeyCreate, session: SessionDep, response: Response) -> TrustedKeyPublic:
    key, created = keys.trust_key(session=session, key=body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return key


@router.get("/keys", dependencies=[Reader])
def list_keys(session: ReadSessionDep) -> list[TrustedKeyPublic]:
    return keys.list_keys(session=session)


@router.delete("/keys/{keyid}", dependencies=[Admin])
def revoke_key(
    keyid: KeyIdPath,
    session: SessionDep,
    reason: Annotated[str, Query(min_length=1, max_length=2000, pattern=TEXT_PATTERN)] = "revoked",
) -> TrustedKeyPublic:
    """Revoke a key: every certificate it signed stops counting at the gate."""
    return keys.revoke_key(session=session, keyid=keyid, reason=reason)

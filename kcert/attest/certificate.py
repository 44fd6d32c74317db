"""Kernel certificates: sign a report, name, store, read and verify the envelope.

A certificate is a DSSE envelope whose payload is an in-toto Statement v1
with kcert's predicate (docs/certificate.md). Its id is ``sha256:``
of the DSSE PAE bytes (payload type and payload): exactly the bytes that are
signed. Nothing a signature does not cover (a ``keyid`` hint, extra, repeated
or reordered signatures, JSON layout, base64 spelling) changes the id, so the
same signed statement is one certificate however the envelope around it was
altered.

Verification authenticates before it interprets: the signature over the PAE
is checked first, and only then is the payload parsed as a statement.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kcert.attest import dsse
from kcert.attest.dsse import Envelope, Signature, parse_envelope
from kcert.attest.errors import CertificateFormatError, SigningError, VerificationError
from kcert.attest.files import read_bounded
from kcert.attest.statement import PAYLOAD_TYPE, make_statement, parse_statement
from kcert.certify.report import CertificationReport, Verdict
from kcert.digest import Digest, DigestError

__all__ = [
    "CertificateContents",
    "Envelope",
    "Signature",
    "VerifiedCertificate",
    "canonical_envelope",
    "certificate_id",
    "inspect_envelope",
    "load_envelope",
    "parse_envelope",
    "read_certificate",
    "report_subjects",
    "sign_report",
    "verify_envelope",
    "write_certificate",
]

#: Certificates are kilobytes to a few megabytes; a cap keeps a wrong path
#: (a model checkpoint) from being read whole.
MAX_CERTIFICATE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CertificateContents:
    """What a certificate says; *not* verified on its own (see :class:`VerifiedCertificate`)."""

    id: Digest
    envelope: Envelope
    statement: Mapping[str, Any]
    predicate: Mapping[str, Any]
    subjects: tuple[tuple[str, Digest], ...]
    kernel_name: str
    source_digest: Digest
    verdict: Verdict
    hw_class: str
    executor: str
    fingerprint: Digest


@dataclass(frozen=True, slots=True)
class VerifiedCertificate(CertificateContents):
    """A certificate whose signature verified with the trusted key ``keyid``."""

    keyid: str


def report_subjects(report: CertificationReport) -> list[tuple[str, Digest]]:
    """The kernel source, and the compiled cubin when there is a build."""
    kernel = report.kernel
    try:
        subjects = [(kernel.source_name, Digest.parse(kernel.source_digest))]
        if kernel.build is not None:
            subjects.append((f"{kernel.name}.cubin", Digest.parse(kernel.build.cubin_digest)))
    except DigestError as exc:
        raise SigningError(f"cannot sign this report: {exc.diagnostics()}") from exc
    return subjects


def sign_report(report: CertificationReport, private_key: Ed25519PrivateKey) -> Envelope:
    """Sign a report (whatever its verdict: a rejection is evidence too)."""
    payload = make_statement(report_subjects(report), report.predicate())
    return dsse.sign(PAYLOAD_TYPE, payload, private_key)


def certificate_id(envelope: Envelope) -> Digest:
    """``sha256`` of the DSSE PAE of the envelope's type and payload: the signed bytes only."""
    return Digest.of_bytes(envelope.pae())


def canonical_envelope(
    envelope: Envelope, trusted: Mapping[str, Ed25519PublicKey]
) -> Envelope:
    """``envelope`` with only the signatures that verify against ``trusted``, one per key,
    each named by the real id of its key and sorted by it (the form the registry stores)."""
    return Envelope(
        payload_type=envelope.payload_type,
        payload=envelope.payload,
        signatures=dsse.verified_signatures(envelope, trusted),
    )


def inspect_envelope(envelope: Envelope) -> CertificateContents:
    """Read a certificate's statement without checking who signed it (for display and diff)."""
    if envelope.payload_type != PAYLOAD_TYPE:
        raise VerificationError(
            f"wrong payload type {envelope.payload_type!r}: a kcert certificate carries "
            f"{PAYLOAD_TYPE!r}"
        )
    statement = parse_statement(envelope.payload)
    predicate = statement.predicate
    return CertificateContents(
        id=certificate_id(envelope),
        envelope=envelope,
        statement=statement.raw,
        predicate=predicate,
        subjects=statement.subjects,
        kernel_name=predicate["kernel"]["name"],
        source_digest=Digest.parse(predicate["kernel"]["source_digest"]),
        verdict=Verdict(predicate["verdict"]),
        hw_class=predicate["hardware"]["class"],
        executor=predicate["hardware"]["executor"],
        fingerprint=Digest.parse(predicate["environment"]["fingerprint"]),
    )


def verify_envelope(
    envelope: Envelope, trusted: Mapping[str, Ed25519PublicKey]
) -> VerifiedCertificate:
    """Check signature, signer, statement and predicate; raise :class:`VerificationError`."""
    keyid = dsse.verify_signatures(envelope, trusted)
    contents = inspect_envelope(envelope)
    return VerifiedCertificate(
        **{f: getattr(contents, f) for f in CertificateContents.__dataclass_fields__},
        keyid=keyid,
    )


def write_certificate(path: Path, envelope: Envelope) -> None:
    """Write a certificate after checking its statement against the schema."""
    inspect_envelope(envelope)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        tmp.write_bytes(envelope.to_bytes())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CertificateFormatError(f"cannot write certificate {path}: {exc.strerror}") from exc


def load_envelope(path: Path) -> Envelope:
    """Read and parse an envelope file, without looking inside the payload."""
    data = read_bounded(
        path, limit=MAX_CERTIFICATE_BYTES, what="certificate", error=CertificateFormatError
    )
    try:
        return parse_envelope(data)
    except CertificateFormatError as exc:
        raise CertificateFormatError(f"{path}: {exc.diagnostics()}") from exc


def read_certificate(path: Path) -> Envelope:
    """Read a certificate file and check its statement against the schema (not its signature)."""
    envelope = load_envelope(path)
    try:
        inspect_envelope(envelope)
    except VerificationError as exc:
        raise VerificationError(f"{path}: {exc.diagnostics()}") from exc
    return envelope

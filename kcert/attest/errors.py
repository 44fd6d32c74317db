"""Errors of the attestation layer: key files, certificate files, verification.

``CertificateFormatError`` is a kind of ``VerificationError`` so that a caller
that only wants "is this certificate acceptable" catches one class; the CLI
tells them apart because an unreadable file is bad input (exit 2) while a
readable certificate that fails verification is invalid (exit 1).
"""

from __future__ import annotations

from kcert.errors import KcertError


class KeyFileError(KcertError):
    """A key file that cannot be read, written or used. Never carries key material."""

    kind = "bad-key"


class SigningError(KcertError):
    """A report that cannot be written as a certificate (a defect in what produced it)."""

    kind = "cannot-sign"


class VerificationError(KcertError):
    """A certificate that must not be trusted, with the specific reason."""

    kind = "invalid-certificate"


class CertificateFormatError(VerificationError):
    """Bytes that are not a DSSE envelope at all (bad JSON, wrong shape, bad base64)."""

    kind = "bad-certificate"


class OutputFileError(KcertError):
    """A report or other output file that cannot be written where the user asked."""

    kind = "cannot-write"

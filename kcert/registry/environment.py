"""Fingerprints as the registry needs them: a target's, and a certificate's under a
target's drift fields.

The arithmetic belongs to :mod:`kcert.certify.environment` (the same function
the certifier uses), so a target and a certificate made on the same machine
always agree. A target may name its own drift fields; a certificate's
fingerprint is then recomputed from the environment fields it recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kcert.errors import KcertError
from kcert.registry.errors import InvalidInput
from kcert.registry.models import Certificate


def target_fingerprint(environment: Mapping[str, Any], drift_fields: Sequence[str] | None) -> str:
    """``sha256:`` of ``environment`` over ``drift_fields`` (default: the standard set)."""
    # lazy: kcert.certify.environment (GPU probing) stays out of the server's imports
    from kcert.certify.environment import fingerprint

    try:
        return str(fingerprint(dict(environment), list(drift_fields) if drift_fields else None))
    except KcertError as exc:
        raise InvalidInput(
            f"cannot fingerprint the reported environment: {exc.diagnostics()}"
        ) from exc


def certificate_fingerprint(certificate: Certificate, drift_fields: Sequence[str] | None) -> str:
    """The certificate's fingerprint over ``drift_fields``; its recorded one for the default set."""
    return fingerprint_over(certificate.fingerprint, certificate.environment, drift_fields)


def fingerprint_over(
    recorded: str, environment: Mapping[str, Any] | None, drift_fields: Sequence[str] | None
) -> str:
    """A certificate's fingerprint (``recorded`` over the default fields) over ``drift_fields``."""
    if not drift_fields:
        return recorded
    try:
        return target_fingerprint(environment or {}, drift_fields)
    except InvalidInput:
        # The certificate lacks a field the target drifts on: it cannot match any report.
        return f"unfingerprintable: {recorded}"


def normalized_drift_fields(names: Sequence[str] | None) -> list[str] | None:
    """Drift fields checked and sorted (so order never counts as a change); ``None`` = default."""
    if not names:
        return None
    # lazy: kcert.certify.environment (GPU probing) stays out of the server's imports
    from kcert.certify.environment import check_drift_fields

    try:
        return list(check_drift_fields(list(names)))
    except KcertError as exc:
        raise InvalidInput(exc.diagnostics()) from exc

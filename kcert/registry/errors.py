"""Errors of the registry, one class per thing a caller can get wrong.

Each class has a stable ``kind``: the API turns it into the problem ``type``
URI and an HTTP status in one handler, the CLI into exit code 2 (or 1 where
the answer is a denial). Library code never raises ``HTTPException``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kcert.errors import KcertError
from kcert.log.errors import LogError


class RegistryError(KcertError):
    """Root of the registry's errors."""

    kind = "registry-error"

    def extensions(self) -> dict[str, Any]:
        """Extra members of the problem document (RFC 9457 extension members)."""
        return {}


class NotFound(RegistryError):
    kind = "not-found"


class InvalidInput(RegistryError):
    """A request that is well-formed JSON but asks for something meaningless."""

    kind = "invalid-input"


class TooLarge(RegistryError):
    """A request part over a size the registry sets (evidence of a mismatch)."""

    kind = "too-large"


class CertificateRejected(RegistryError):
    """A certificate that does not verify against a trusted, unrevoked key."""

    kind = "certificate-rejected"


class KeyConflict(RegistryError):
    """A key that cannot be trusted as asked (already revoked, or a name clash)."""

    kind = "key-conflict"


class Unauthenticated(RegistryError):
    """No token, an unknown one or an expired one. Never says which token."""

    kind = "unauthenticated"


class Forbidden(RegistryError):
    """A valid token without the scope the operation needs."""

    kind = "forbidden"

    def __init__(self, message: str, *, needed: str, target: str | None = None) -> None:
        super().__init__(message)
        self.needed = needed
        self.target = target

    def extensions(self) -> dict[str, Any]:
        if self.target is not None:  # the scope is there, but not for this target
            return {"scope": self.needed, "target": self.target}
        return {"scope": self.needed}


class PromotionDenied(RegistryError):
    """The policy said no; ``reasons`` says why, ``log_index`` where it was recorded."""

    kind = "promotion-denied"

    def __init__(
        self, message: str, *, reasons: Sequence[str], certificate: str | None = None,
        log_index: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.reasons = list(reasons)
        self.certificate = certificate
        self.log_index = log_index

    def diagnostics(self) -> str:
        return "; ".join([str(self), *self.reasons])

    def extensions(self) -> dict[str, Any]:
        return {"reasons": self.reasons, "log_index": self.log_index}


class PolicyError(RegistryError):
    """A policy that cannot decide anything (for example an empty ``all_of``)."""

    kind = "bad-policy"


class RegistryUnavailable(RegistryError):
    """The database or a remote registry cannot be reached or used."""

    kind = "registry-unavailable"


class ReplayError(LogError):
    """An entry that cannot be replayed (not a decision, or its inputs are unreadable).

    A log error (what ``kcert audit`` reports it as), raised by the registry's replay.
    """

    kind = "log-replay"


class LogInconsistent(LogError):
    """The database's tree does not extend the last checkpoint this log signed (HTTP 503)."""

    kind = "log-inconsistent"


class LogUnexplained(RegistryError):
    """The log cannot be folded at all (a leaf is missing or unreadable)."""

    kind = "log-unexplained"

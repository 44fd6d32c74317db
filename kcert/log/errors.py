"""Errors of the audit log library, each with a stable ``kind`` slug.

The API maps each ``kind`` to one RFC 9457 problem type; the CLI shows
``diagnostics()``. A range or proof request that cannot be answered is the
caller's mistake (HTTP 400); a note or proof that does not verify is evidence
of tampering, and the auditing commands turn it into exit code 1.
"""

from __future__ import annotations

from kcert.errors import KcertError


class LogError(KcertError):
    """Root of the audit log's errors."""

    kind = "log-error"


class LogRangeError(LogError):
    """A requested index, size or range lies outside the log (HTTP 400)."""

    kind = "log-bad-range"


class NoteError(LogError):
    """Text that is not a well-formed C2SP signed note, checkpoint or verifier key."""

    kind = "log-bad-note"


class SignatureError(LogError):
    """A signed note carries no valid signature by the expected key."""

    kind = "log-bad-signature"


class ProofError(LogError):
    """An inclusion or consistency proof does not verify."""

    kind = "log-bad-proof"


class LogKeyError(LogError):
    """The log's signing key cannot be read, made or trusted."""

    kind = "log-key"


class LogSourceError(LogError):
    """The log cannot be read at all (unreachable, or not a kcert log)."""

    kind = "log-unreachable"


class WitnessError(LogError):
    """A refused submission; ``status`` is the HTTP status the spec assigns."""

    kind = "witness-refused"
    status = 400


class BadSubmission(WitnessError):
    kind = "witness-bad-submission"
    status = 400


class UnauthenticatedCheckpoint(WitnessError):
    kind = "witness-unauthenticated"
    status = 403


class UnknownLog(WitnessError):
    kind = "witness-unknown-log"
    status = 404


class StaleOldSize(WitnessError):
    """The old size is not the witness's latest; ``size`` is what it holds."""

    kind = "witness-stale-size"

    status = 409

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


class InconsistentCheckpoint(WitnessError):
    kind = "witness-inconsistent-proof"
    status = 422


class WitnessSubmitError(LogError):
    """A witness did not cosign (unreachable, refused, or answered garbage)."""

    kind = "witness-unavailable"


class WitnessSawOtherTree(WitnessSubmitError):
    """A witness *claims* a tree of this log that the new checkpoint does not extend.

    A claim, not proof: a bare ``409``/``422`` carries no signature, so anyone
    on the path (or the witness itself) can send one. The log asks the witness
    for the checkpoint it holds (:func:`kcert.log.witness_client.held_checkpoint`)
    and treats only one signed by the log's own key as evidence.
    """

    kind = "witness-inconsistent"

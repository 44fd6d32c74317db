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

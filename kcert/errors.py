"""The one error root of kcert.

Every error a user can cause derives from :class:`KcertError`. Front ends (the
CLI and the API) catch it in exactly one place and show ``diagnostics()``;
nothing below them prints or exits.

Each package keeps its subclasses in its own ``errors`` module. Every class has
its own ``kind`` (shown in brackets): the slug of the API's problem ``type`` and
of the CLI's ``--json`` error. The tree (``tests/test_errors.py`` checks it
against the classes)::

    * KcertError (error)
      * ArchError (bad-arch)
      * BuildError (build-failed)
      * CompilerUnavailable (compiler-unavailable)
      * DigestError (bad-digest)
      * DriftFieldError (bad-drift-fields)
      * EnvironmentUnavailable (environment)
      * ExecutorUnavailable (executor-unavailable)
        * NoDeviceError (no-device)
      * ExprError (bad-expression)
      * GuardError (guard)
      * HardwareMismatch (hardware-mismatch)
      * KeyFileError (bad-key)
      * LogError (log-error)
        * LogInconsistent (log-inconsistent)
        * LogKeyError (log-key)
        * LogRangeError (log-bad-range)
        * LogSourceError (log-unreachable)
        * NoteError (log-bad-note)
        * ProofError (log-bad-proof)
        * ReplayError (log-replay)
        * SignatureError (log-bad-signature)
        * WitnessError (witness-refused)
          * BadSubmission (witness-bad-submission)
          * InconsistentCheckpoint (witness-inconsistent-proof)
          * StaleOldSize (witness-stale-size)
          * UnauthenticatedCheckpoint (witness-unauthenticated)
          * UnknownLog (witness-unknown-log)
        * WitnessSubmitError (witness-unavailable)
          * WitnessSawOtherTree (witness-inconsistent)
      * ModuleCodeError (module-code)
      * OutputFileError (cannot-write)
      * ReferenceFailure (bad-reference)
      * RegistryError (registry-error)
        * CertificateRejected (certificate-rejected)
        * Forbidden (forbidden)
        * InvalidInput (invalid-input)
        * KeyConflict (key-conflict)
        * LogUnexplained (log-unexplained)
        * NotFound (not-found)
        * PolicyError (bad-policy)
        * PromotionDenied (promotion-denied)
        * RegistryUnavailable (registry-unavailable)
        * TooLarge (too-large)
        * Unauthenticated (unauthenticated)
      * SandboxUnavailable (sandbox-unavailable)
      * ScaffoldError (cannot-scaffold)
      * SigningError (cannot-sign)
      * SpecError (bad-spec)
      * TimingError (timing)
        * TimedOutputError (timed-output-mismatch)
      * TimingUnavailable (timing-unavailable)
      * UsageError (usage)
      * VerificationError (invalid-certificate)
        * CertificateFormatError (bad-certificate)
"""

from __future__ import annotations


class KcertError(Exception):
    """A failure a person can act on."""

    #: Short stable slug used by the API's problem ``type`` and by ``--json``.
    kind: str = "error"

    def diagnostics(self) -> str:
        """Text that says what went wrong and what to do about it."""
        return str(self)


class UsageError(KcertError):
    """Bad arguments or environment outside any one package (exit code 2)."""

    kind = "usage"

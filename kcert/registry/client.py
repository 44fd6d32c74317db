"""One interface to a registry, embedded or remote, for the CLI and for scripts.

:class:`EmbeddedRegistry` calls the library functions on a local database
(SQLite in ``KCERT_HOME`` unless ``KCERT_DATABASE_URL`` says otherwise), with
no server and no token: whoever can write the file owns it.
:class:`RemoteRegistry` (in :mod:`kcert.registry.remote`, which loads no
database code) speaks the HTTP API and raises the same :class:`RegistryError`
classes, so a caller sees the same answers and the same errors either way.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from kcert.attest.dsse import Envelope
from kcert.digest import Digest
from kcert.registry import (
    certificates,
    decisions,
    keys,
    observations,
    perf,
    targets,
    tokens,
)
from kcert.registry.config import Settings
from kcert.registry.db import engine_for, ensure_migrated, read_session, write_session
from kcert.registry.models import (
    ApiTokenCreate,
    ApiTokenCreated,
    ApiTokenPublic,
    CertificatePublic,
    CertificateStored,
    GateDecision,
    PromotionPublic,
    TargetCreate,
    TargetPublic,
    TargetReported,
    TrustedKeyCreate,
    TrustedKeyPublic,
)
from kcert.registry.observation_models import (
    PerfIngest,
    PerfIngested,
    TargetPolicyPublic,
    TargetPolicyUpdate,
)
from kcert.registry.perf import PerfComparison
from kcert.registry.remote import Registry as Registry
from kcert.registry.remote import RemoteRegistry as RemoteRegistry
from kcert.registry.remote import open_registry as open_registry
from kcert.registry.remote import problem_error as problem_error


class EmbeddedRegistry:
    """The registry library on a local database, migrated to head when opened."""

    def __init__(self, settings: Settings, *, engine: Engine | None = None) -> None:
        url = settings.resolved_database_url()
        self.engine = engine or engine_for(url)
        self.home = settings.home
        self.where = f"embedded registry ({self.engine.url.render_as_string(hide_password=True)})"
        ensure_migrated(self.engine)

    def close(self) -> None:
        """Nothing to release: the engine is shared by the process (``engine_for``)."""

    def push(self, envelope: Envelope) -> CertificateStored:
        with write_session(self.engine) as session:
            return certificates.store_certificate(session=session, envelope=envelope)

    def gate(self, kernel: Digest, target: str) -> GateDecision:
        with read_session(self.engine) as session:
            unhealthy = self._log_unhealthy(session)
            if unhealthy is not None:  # fail closed, as the server's gate does
                return GateDecision(allow=False, reasons=[unhealthy], certificate=None)
            session.rollback()
            decision = decisions.gate(session=session, kernel=kernel, target=target)
        return GateDecision(
            allow=decision.allow, reasons=list(decision.reasons), certificate=decision.certificate
        )

    def _log_unhealthy(self, session: Session) -> str | None:
        """Why the log does not extend its last signed checkpoint, if it has one and does not."""
        # lazy: kcert.registry.checkpoints imports this module back (a cycle inside the package)
        from kcert.registry.audit import log_signer
        from kcert.registry.checkpoints import CHECKPOINT_FILE, CheckpointGuard
        from kcert.registry.errors import LogInconsistent

        if not (self.home / CHECKPOINT_FILE).exists():
            return None  # nothing signed yet here: nothing to hold the database to
        try:
            CheckpointGuard(self.home, log_signer(self.home)).check(session)
        except LogInconsistent as exc:
            return f"the registry's audit log is unhealthy (log-inconsistent): {exc}"
        return None

    def promote(
        self, kernel: Digest, target: str, replaces: Digest | None = None
    ) -> PromotionPublic:
        with write_session(self.engine) as session:
            return decisions.promote(
                session=session, kernel=kernel, target=target, replaces=replaces
            )

    def report_target(self, name: str, report: TargetCreate) -> TargetReported:
        with write_session(self.engine) as session:
            return targets.report_target(session=session, name=name, report=report)

    def get_target(self, name: str) -> TargetPublic:
        with read_session(self.engine) as session:
            return targets.get_target(session=session, name=name)

    def revoke_certificate(self, certificate: str, reason: str) -> CertificatePublic:
        with write_session(self.engine) as session:
            return certificates.revoke_certificate(
                session=session, certificate=certificate, reason=reason
            )

    def trust_key(self, key: TrustedKeyCreate) -> TrustedKeyPublic:
        with write_session(self.engine) as session:
            return keys.trust_key(session=session, key=key)[0]

    def revoke_key(self, keyid: str, reason: str) -> TrustedKeyPublic:
        with write_session(self.engine) as session:
            return keys.revoke_key(session=session, keyid=keyid, reason=reason)

    def create_token(self, request: ApiTokenCreate) -> ApiTokenCreated:
        with write_session(self.engine) as session:
            return tokens.create_token(session=session, request=request)

    def revoke_token(self, token_id: str) -> ApiTokenPublic:
        with write_session(self.engine) as session:
            return tokens.revoke_token(session=session, token_id=token_id)

    def set_target_policy(self, name: str, update: TargetPolicyUpdate) -> TargetPolicyPublic:
        with write_session(self.engine) as session:
            return observations.set_target_policy(session=session, target=name, update=update)

    def ingest_perf(self, ingest: PerfIngest) -> PerfIngested:
        with write_session(self.engine) as session:
            return perf.ingest_samples(session=session, ingest=ingest)

    def compare_perf(self, *, target: str, before: Digest, after: Digest, seed: int,
                     resamples: int) -> PerfComparison:  # fmt: skip
        with read_session(self.engine) as session:
            return perf.compare(session=session, target=target, before=str(before),
                                after=str(after), seed=seed, resamples=resamples)  # fmt: skip

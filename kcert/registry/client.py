"""One interface to a registry, embedded or remote, for the CLI and for scripts.

:class:`EmbeddedRegistry` calls the library functions on a local database
(SQLite in ``KCERT_HOME`` unless ``KCERT_DATABASE_URL`` says otherwise), with
no server and no token: whoever can write the file owns it.
:class:`RemoteRegistry` speaks the HTTP API with httpx and a bearer token, and
turns problem documents back into the same :class:`RegistryError` classes, so
a caller sees the same answers and the same errors either way.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from kcert.attest.dsse import Envelope
from kcert.digest import Digest
from kcert.registry import (
    certificates,
    decisions,
    errors,
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

M = TypeVar("M", bound=BaseModel)

#: Problem ``type`` slugs back to the errors they came from.
_ERRORS: dict[str, type[errors.RegistryError]] = {
    cls.kind: cls
    for cls in (
        errors.NotFound, errors.InvalidInput, errors.CertificateRejected, errors.KeyConflict,
        errors.Unauthenticated, errors.PolicyError, errors.RegistryUnavailable,
        errors.TooLarge,
    )
}  # fmt: skip


class Registry(Protocol):
    """What the CLI can ask of a registry."""

    where: str

    def push(self, envelope: Envelope) -> CertificateStored: ...
    def gate(self, kernel: Digest, target: str) -> GateDecision: ...
    def promote(
        self, kernel: Digest, target: str, replaces: Digest | None = None
    ) -> PromotionPublic: ...
    def report_target(self, name: str, report: TargetCreate) -> TargetReported: ...
    def get_target(self, name: str) -> TargetPublic: ...
    def revoke_certificate(self, certificate: str, reason: str) -> CertificatePublic: ...
    def trust_key(self, key: TrustedKeyCreate) -> TrustedKeyPublic: ...
    def revoke_key(self, keyid: str, reason: str) -> TrustedKeyPublic: ...
    def create_token(self, request: ApiTokenCreate) -> ApiTokenCreated: ...
    def revoke_token(self, token_id: str) -> ApiTokenPublic: ...
    def set_target_policy(self, name: str, update: TargetPolicyUpdate) -> TargetPolicyPublic: ...
    def ingest_perf(self, ingest: PerfIngest) -> PerfIngested: ...
    def compare_perf(self, *, target: str, before: Digest, after: Digest, seed: int,
                     resamples: int) -> PerfComparison: ...  # fmt: skip
    def close(self) -> None: ...


def open_registry(settings: Settings, url: str | None = None) -> Registry:
    """The remote registry at ``url`` (or ``KCERT_REGISTRY``), else the embedded one."""
    target = url or settings.registry
    if target:
        token = settings.token.get_secret_value() if settings.token else None
        return RemoteRegistry(target, token=token)
    return EmbeddedRegistry(settings)


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


class RemoteRegistry:
    """A registry server, over HTTP(S)."""

    def __init__(
        self, url: str, *, token: str | None, client: httpx.Client | None = None,
        timeout_s: float = 30.0,
    ) -> None:  # fmt: skip
        self.where = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = client or httpx.Client(base_url=self.where, timeout=timeout_s)
        self.client.headers.update(headers)

    def close(self) -> None:
        self.client.close()

    def push(self, envelope: Envelope) -> CertificateStored:
        return self._call("POST", "/v1/certificates", CertificateStored, json=envelope.to_json())

    def gate(self, kernel: Digest, target: str) -> GateDecision:
        params = {"kernel": str(kernel), "target": target}
        return self._call("GET", "/v1/gate", GateDecision, params=params)

    def promote(
        self, kernel: Digest, target: str, replaces: Digest | None = None
    ) -> PromotionPublic:
        body = {"kernel": str(kernel), "target": target}
        if replaces is not None:
            body["replaces"] = str(replaces)
        return self._call("POST", "/v1/promotions", PromotionPublic, json=body)

    def report_target(self, name: str, report: TargetCreate) -> TargetReported:
        body = report.model_dump(exclude_none=True)
        return self._call("PUT", f"/v1/targets/{name}", TargetReported, json=body)

    def get_target(self, name: str) -> TargetPublic:
        return self._call("GET", f"/v1/targets/{name}", TargetPublic)

    def revoke_certificate(self, certificate: str, reason: str) -> CertificatePublic:
        path = f"/v1/certificates/{certificate}/revoke"
        return self._call("POST", path, CertificatePublic, json={"reason": reason})

    def trust_key(self, key: TrustedKeyCreate) -> TrustedKeyPublic:
        return self._call("POST", "/v1/keys", TrustedKeyPublic, json=key.model_dump())

    def revoke_key(self, keyid: str, reason: str) -> TrustedKeyPublic:
        return self._call(
            "DELETE", f"/v1/keys/{keyid}", TrustedKeyPublic, params={"reason": reason}
        )

    def create_token(self, request: ApiTokenCreate) -> ApiTokenCreated:
        body = request.model_dump(mode="json", exclude_none=True)
        return self._call("POST", "/v1/tokens", ApiTokenCreated, json=body)

    def revoke_token(self, token_id: str) -> ApiTokenPublic:
        return self._call("DELETE", f"/v1/tokens/{token_id}", ApiTokenPublic)

    def set_target_policy(self, name: str, update: TargetPolicyUpdate) -> TargetPolicyPublic:
        body = update.model_dump(mode="json")
        return self._call("PUT", f"/v1/targets/{name}/policy", TargetPolicyPublic, json=body)

    def ingest_perf(self, ingest: PerfIngest) -> PerfIngested:
        return self._call("POST", "/v1/perf", PerfIngested, json=ingest.model_dump(mode="json"))

    def compare_perf(self, *, target: str, before: Digest, after: Digest, seed: int,
                     resamples: int) -> PerfComparison:  # fmt: skip
        params: dict[str, Any] = {"target": target, "before": str(before), "after": str(after),
                                  "seed": seed, "resamples": resamples}  # fmt: skip
        return self._call("GET", "/v1/perf/compare", PerfComparison, params=params)

    def _call(self, method: str, path: str, model: type[M], **kwargs: Any) -> M:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise errors.RegistryUnavailable(
                f"cannot reach the registry at {self.where}: {type(exc).__name__}: {exc}"
            ) from exc
        if response.status_code >= 400:
            raise problem_error(response)
        try:
            return model.model_validate(response.json())
        except (ValueError, ValidationError) as exc:
            raise errors.RegistryUnavailable(
                f"the registry at {self.where} answered {path} with something that is not "
                f"a kcert {model.__name__}"
            ) from exc


def problem_error(response: httpx.Response) -> errors.RegistryError:
    """The :class:`RegistryError` a problem document stands for."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    kind = str(body.get("type", "")).rsplit("/", 1)[-1]
    detail = str(body.get("detail") or f"HTTP {response.status_code}")
    if kind == errors.PromotionDenied.kind:
        reasons = [str(r) for r in body.get("reasons", [])]
        log_index = body.get("log_index")
        return errors.PromotionDenied(
            detail, reasons=reasons, log_index=log_index if isinstance(log_index, int) else None
        )
    if kind == errors.Forbidden.kind:
        return errors.Forbidden(detail, needed=str(body.get("scope", "")))
    cls = _ERRORS.get(kind)
    if cls is not None:
        return cls(detail)
    if response.status_code == 401:
        return errors.Unauthenticated(f"{detail}; set KCERT_TOKEN to a token of this registry")
    if response.status_code == 404:
        return errors.NotFound(detail)
    return errors.InvalidInput(
        f"the registry refused the request ({response.status_code}): {detail}"
    )

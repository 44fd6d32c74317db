"""A registry server over HTTP, and :func:`open_registry`, which picks it or the embedded one.

:class:`RemoteRegistry` speaks the HTTP API with httpx and a bearer token, and
turns problem documents back into the same :class:`RegistryError` classes that
the embedded registry raises. This module stays free of SQLModel, SQLAlchemy and
Alembic (``kcert gate`` in a deploy script starts in a fraction of a second):
the answers' models are imported by the methods that return them, and the
embedded registry (:mod:`kcert.registry.client`) only when no server is named.
Nor does it need pydantic-settings to find the server: :func:`open_registry`
reads ``KCERT_REGISTRY`` and ``KCERT_TOKEN`` through
:func:`kcert.registry.envvars.client_settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from kcert.digest import Digest
from kcert.registry import errors
from kcert.registry.envvars import client_settings
from kcert.registry.wire import GateDecision

if TYPE_CHECKING:
    from kcert.attest.dsse import Envelope
    from kcert.registry.config import Settings
    from kcert.registry.models import (
        ApiTokenCreate,
        ApiTokenCreated,
        ApiTokenPublic,
        CertificatePublic,
        CertificateStored,
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


def open_registry(settings: Settings | None = None, url: str | None = None) -> Registry:
    """The remote registry at ``url`` (or ``KCERT_REGISTRY``), else the embedded one.

    ``settings`` default to the environment's: a server's address and token are then read
    without pydantic-settings, and the whole :class:`Settings` only for an embedded registry.
    """
    if settings is None:
        client = client_settings()
        target, token = url or client.registry, client.token
    else:
        target = url or settings.registry
        token = settings.token.get_secret_value() if settings.token else None
    if target:
        return RemoteRegistry(target, token=token)
    # lazy: kcert.registry.client imports this module back; only an embedded registry needs it
    from kcert.registry.client import EmbeddedRegistry
    from kcert.registry.config import Settings

    return EmbeddedRegistry(Settings() if settings is None else settings)


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
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import CertificateStored

        return self._call("POST", "/v1/certificates", CertificateStored, json=envelope.to_json())

    def gate(self, kernel: Digest, target: str) -> GateDecision:
        params = {"kernel": str(kernel), "target": target}
        return self._call("GET", "/v1/gate", GateDecision, params=params)

    def promote(
        self, kernel: Digest, target: str, replaces: Digest | None = None
    ) -> PromotionPublic:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import PromotionPublic

        body = {"kernel": str(kernel), "target": target}
        if replaces is not None:
            body["replaces"] = str(replaces)
        return self._call("POST", "/v1/promotions", PromotionPublic, json=body)

    def report_target(self, name: str, report: TargetCreate) -> TargetReported:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import TargetReported

        body = report.model_dump(exclude_none=True)
        return self._call("PUT", f"/v1/targets/{name}", TargetReported, json=body)

    def get_target(self, name: str) -> TargetPublic:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import TargetPublic

        return self._call("GET", f"/v1/targets/{name}", TargetPublic)

    def revoke_certificate(self, certificate: str, reason: str) -> CertificatePublic:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import CertificatePublic

        path = f"/v1/certificates/{certificate}/revoke"
        return self._call("POST", path, CertificatePublic, json={"reason": reason})

    def trust_key(self, key: TrustedKeyCreate) -> TrustedKeyPublic:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import TrustedKeyPublic

        return self._call("POST", "/v1/keys", TrustedKeyPublic, json=key.model_dump())

    def revoke_key(self, keyid: str, reason: str) -> TrustedKeyPublic:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import TrustedKeyPublic

        return self._call(
            "DELETE", f"/v1/keys/{keyid}", TrustedKeyPublic, params={"reason": reason}
        )

    def create_token(self, request: ApiTokenCreate) -> ApiTokenCreated:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import ApiTokenCreated

        body = request.model_dump(mode="json", exclude_none=True)
        return self._call("POST", "/v1/tokens", ApiTokenCreated, json=body)

    def revoke_token(self, token_id: str) -> ApiTokenPublic:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.models import ApiTokenPublic

        return self._call("DELETE", f"/v1/tokens/{token_id}", ApiTokenPublic)

    def set_target_policy(self, name: str, update: TargetPolicyUpdate) -> TargetPolicyPublic:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.observation_models import TargetPolicyPublic

        body = update.model_dump(mode="json")
        return self._call("PUT", f"/v1/targets/{name}/policy", TargetPolicyPublic, json=body)

    def ingest_perf(self, ingest: PerfIngest) -> PerfIngested:
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.observation_models import PerfIngested

        return self._call("POST", "/v1/perf", PerfIngested, json=ingest.model_dump(mode="json"))

    def compare_perf(self, *, target: str, before: Digest, after: Digest, seed: int,
                     resamples: int) -> PerfComparison:  # fmt: skip
        # lazy: the remote client never loads the database models (SQLModel, SQLAlchemy)
        from kcert.registry.perf import PerfComparison

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

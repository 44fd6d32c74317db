"""The registry's tables and the models its API reads and writes.

One family per table, so a client never sees a row's private fields:
``XBase`` holds the shared fields,
``XCreate`` is what a client sends, ``X(table=True)`` is the row and
``XPublic`` is what a client gets back. The schema itself is made only by the
Alembic migrations in ``kcert/registry/migrations/versions``; these classes describe it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Strict,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic import Field as PydanticField
from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    Text,
    UniqueConstraint,
    false,
)
from sqlmodel import Field, SQLModel

from kcert.digest import Digest, DigestError

# Defined without SQLModel so that a client of a server can read them (see wire's docstring).
from kcert.registry.wire import GateDecision as GateDecision
from kcert.registry.wire import Scope as Scope

#: Names of targets and keys: printable, no slashes (they appear in URL paths).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"
HW_CLASS_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
DIGEST_PATTERN = r"^(sha256:)?[0-9a-f]{64}$"
#: Free text (reasons, descriptions): anything but NUL, which PostgreSQL cannot store.
TEXT_PATTERN = r"^[^\x00]*$"

#: What a client sends: an unknown field is a mistake to report, not to ignore. (Typed as
#: SQLModel's own config, which is pydantic's ``ConfigDict`` with a few more keys.)
REQUEST_CONFIG: Any = ConfigDict(extra="forbid")

#: Environments are a few dozen short scalar fields (``kcert.certify.environment``); a
#: bound on each keeps every answer that carries one small and serializable.
MAX_ENVIRONMENT_FIELDS = 256
MAX_ENVIRONMENT_VALUE_CHARS = 1024
#: Integers that survive RFC 8785 (the log digests the environment canonically).
_SAFE_INT = 2**53 - 1



def _not_an_integer(value: Any) -> Any:
    # A strict float still takes an int: 2**64 would come back as 1.8446744073709552e19.
    if isinstance(value, int):
        raise ValueError(f"integers are at most {_SAFE_INT} in magnitude")
    return value


EnvironmentKey = Annotated[str, StringConstraints(min_length=1, max_length=128,
                                                  pattern=TEXT_PATTERN)]  # fmt: skip
EnvironmentValue = (
    Annotated[str, StringConstraints(max_length=MAX_ENVIRONMENT_VALUE_CHARS, pattern=TEXT_PATTERN)]
    | Annotated[int, Strict(), PydanticField(ge=-_SAFE_INT, le=_SAFE_INT)]
    | Annotated[
        float, Strict(), PydanticField(allow_inf_nan=False), BeforeValidator(_not_an_integer)
    ]
    | Annotated[bool, Strict()]
    | None
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _when() -> Any:
    return Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


def _maybe_when() -> Any:
    return Field(default=None, sa_type=DateTime(timezone=True))


class PromotionStatus(StrEnum):
    ACTIVE = "active"
    SUSPENDED = "suspended"


# --- trusted keys -------------------------------------------------------------------------


class TrustedKeyBase(SQLModel):
    name: str = Field(min_length=1, max_length=128, schema_extra={"pattern": NAME_PATTERN})


class TrustedKeyCreate(TrustedKeyBase):
    model_config = REQUEST_CONFIG

    #: Hex of the raw 32-byte Ed25519 public key.
    public_key: str = Field(
        min_length=64, max_length=64, schema_extra={"pattern": r"^[0-9a-fA-F]{64}$"}
    )

    @field_validator("public_key")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class TrustedKey(TrustedKeyBase, table=True):
    __tablename__ = "trusted_key"

    keyid: str = Field(primary_key=True, max_length=64)
    public_key: str = Field(max_length=64)
    created_at: datetime = _when()
    revoked_at: datetime | None = _maybe_when()
    revoke_reason: str | None = Field(default=None, sa_type=Text)


class TrustedKeyPublic(TrustedKeyBase):
    keyid: str
    public_key: str
    created_at: datetime
    revoked_at: datetime | None = None
    revoke_reason: str | None = None


# --- certificates -------------------------------------------------------------------------


class CertificateBase(SQLModel):
    kernel_name: str = Field(max_length=256)
    source_digest: str = Field(max_length=71)
    keyid: str = Field(max_length=64, index=True)
    verdict: str = Field(max_length=16)
    hw_class: str = Field(max_length=64)
    #: Fingerprint of the certifying environment over the default drift fields.
    fingerprint: str = Field(max_length=71)


class Signature(BaseModel):
    model_config = REQUEST_CONFIG

    keyid: str | None = PydanticField(default=None, max_length=256)
    sig: str = PydanticField(max_length=4096)


class CertificateCreate(BaseModel):
    """A DSSE envelope, exactly as ``kcert certify`` writes it (DSSE defines no other fields)."""

    model_config = REQUEST_CONFIG

    payloadType: str = PydanticField(max_length=256)  # DSSE spells it so
    payload: str
    signatures: list[Signature] = PydanticField(min_length=1, max_length=16)

    def envelope(self) -> dict[str, Any]:
        """The envelope as sent: unset defaults stay unset, so its id is unchanged."""
        return self.model_dump(exclude_unset=True)


class Certificate(CertificateBase, table=True):
    __tablename__ = "certificate"
    __table_args__ = (Index("ix_certificate_hw_fingerprint", "hw_class", "fingerprint"),)

    id: str = Field(primary_key=True, max_length=71)
    #: The canonical envelope as RFC 8785 JSON: only signatures that verify against a
    #: trusted key, one per key, ``keyid`` the real key id, sorted by it. The id is the
    #: SHA-256 of its DSSE PAE, not of this JSON.
    envelope: str = Field(sa_type=Text)
    #: The recorded environment fields, to fingerprint over a target's own drift fields.
    environment: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    #: Whether the certificate records that its kernel ran in the sandbox
    #: (:func:`kcert.registry.policy.records_sandbox`): false for ``--no-sandbox`` and for
    #: certificates that record nothing, so a row written without it is never trusted more.
    sandboxed: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    created_at: datetime = _when()
    revoked_at: datetime | None = _maybe_when()
    revoke_reason: str | None = Field(default=None, sa_type=Text)


class CertificateSubject(SQLModel, table=True):
    """Index from every subject digest (source, artifact) to its certificates."""

    __tablename__ = "certificate_subject"

    digest: str = Field(primary_key=True, max_length=71)
    certificate_id: str = Field(primary_key=True, foreign_key="certificate.id", max_length=71)
    name: str = Field(default="", max_length=512)


class CertificateAlias(SQLModel, table=True):
    """An id from before migration 0004 (``sha256`` of the envelope's canonical JSON) and
    the certificate it is now. The audit log keeps the old ids; replay resolves them here."""

    __tablename__ = "certificate_alias"

    old_id: str = Field(primary_key=True, max_length=71)
    certificate_id: str = Field(foreign_key="certificate.id", index=True, max_length=71)
    #: The envelope stored under ``old_id``, exactly: its canonical JSON hashes to it.
    envelope: str = Field(sa_type=Text)


class CertificatePublic(CertificateBase):
    id: str
    subjects: list[str]
    #: Made in the certifier's sandbox (the default policy refuses certificates that were not).
    sandboxed: bool = False
    created_at: datetime
    revoked_at: datetime | None = None
    revoke_reason: str | None = None


class CertificateStored(CertificatePublic):
    """Answer to a push: the certificate, and whether this push created it."""

    created: bool
    log_index: int | None = None


class CertificateRevoke(SQLModel):
    model_config = REQUEST_CONFIG

    reason: str = Field(min_length=1, max_length=2000, schema_extra={"pattern": TEXT_PATTERN})


# --- targets --------------------------------------------------------------------------------


class TargetBase(SQLModel):
    hw_class: str = Field(max_length=64, schema_extra={"pattern": HW_CLASS_PATTERN})


class TargetCreate(TargetBase):
    """What a target reports: its hardware, its environment and (optionally) its drift fields.

    The environment is flat: field names to strings, numbers, booleans or null.
    """

    model_config = REQUEST_CONFIG

    environment: dict[EnvironmentKey, EnvironmentValue] = Field(
        max_length=MAX_ENVIRONMENT_FIELDS
    )
    drift_fields: list[EnvironmentKey] | None = Field(default=None, min_length=1, max_length=64)

    @field_validator("drift_fields")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if any(not f or len(f) > 128 for f in value):
            raise ValueError("drift field names must be 1 to 128 characters")
        if len(set(value)) != len(value):
            raise ValueError("drift fields must not repeat")
        return value


class Target(TargetBase, table=True):
    __tablename__ = "target"

    name: str = Field(primary_key=True, max_length=128)
    fingerprint: str = Field(max_length=71)
    #: ``None`` means the default drift fields of ``kcert.certify.environment``.
    drift_fields: list[str] | None = Field(default=None, sa_type=JSON)
    environment: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    #: Bumped on every change of fingerprint, hardware or drift fields.
    generation: int = Field(default=1)
    created_at: datetime = _when()
    updated_at: datetime = _when()


class TargetHistory(SQLModel, table=True):
    """Every state a target has been in, oldest first."""

    __tablename__ = "target_history"

    id: int | None = Field(default=None, primary_key=True)
    target_name: str = Field(foreign_key="target.name", index=True, max_length=128)
    generation: int
    hw_class: str = Field(max_length=64)
    fingerprint: str = Field(max_length=71)
    drift_fields: list[str] | None = Field(default=None, sa_type=JSON)
    environment: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    reported_at: datetime = _when()


class TargetHistoryPublic(SQLModel):
    generation: int
    hw_class: str
    fingerprint: str
    drift_fields: list[str] | None
    reported_at: datetime


class StaleCertificate(SQLModel, table=True):
    """A certificate that was valid for a target until the target drifted away from it."""

    __tablename__ = "stale_certificate"

    id: int | None = Field(default=None, primary_key=True)
    certificate_id: str = Field(foreign_key="certificate.id", index=True, max_length=71)
    target_name: str = Field(foreign_key="target.name", index=True, max_length=128)
    generation: int
    old_fingerprint: str = Field(max_length=71)
    new_fingerprint: str = Field(max_length=71)
    marked_at: datetime = _when()


class StaleCertificatePublic(SQLModel):
    certificate_id: str
    generation: int
    old_fingerprint: str
    new_fingerprint: str
    marked_at: datetime


class TargetPublic(TargetBase):
    name: str
    fingerprint: str
    drift_fields: list[str]
    environment: dict[str, Any]
    generation: int
    created_at: datetime
    updated_at: datetime
    history: list[TargetHistoryPublic] = []
    stale: list[StaleCertificatePublic] = []


class TargetReported(TargetPublic):
    """Answer to a report: the target and what this report changed."""

    created: bool
    changed: bool
    stale_certificates: list[str]
    suspended_promotions: list[str]


# --- promotions -----------------------------------------------------------------------------


class PromotionBase(SQLModel):
    kernel: str = Field(max_length=71, schema_extra={"pattern": DIGEST_PATTERN})
    target: str = Field(max_length=128, schema_extra={"pattern": NAME_PATTERN})

    @field_validator("kernel")
    @classmethod
    def _canonical(cls, value: str) -> str:
        try:
            return str(Digest.parse(value))
        except DigestError as exc:
            raise ValueError(exc.diagnostics()) from exc


class PromotionCreate(PromotionBase):
    model_config = REQUEST_CONFIG

    #: The kernel this one replaces on the target (its latency is the canary's yardstick).
    replaces: str | None = Field(default=None, max_length=71,
                                 schema_extra={"pattern": DIGEST_PATTERN})  # fmt: skip

    @field_validator("replaces")
    @classmethod
    def _canonical_replaces(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return str(Digest.parse(value))
        except DigestError as exc:
            raise ValueError(exc.diagnostics()) from exc


class Promotion(SQLModel, table=True):
    __tablename__ = "promotion"
    __table_args__ = (UniqueConstraint("kernel", "target_name", name="uq_promotion_kernel"),)

    id: int | None = Field(default=None, primary_key=True)
    kernel: str = Field(max_length=71)
    target_name: str = Field(foreign_key="target.name", index=True, max_length=128)
    status: str = Field(max_length=16)
    certificate_id: str = Field(foreign_key="certificate.id", max_length=71)
    granted_at: datetime = _when()
    suspended_at: datetime | None = _maybe_when()
    suspend_reason: str | None = Field(default=None, sa_type=Text)
    #: Audit-log index of the decision that granted it.
    log_index: int | None = None


class PromotionPublic(PromotionBase):
    status: PromotionStatus
    certificate: str
    granted_at: datetime
    suspended_at: datetime | None = None
    suspend_reason: str | None = None
    reasons: list[str] = []
    log_index: int | None = None


# --- tokens ---------------------------------------------------------------------------------


class ApiTokenBase(SQLModel):
    description: str | None = Field(
        default=None, max_length=256, schema_extra={"pattern": TEXT_PATTERN}
    )


class ApiTokenCreate(ApiTokenBase):
    model_config = REQUEST_CONFIG

    scopes: list[Scope] = Field(min_length=1, max_length=8)
    #: Lifetime in seconds; none means the token does not expire. An integer only: JSON's
    #: ``true`` is not 1 second, nor ``"60"`` a minute.
    expires_in: Annotated[int, Strict()] | None = Field(
        default=None, gt=0, le=10 * 365 * 24 * 3600
    )
    #: The targets this token may report for (``observations:write``: guard reports and
    #: perf samples). An ``observations:write`` token needs a list, or ``all_targets``.
    targets: list[Annotated[str, StringConstraints(pattern=NAME_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=64
    )
    #: Say so to make an ``observations:write`` token that may report for every target.
    all_targets: Annotated[bool, Strict()] = False

    @model_validator(mode="after")
    def _targets_bound(self) -> ApiTokenCreate:
        writes = Scope.OBSERVATIONS_WRITE in self.scopes
        if self.targets is not None and self.all_targets:
            raise ValueError("give either targets or all_targets, not both")
        if self.targets is not None and not writes:
            raise ValueError("targets bind only the observations:write scope; this token "
                             "does not have it")  # fmt: skip
        if writes and self.targets is None and not self.all_targets:
            raise ValueError("an observations:write token must name the targets it reports "
                             "for (targets), or say all_targets explicitly")  # fmt: skip
        return self


class ApiToken(ApiTokenBase, table=True):
    __tablename__ = "api_token"

    id: str = Field(primary_key=True, max_length=32)
    #: SHA-256 (hex) of the token; the token itself is never stored.
    token_hash: str = Field(max_length=64, unique=True, index=True)
    scopes: list[str] = Field(default_factory=list, sa_type=JSON)
    #: The targets it may report for; None: every target (see :class:`ApiTokenCreate`).
    targets: list[str] | None = Field(default=None, sa_type=JSON)
    created_at: datetime = _when()
    expires_at: datetime | None = _maybe_when()
    revoked_at: datetime | None = _maybe_when()


class ApiTokenPublic(ApiTokenBase):
    id: str
    scopes: list[Scope]
    #: The targets it may report for (``observations:write``); None: every target.
    targets: list[str] | None = None
    created_at: datetime
    expires_at: datetime | None = None
    #: Set once the token is revoked (``DELETE /v1/tokens/{id}``).
    revoked_at: datetime | None = None


class ApiTokenCreated(ApiTokenPublic):
    #: Shown once: only its hash is kept.
    token: str


#: The id of the single ``registry_version`` row.
REGISTRY_VERSION_ID = 1


class RegistryVersion(SQLModel, table=True):
    """A counter that database triggers raise on every write to a table the gate reads.

    Made with its triggers by the migration ``0006_registry_version``; the gate's
    cache (:mod:`kcert.registry.gatekeeper`) reuses an answer only at the version it
    was computed at.
    """

    __tablename__ = "registry_version"

    id: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    version: int = Field(sa_column=Column(BigInteger, nullable=False))


# The runtime observation tables share this metadata (imported last: they build on the above).
from kcert.registry import observation_models as _observation_models  # noqa: E402, F401, I001

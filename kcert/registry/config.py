"""The one settings object of kcert's registry, its server and its clients.

Every value comes from a ``KCERT_*`` environment variable (pydantic-settings).
The variables' names and defaults are one table, :mod:`kcert.registry.envvars`,
which a client of a registry server also reads, without pydantic-settings, for
the two it needs (``KCERT_REGISTRY``, ``KCERT_TOKEN``). Secrets are
``SecretStr`` so a token never lands in a log line or a repr by accident.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kcert.registry.envvars import DEFAULTS, ENV_PREFIX

REGISTRY_DB_NAME = "registry.db"


class WitnessConfig(BaseModel):
    """A C2SP tlog-witness the registry submits its checkpoints to."""

    model_config = ConfigDict(extra="forbid")

    #: The witness's submission prefix (``POST <url>/add-checkpoint``).
    url: str = Field(min_length=1, max_length=2048)
    #: Its cosignature/v1 verifier key, ``name+keyid+base64(0x04 || key)``.
    vkey: str = Field(min_length=1, max_length=512)


class Settings(BaseSettings):
    """Configuration read from ``KCERT_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    #: Where the embedded registry (and other local state) lives.
    home: Path = Field(default=Path(DEFAULTS.home))
    #: SQLAlchemy URL; by default a SQLite file in ``home``.
    database_url: str | None = DEFAULTS.database_url
    #: The first admin token of a server; stored nowhere, compared by hash.
    admin_token: SecretStr | None = DEFAULTS.admin_token
    #: Requests larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = Field(default=DEFAULTS.max_body_bytes, gt=0)
    #: Evidence of one runtime mismatch (decoded bytes); larger evidence is refused (413).
    observation_evidence_max: int = Field(default=DEFAULTS.observation_evidence_max, gt=0)
    #: The body cap of ``POST /v1/observations`` alone: a batch carries evidence.
    observation_max_body_bytes: int = Field(default=DEFAULTS.observation_max_body_bytes, gt=0)
    #: A remote registry for the CLI; none means the embedded one.
    registry: str | None = DEFAULTS.registry
    #: Bearer token the CLI sends to a remote registry.
    token: SecretStr | None = DEFAULTS.token
    #: Witnesses for the log's checkpoints, as JSON: ``[{"url": ..., "vkey": ...}]``.
    witnesses: list[WitnessConfig] = Field(default_factory=lambda: list(DEFAULTS.witnesses))
    #: Seconds to wait for one witness's answer.
    witness_timeout: float = Field(default=DEFAULTS.witness_timeout, gt=0, le=60)
    #: A server signs (and submits to witnesses) each new tree within this many seconds; 0: off.
    checkpoint_interval: float = Field(default=DEFAULTS.checkpoint_interval, ge=0, le=3600)

    @field_validator("home")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("database_url", "registry")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value or None

    def resolved_database_url(self) -> str:
        """The database to use: ``KCERT_DATABASE_URL`` or SQLite in ``KCERT_HOME``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / REGISTRY_DB_NAME}"

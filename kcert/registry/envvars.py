"""The ``KCERT_*`` environment variables: one table of their names and defaults.

Each field of :class:`Defaults` is one variable, ``KCERT_`` and the field's
name. The server reads them all through pydantic-settings
(:class:`kcert.registry.config.Settings`, whose fields take their defaults
from :data:`DEFAULTS`). A client of a registry server (``kcert gate`` in a
deploy script, and the other remote commands) needs two of them, the server's
address and its token: :func:`client_settings` reads those with the standard
library, because importing pydantic-settings alone costs such a command a
tenth of a second. Both read a variable alike: its name in any case, an
empty value as unset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

ENV_PREFIX = "KCERT_"


@dataclass(frozen=True, slots=True)
class Defaults:
    """Each setting's default (``None``: unset); what each means is said on ``Settings``."""

    home: str = "~/.kcert"
    database_url: None = None
    admin_token: None = None
    max_body_bytes: int = 4 * 1024 * 1024
    observation_evidence_max: int = 4 * 1024 * 1024
    observation_max_body_bytes: int = 64 * 1024 * 1024
    registry: None = None
    token: None = None
    witnesses: tuple[()] = ()
    witness_timeout: float = 5.0
    checkpoint_interval: float = 1.0


DEFAULTS = Defaults()


def env_name(setting: str) -> str:
    """The variable a setting is read from: ``registry`` -> ``KCERT_REGISTRY``."""
    if setting not in Defaults.__dataclass_fields__:
        raise KeyError(f"no kcert setting is called {setting!r}")
    return ENV_PREFIX + setting.upper()


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What a client of a registry server reads: the server's address and the token to send."""

    registry: str | None
    #: Out of the repr, as ``Settings`` keeps it in a ``SecretStr``: never in a log line.
    token: str | None = field(repr=False)


def client_settings(environ: Mapping[str, str] | None = None) -> ClientSettings:
    """``KCERT_REGISTRY`` and ``KCERT_TOKEN`` from ``environ`` (default: this process's),
    read as ``Settings`` reads them."""
    source = os.environ if environ is None else environ
    # pydantic-settings matches a name in any case (case_sensitive=False), the last one read
    # winning; an empty value is unset (Settings: an empty registry URL is None, and an empty
    # token is never sent).
    folded = {name.lower(): value for name, value in source.items()}
    registry = folded.get(env_name("registry").lower()) or DEFAULTS.registry
    token = folded.get(env_name("token").lower()) or DEFAULTS.token
    return ClientSettings(registry=registry, token=token)

"""The KCERT_* table: Settings and the client's light reader agree on names, defaults and values."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import pytest

from kcert.registry.config import Settings
from kcert.registry.envvars import DEFAULTS, ENV_PREFIX, Defaults, client_settings, env_name


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def test_the_table_has_one_row_per_setting() -> None:
    assert {f.name for f in fields(Defaults)} == set(Settings.model_fields)


def test_settings_take_their_defaults_from_the_table(clean_env: pytest.MonkeyPatch) -> None:
    settings = Settings()
    expected = {f.name: getattr(DEFAULTS, f.name) for f in fields(Defaults)}
    expected["home"] = Path(DEFAULTS.home).expanduser()
    expected["witnesses"] = list(DEFAULTS.witnesses)
    assert settings.model_dump() == expected


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"KCERT_REGISTRY": "http://127.0.0.1:8700", "KCERT_TOKEN": "s3cret"},
        # pydantic-settings matches names in any case
        {"kcert_registry": "http://b.example", "Kcert_Token": "x"},
        # empty is unset: no server, no Authorization header
        {"KCERT_REGISTRY": "", "KCERT_TOKEN": ""},
        {"KCERT_REGISTRY": " http://spaced ", "KCERT_TOKEN": " t "},
        # other settings, even invalid ones, are not the client's business
        {"KCERT_REGISTRY": "http://c", "KCERT_HOME": "/tmp/h"},
    ],
)  # fmt: skip
def test_the_client_reads_registry_and_token_as_settings_do(
    clean_env: pytest.MonkeyPatch, environ: dict[str, str]
) -> None:
    for name, value in environ.items():
        clean_env.setenv(name, value)
    settings = Settings()
    client = client_settings()
    assert client.registry == settings.registry
    assert client.token == (settings.token.get_secret_value() if settings.token else None)
    assert client_settings(environ) == client


def test_the_token_stays_out_of_the_repr() -> None:
    client = client_settings({"KCERT_REGISTRY": "http://r", "KCERT_TOKEN": "s3cret-token"})
    assert client.token == "s3cret-token"
    assert "s3cret" not in repr(client)
    assert "http://r" in repr(client)


def test_variable_names_come_from_the_table() -> None:
    assert env_name("registry") == "KCERT_REGISTRY"
    assert env_name("database_url") == "KCERT_DATABASE_URL"
    with pytest.raises(KeyError, match="regsitry"):
        env_name("regsitry")

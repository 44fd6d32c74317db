"""Fixtures of the reliability tests: real ``kcert serve`` processes over SQLite or PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from reliability_server import RegistryServer

from kcert.attest.keys import generate_private_key
from kcert.registry.testing import postgres_database, postgres_reachable

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'home' / 'registry.db'}"
        return
    reason = postgres_reachable()
    if reason is not None:
        pytest.skip(reason)
    with postgres_database() as url:
        yield url


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[list[RegistryServer]]:
    """Servers made in a test; all stopped at its end."""
    made: list[RegistryServer] = []
    yield made
    for server in made:
        server.stop()


@pytest.fixture
def server(
    tmp_path: Path, database_url: str, server_factory: list[RegistryServer]
) -> RegistryServer:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    srv = RegistryServer(home, database_url)
    server_factory.append(srv)
    srv.start()
    return srv


@pytest.fixture(scope="session")
def signing_key() -> Ed25519PrivateKey:
    return generate_private_key()

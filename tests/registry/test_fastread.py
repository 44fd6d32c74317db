"""The gate's reads on the driver's own cursor: SQLAlchemy's rows, read-only connections, and
version reads that concurrent requests share without ever reading before they asked."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, Select, func, literal_column, select, text

from kcert.attest.keys import public_key_hex
from kcert.digest import Digest
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.decisions import candidates_statement
from kcert.registry.errors import RegistryUnavailable
from kcert.registry.fastread import CompiledRead, read_connections
from kcert.registry.gatekeeper import _VERSION, _VERSION_TOKEN_TARGET, SharedReads
from kcert.registry.models import ApiTokenCreate, Scope, TargetCreate, TrustedKeyCreate
from kcert.registry.testing import gpu_environment, make_certificate
from kcert.registry.tokens import hash_token


def read_all(engine: Engine, statement: Select[Any], values: Mapping[str, Any]) -> list[Any]:
    async def run() -> list[Any]:
        reads = read_connections(engine)
        try:
            async with reads.session() as reader:
                return await reader.all(CompiledRead(statement, engine.dialect), values)
        finally:
            reads.close()

    return asyncio.run(run())


@pytest.fixture
def populated(
    engine: Engine, database_url: str, signing_key: Ed25519PrivateKey
) -> dict[str, dict[str, Any]]:
    """Every kind of value the gate reads: JSON lists and objects, datetimes, NULLs."""
    registry = EmbeddedRegistry(Settings(database_url=database_url), engine=engine)
    public = public_key_hex(signing_key.public_key())
    registry.trust_key(TrustedKeyCreate(name="ci", public_key=public))
    good = make_certificate(signing_key, source="kernel a")
    other = gpu_environment(nvrtc="12.9")
    bad = make_certificate(signing_key, source="kernel a", environment=other)
    registry.push(good.envelope)
    registry.push(bad.envelope)
    registry.revoke_certificate(bad.id, "test")
    registry.report_target("prod", TargetCreate(
        hw_class="H100", environment=gpu_environment(),
        drift_fields=["gpu_name", "driver_version", "nvrtc"]))  # fmt: skip
    registry.promote(Digest.parse(good.kernel), "prod")
    token = registry.create_token(ApiTokenCreate(scopes=[Scope.GATE_READ, Scope.PROMOTE],
                                                 expires_in=3600))  # fmt: skip
    hot = {"token_hash": hash_token(token.token), "target": "prod", "kernel": good.kernel}
    return {
        "hot": hot,
        "unknown": {**hot, "token_hash": hash_token("nobody"), "target": "nowhere"},
        "candidates": {"kernel": good.kernel},
    }


@pytest.mark.parametrize(
    ("statement", "values"),
    [
        (_VERSION, None),
        (_VERSION_TOKEN_TARGET, "hot"),
        (_VERSION_TOKEN_TARGET, "unknown"),
        (candidates_statement(environment=True), "candidates"),
        (candidates_statement(environment=False), "candidates"),
    ],
    ids=["version", "token-target", "unknown-token-target", "candidates-env", "candidates"],
)
def test_compiled_reads_return_exactly_what_sqlalchemy_returns(
    engine: Engine, populated: dict[str, dict[str, Any]], statement: Select[Any],
    values: str | None,
) -> None:  # fmt: skip
    params = populated[values] if values else {}
    with engine.connect() as conn:
        expected = conn.execute(statement, params).all()
    got = read_all(engine, statement, params)
    assert expected, "the fixture must give every statement rows to compare"
    assert [r._fields for r in got] == [tuple(r._mapping.keys()) for r in expected]
    # Same values and same Python types: JSON decoded, datetimes as datetimes.
    assert [tuple(r) for r in got] == [tuple(r) for r in expected]
    assert [tuple(map(type, r)) for r in got] == [tuple(map(type, r)) for r in expected]


def test_a_compiled_read_names_a_missing_parameter(engine: Engine) -> None:
    read = CompiledRead(_VERSION_TOKEN_TARGET, engine.dialect)
    with pytest.raises(KeyError, match="kernel"):
        read.parameters({"token_hash": "x", "target": "prod"})


def test_the_gates_connections_are_read_only_in_the_database(engine: Engine) -> None:
    if engine.dialect.name == "sqlite":
        probe = select(literal_column("query_only")).select_from(text("pragma_query_only()"))
        assert read_all(engine, probe, {}) == [(1,)]
    else:
        probe = select(func.current_setting("default_transaction_read_only"))
        assert [tuple(r) for r in read_all(engine, probe, {})] == [("on",)]


def test_a_session_whose_caller_failed_leaves_its_connection_usable(engine: Engine) -> None:
    """A refused token raises inside the session: its transaction must not outlive it."""
    read = CompiledRead(_VERSION, engine.dialect)

    async def run() -> list[Any]:
        reads = read_connections(engine)
        try:
            for _ in range(3):
                with pytest.raises(LookupError):
                    async with reads.session() as reader:
                        await reader.all(read, {})
                        raise LookupError("the caller's own error")
            async with reads.session() as reader:
                return await reader.all(read, {})
        finally:
            reads.close()

    assert len(asyncio.run(run())) == 1


def test_an_unreachable_database_is_registry_unavailable(tmp_path: Any) -> None:
    from kcert.registry.db import make_engine

    not_a_database = tmp_path / "registry.db"
    not_a_database.write_bytes(b"this is not a SQLite file" * 100)
    for url in (f"sqlite:///{not_a_database}", "postgresql+psycopg://kcert@127.0.0.1:9/none"):
        engine = make_engine(url)
        try:
            with pytest.raises(RegistryUnavailable, match="could not be read"):
                read_all(engine, _VERSION, {})
        finally:
            engine.dispose()


# ---------------------------------------------------------------------------- shared reads


class Reads:
    """A fetch that counts its reads and waits to be let go, one round at a time."""

    def __init__(self) -> None:
        self.started = 0
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def fetch(self) -> int:
        self.started += 1
        number = self.started
        await self.release.wait()
        self.release.clear()
        if self.fail is not None:
            raise self.fail
        return number


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_caller_only_gets_a_read_sent_after_it_asked() -> None:
    async def run() -> None:
        reads = Reads()
        shared = SharedReads(reads.fetch)
        first = asyncio.create_task(shared.get())
        await settle()
        assert reads.started == 1
        # Read 1 is in flight: these two asked after it was sent, so it cannot answer them.
        later = [asyncio.create_task(shared.get()) for _ in range(2)]
        await settle()
        assert reads.started == 1, "a second read started while one was in flight"
        reads.release.set()
        assert await first == 1
        await settle()
        assert reads.started == 2, "the callers that asked meanwhile share the next read"
        reads.release.set()
        assert await asyncio.gather(*later) == [2, 2]

    asyncio.run(run())


def test_a_caller_that_goes_away_does_not_cancel_the_others_read() -> None:
    async def run() -> None:
        reads = Reads()
        shared = SharedReads(reads.fetch)
        leaving, staying = asyncio.create_task(shared.get()), asyncio.create_task(shared.get())
        await settle()
        leaving.cancel()
        await settle()
        reads.release.set()
        assert await staying == 1
        assert leaving.cancelled()

    asyncio.run(run())


def test_a_failed_read_fails_its_callers_and_the_next_one_reads_again() -> None:
    async def run() -> None:
        reads = Reads()
        shared = SharedReads(reads.fetch)
        waiting = asyncio.create_task(shared.get())
        await settle()
        reads.fail = RegistryUnavailable("down")
        reads.release.set()
        with pytest.raises(RegistryUnavailable):
            await waiting
        reads.fail = None
        again = asyncio.create_task(shared.get())
        await settle()
        reads.release.set()
        assert await again == 2

    asyncio.run(run())

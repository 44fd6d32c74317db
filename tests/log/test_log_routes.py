"""The public log routes, and an audit of a live registry app through them."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from kcert.api.app import create_app
from kcert.log import merkle
from kcert.log.monitor import audit_log
from kcert.log.note import Verifier, open_checkpoint
from kcert.log.proofs import verify_consistency, verify_inclusion
from kcert.log.source import HttpLogSource
from kcert.registry import audit
from kcert.registry.config import Settings
from kcert.registry.db import make_engine, write_session


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'registry.db'}")
    yield engine
    engine.dispose()


@pytest.fixture
def client(tmp_path: Path, engine: Engine) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path, database_url=str(engine.url))
    with TestClient(create_app(settings, engine=engine), raise_server_exceptions=False) as c:
        yield c


def _append(engine: Engine, n: int) -> None:
    with write_session(engine) as session:
        audit.record_events(session, [("key.trusted", {"keyid": f"k{i}"}) for i in range(n)])
        session.commit()


def test_key_and_checkpoint_are_c2sp_text(client: TestClient, engine: Engine) -> None:
    _append(engine, 11)
    key = client.get("/v1/log/key")
    assert key.status_code == 200 and key.headers["content-type"].startswith("text/plain")
    verifier = Verifier.from_vkey(key.text)
    note = client.get("/v1/log/checkpoint")
    assert note.headers["content-type"].startswith("text/plain")
    cp = open_checkpoint(note.text, verifier)
    assert cp.size == 11 and cp.origin == verifier.name
    assert note.text.split("\n")[3] == ""  # body, blank line, signature lines


def test_entries_serve_exact_leaf_bytes(client: TestClient, engine: Engine) -> None:
    _append(engine, 5)
    body = client.get("/v1/log/entries", params={"start": 1, "end": 4}).json()
    assert body["tree_size"] == 5
    assert [e["index"] for e in body["entries"]] == [1, 2, 3]
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT leaf FROM log_entry WHERE leaf_index = 2")).scalar_one()
    assert base64.b64decode(body["entries"][1]["leaf"]) == bytes(stored)


def test_proof_routes_answer_base64_hashes(client: TestClient, engine: Engine) -> None:
    _append(engine, 13)
    cp = open_checkpoint(
        client.get("/v1/log/checkpoint").text, Verifier.from_vkey(client.get("/v1/log/key").text)
    )
    leaves = [
        base64.b64decode(e["leaf"])
        for e in client.get("/v1/log/entries", params={"start": 0, "end": 13}).json()["entries"]
    ]
    inc = client.get("/v1/log/proofs/inclusion", params={"index": 6, "size": 13}).json()
    verify_inclusion(
        6, 13, merkle.leaf_hash(leaves[6]), [base64.b64decode(h) for h in inc["hashes"]], cp.root
    )
    tree = merkle.MemoryTree()
    for leaf in leaves[:5]:
        tree.append(merkle.leaf_hash(leaf))
    con = client.get("/v1/log/proofs/consistency", params={"first": 5, "second": 13}).json()
    verify_consistency(5, 13, tree.root(), cp.root, [base64.b64decode(h) for h in con["hashes"]])


@pytest.mark.parametrize(
    "path,params",
    [
        ("entries", {"start": -1, "end": 3}),
        ("entries", {"start": 3, "end": 3}),
        ("entries", {"start": 9, "end": 12}),
        ("proofs/inclusion", {"index": 4, "size": 4}),
        ("proofs/inclusion", {"index": 0, "size": 9}),
        ("proofs/consistency", {"first": 0, "second": 3}),
        ("proofs/consistency", {"first": 3, "second": 2}),
        ("proofs/consistency", {"first": 1, "second": 9}),
    ],
)
def test_bad_ranges_are_problem_400(
    client: TestClient, engine: Engine, path: str, params: dict[str, int]
) -> None:
    _append(engine, 4)
    response = client.get(f"/v1/log/{path}", params=params)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["type"].endswith("/log-bad-range")


def test_log_routes_need_no_token(client: TestClient) -> None:
    for path in ("checkpoint", "key"):
        assert client.get(f"/v1/log/{path}").status_code == 200


def test_an_audit_through_http_passes_then_catches_tampering(
    client: TestClient, engine: Engine
) -> None:
    _append(engine, 30)
    source = HttpLogSource("http://testserver", client=client)
    verifier = Verifier.from_vkey(source.verifier_key())
    assert audit_log(source, verifier).ok
    with engine.begin() as conn:
        leaf = conn.execute(text("SELECT leaf FROM log_entry WHERE leaf_index = 21")).scalar_one()
        edited = bytes(leaf).replace(b'"k21"', b'"k99"')
        conn.execute(
            text("UPDATE log_entry SET leaf = :leaf WHERE leaf_index = 21"), {"leaf": edited}
        )
    result = audit_log(source, verifier)
    assert not result.ok and result.first_bad_index == 21

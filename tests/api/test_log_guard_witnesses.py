"""The log guard against its own witnesses and against a stale or swapped checkpoint file.

Each case is an attack found on the guard: a witness that adds a line named
like the log, a witness that claims a larger tree without evidence, an older
cosigned checkpoint file put back with the database rolled back to its size,
a second worker whose floor is stale. Each runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from kcert.api.witness_app import create_witness_app
from kcert.log.cosignature import Cosigner
from kcert.log.errors import LogError
from kcert.log.note import Checkpoint, Signer, split_note
from kcert.log.witness import SIZE_MEDIA_TYPE, AddCheckpoint, Witness, WitnessState
from kcert.log.witness_client import WitnessEndpoint
from kcert.registry import audit
from kcert.registry.audit import log_signer
from kcert.registry.checkpoints import CheckpointGuard
from kcert.registry.db import read_session, write_session
from kcert.registry.errors import LogInconsistent


def _grow(engine: Engine, n: int, tag: str = "e") -> None:
    with write_session(engine) as session:
        audit.record_events(session, [("key.trusted", {"keyid": f"{tag}{i}"}) for i in range(n)])
        session.commit()


def _size(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT size FROM log_state")).scalar_one())


def _rewind(engine: Engine, keep: int) -> None:
    """A restore, as far as the log is concerned: entries from ``keep`` on are gone."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM log_entry WHERE leaf_index >= :k"), {"k": keep})
        conn.execute(
            text("DELETE FROM log_node WHERE (position + 1) * (1 << level) > :k"), {"k": keep}
        )
        conn.execute(text("UPDATE log_state SET size = :k"), {"k": keep})


def test_a_witness_line_named_like_the_log_is_dropped(engine: Engine, tmp_path: Path) -> None:
    """A witness's extra line by the log's name must not reach (and brick) the checkpoint file."""
    home = tmp_path / "home"
    signer = log_signer(home)
    evil = Cosigner("witness.example/w1", Ed25519PrivateKey.generate())

    def handler(request: httpx.Request) -> httpx.Response:
        body, _ = split_note(AddCheckpoint.parse(request.content).note)
        junk = "\u2014 " + signer.name + " " + base64.b64encode(
            signer.verifier.key_hash + b"\0" * 64).decode() + "\n"  # fmt: skip
        stray = "\u2014 witness.example/w1 " + base64.b64encode(b"\1" * 76).decode() + "\n"
        return httpx.Response(200, text=evil.cosign(body, 1_700_000_000) + junk + stray)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    guard = CheckpointGuard(home, signer, witnesses=[WitnessEndpoint("http://w", evil.key)],
                            client=client)  # fmt: skip
    _grow(engine, 2)
    with read_session(engine) as session:
        note = guard.sign(session)
    assert evil.key.verify(note) == 1_700_000_000
    assert signer.verifier.key_hash.hex() not in note
    assert len(note.splitlines()) == 6  # body (3), blank, the log's line, the cosignature
    _grow(engine, 1)
    with read_session(engine) as session:
        guard.sign(session)  # still healthy: nothing the witness added was stored
    assert guard.alarm is None


def test_a_witness_named_like_the_log_is_refused_at_configuration(tmp_path: Path) -> None:
    signer = log_signer(tmp_path / "home")
    evil = Cosigner(signer.name, Ed25519PrivateKey.generate())
    with pytest.raises(LogError, match="named like this log's origin"):
        CheckpointGuard(tmp_path, signer, witnesses=[WitnessEndpoint("http://w", evil.key)])


def test_an_older_cosigned_file_put_back_is_found_by_the_witness(
    engine: Engine, tmp_path: Path
) -> None:
    """The file swapped for an older *cosigned* note, the database rolled back to its size."""
    home = tmp_path / "home"
    signer = log_signer(home)
    cosigner = Cosigner("witness.example/w1", Ed25519PrivateKey.generate())
    state = WitnessState(tmp_path / "witness.json")
    witness = TestClient(create_witness_app(Witness(cosigner, [signer.verifier], state)),
                         base_url="http://w")  # fmt: skip
    endpoints = [WitnessEndpoint("http://w", cosigner.key)]
    guard = CheckpointGuard(home, signer, witnesses=endpoints, client=witness)
    _grow(engine, 4)
    with read_session(engine) as session:
        older = guard.sign(session)
    keep = _size(engine)
    _grow(engine, 2, "revocation")
    with read_session(engine) as session:
        guard.sign(session)  # the witness holds the larger tree now
    (home / "log-checkpoint").write_text(older, encoding="utf-8")
    _rewind(engine, keep)
    # The same process: it knows it signed more.
    with read_session(engine) as session, pytest.raises(LogInconsistent, match="^rollback"):
        guard.sign(session)
    # A process started afterwards: the witness is asked at start and answers its larger tree.
    restarted = CheckpointGuard(home, signer, witnesses=endpoints, client=witness)
    restarted.startup(engine)
    assert restarted.alarm is not None
    assert str(restarted.alarm).startswith("rollback: witness witness.example/w1")
    assert f"but the database holds {keep}" in str(restarted.alarm)


def _claiming(answer: httpx.Response, held: str | None) -> httpx.Client:
    """A witness that answers every submission with ``answer`` and serves ``held``."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, text=held) if held else httpx.Response(404, text="none\n")
        return answer

    return httpx.Client(transport=httpx.MockTransport(handler))


CLAIMS = [
    pytest.param(httpx.Response(409, text="99999999\n", headers={"content-type": SIZE_MEDIA_TYPE}),
                 id="409-larger"),
    pytest.param(httpx.Response(422, text="inconsistent\n"), id="422"),
]  # fmt: skip


@pytest.mark.parametrize("answer", CLAIMS)
def test_a_witness_claim_without_evidence_is_a_witness_failure(
    engine: Engine, tmp_path: Path, answer: httpx.Response, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    signer = log_signer(home)
    key = Cosigner("witness.example/w1", Ed25519PrivateKey.generate()).key
    # What the witness serves is not signed by the log: no evidence.
    forged = Checkpoint(signer.name, 99999999, b"\1" * 32).sign(
        Signer(signer.name, Ed25519PrivateKey.generate())
    )
    for held in (None, forged):
        guard = CheckpointGuard(home, signer, witnesses=[WitnessEndpoint("http://w", key)],
                                client=_claiming(answer, held))  # fmt: skip
        _grow(engine, 1, f"x{held is None}")
        with read_session(engine) as session:
            note = guard.sign(session)  # served, without the witness's cosignature
        assert guard.alarm is None and not key.cosignatures(note)
    assert "shows no checkpoint of this log that proves it" in caplog.text


@pytest.mark.parametrize("answer", CLAIMS)
def test_a_witness_claim_with_a_larger_log_signed_checkpoint_is_a_rollback(
    engine: Engine, tmp_path: Path, answer: httpx.Response
) -> None:
    home = tmp_path / "home"
    signer = log_signer(home)
    key = Cosigner("witness.example/w1", Ed25519PrivateKey.generate()).key
    held = Checkpoint(signer.name, 99999999, b"\1" * 32).sign(signer)  # the log's own signature
    guard = CheckpointGuard(home, signer, witnesses=[WitnessEndpoint("http://w", key)],
                            client=_claiming(answer, held))  # fmt: skip
    _grow(engine, 1)
    with read_session(engine) as session, pytest.raises(LogInconsistent, match="^rollback"):
        guard.sign(session)
    assert "holds a checkpoint of 99999999 entries signed by this log" in str(guard.alarm)

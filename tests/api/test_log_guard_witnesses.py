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
from sqlalchemy import Engine

from kcert.log.cosignature import Cosigner
from kcert.log.errors import LogError
from kcert.log.note import split_note
from kcert.log.witness import AddCheckpoint
from kcert.log.witness_client import WitnessEndpoint
from kcert.registry import audit
from kcert.registry.audit import log_signer
from kcert.registry.checkpoints import CheckpointGuard
from kcert.registry.db import read_session, write_session


def _grow(engine: Engine, n: int, tag: str = "e") -> None:
    with write_session(engine) as session:
        audit.record_events(session, [("key.trusted", {"keyid": f"{tag}{i}"}) for i in range(n)])
        session.commit()


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

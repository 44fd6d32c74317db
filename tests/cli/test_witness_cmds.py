"""Witnessing end to end: `kcert witness serve`, the registry submitting, `audit verify --witness`.

A witness runs as the real command (a subprocess) once; the registry tests
run the same witness app under uvicorn in a thread, so each test gets a
witness of its own that follows that test's log key. The registry is the
embedded one (SQLite or PostgreSQL, ``KCERT_DATABASE_URL``) driven by the CLI,
and the HTTP app, both configured through ``KCERT_WITNESSES``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from typer.testing import CliRunner, Result

from kcert.api.app import create_app
from kcert.api.witness_app import create_witness_app
from kcert.cli.app import app
from kcert.log.cosignature import Cosigner, CosignerKey, add_signature_lines
from kcert.log.merkle import MemoryTree, consistency_proof, leaf_hash
from kcert.log.note import Checkpoint, Signer
from kcert.log.witness import AddCheckpoint, Witness, WitnessState
from kcert.registry import audit
from kcert.registry.config import Settings
from kcert.registry.db import dispose_engines, migrate, write_session

REPO = Path(__file__).resolve().parents[2]
KCERT = [sys.executable, "-c", "import sys; from kcert.cli import main; sys.exit(main())"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_listening(port: int, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the witness exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the witness did not start listening")


def _run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


# --- the command itself ----------------------------------------------------------------------


def test_witness_serve_cosigns_and_refuses(tmp_path: Path) -> None:
    env = {**os.environ, "KCERT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    key = CliRunner().invoke(
        app, ["witness", "key", "--name", "witness.test/w1"], env={"KCERT_HOME": env["KCERT_HOME"]}
    )
    assert key.exit_code == 0, key.output
    vkey = CosignerKey.from_vkey(key.stdout)
    assert (tmp_path / "home" / "witness-key.pem").stat().st_mode & 0o077 == 0

    log = Signer("example.org/log", Ed25519PrivateKey.generate())
    (tmp_path / "log.vkey").write_text(log.verifier.vkey() + "\n")
    tree = MemoryTree()
    for i in range(7):
        tree.append(leaf_hash(b"%d" % i))
    port = _free_port()
    proc = subprocess.Popen(
        [*KCERT, "witness", "serve", "--name", "witness.test/w1",
         "--log", str(tmp_path / "log.vkey"), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_listening(port, proc)
        url = f"http://127.0.0.1:{port}/add-checkpoint"
        note4 = Checkpoint(log.name, 4, tree.root(4)).sign(log)
        first = httpx.post(url, content=AddCheckpoint(0, (), note4).encode())
        assert first.status_code == 200, first.text
        assert vkey.verify(add_signature_lines(note4, first.text)) > 0
        note7 = Checkpoint(log.name, 7, tree.root(7)).sign(log)
        stale = httpx.post(url, content=AddCheckpoint(0, (), note7).encode())
        assert (stale.status_code, stale.headers["content-type"], stale.text) == (
            409, "text/x.tlog.size", "4\n",
        )  # fmt: skip
        wrong = AddCheckpoint(4, tuple(consistency_proof(3, 7, tree)), note7).encode()
        assert httpx.post(url, content=wrong).status_code == 422
        proof = tuple(consistency_proof(4, 7, tree))
        good = httpx.post(url, content=AddCheckpoint(4, proof, note7).encode())
        assert good.status_code == 200 and vkey.verify(add_signature_lines(note7, good.text))
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert json.loads((tmp_path / "home" / "witness-state.json").read_text())["logs"][log.name][
        "size"
    ] == 7


def test_witness_serve_refuses_a_bad_log_key(tmp_path: Path) -> None:
    result = _run("witness", "serve", "--name", "w.test/1", "--log", "not-a-vkey",
                  "--key", str(tmp_path / "w.pem"))  # fmt: skip
    assert result.exit_code == 2 and "--log" in result.output


# --- the registry and the auditor ------------------------------------------------------------


class ThreadWitness:
    """The witness app under uvicorn in a thread, following one log."""

    def __init__(self, tmp: Path, log_vkey: str) -> None:
        from kcert.log.note import Verifier

        self.cosigner = Cosigner("witness.test/w1", Ed25519PrivateKey.generate())
        self.witness = Witness(
            self.cosigner, [Verifier.from_vkey(log_vkey)], WitnessState(tmp / "witness.json")
        )
        self.port = _free_port()
        config = uvicorn.Config(
            create_witness_app(self.witness), host="127.0.0.1", port=self.port,
            log_level="error", lifespan="off",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        _wait_listening(self.port)

    @property
    def config(self) -> str:
        return json.dumps([{"url": f"http://127.0.0.1:{self.port}", "vkey": self.vkey}])

    @property
    def vkey(self) -> str:
        return self.cosigner.key.vkey()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[Path]:
    home = tmp_path / "home"
    for name in ("KCERT_REGISTRY", "KCERT_TOKEN", "KCERT_WITNESSES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KCERT_HOME", str(home))
    monkeypatch.setenv("KCERT_DATABASE_URL", database_url)
    yield home
    dispose_engines()


@pytest.fixture
def witness(tmp_path: Path, home: Path) -> Iterator[ThreadWitness]:
    log_vkey = audit.log_signer(home).verifier.vkey()  # makes the registry's log key
    w = ThreadWitness(tmp_path, log_vkey)
    yield w
    w.stop()


def _append(engine: Engine, n: int, tag: str) -> None:
    with write_session(engine) as session:
        audit.record_events(session, [("key.trusted", {"keyid": f"{tag}{i}"}) for i in range(n)])
        session.commit()


def test_the_registry_submits_and_audit_verify_requires_the_cosignature(
    engine: Engine, home: Path, witness: ThreadWitness, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    migrate(engine)
    _append(engine, 5, "a")
    monkeypatch.setenv("KCERT_WITNESSES", witness.config)
    first = _run("audit", "verify", "--trust-on-first-use", "--witness", witness.vkey, "--json")
    assert first.exit_code == 0, first.output
    body = json.loads(first.stdout)
    assert body["ok"] is True and body["size"] == 5
    assert [w["ok"] for w in body["witnesses"]] == [True]
    assert witness.witness.state.read()[body["origin"]].size == 5
    # The next checkpoint goes with a consistency proof from the one the witness holds.
    _append(engine, 4, "b")
    second = _run("audit", "verify", "--witness", witness.vkey)
    assert second.exit_code == 0, second.output
    assert "cosigned by witness witness.test/w1" in second.stdout
    fresh = _run("audit", "verify", "--witness", witness.vkey, "--witness-max-age", "600")
    assert fresh.exit_code == 0, fresh.output
    # Two hours on, the same cosignature is too old: an old checkpoint replayed would be too.
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7200)
    stale = _run("audit", "verify", "--witness", witness.vkey, "--witness-max-age", "600")
    monkeypatch.setattr(time, "time", real)
    assert stale.exit_code == 1, stale.output
    assert "not cosigned by every required witness" in stale.stdout
    assert "older than --witness-max-age 600" in stale.stdout
    alone = _run("audit", "verify", "--witness-max-age", "600")
    assert alone.exit_code == 2 and "needs at least one --witness" in alone.output
    assert witness.witness.state.read()[body["origin"]].size == 9
    assert witness.cosigner.key.verify((home / "log-checkpoint").read_text()) > 0

    # No witness configured: the new checkpoint carries no cosignature, and the audit fails.
    monkeypatch.delenv("KCERT_WITNESSES")
    _append(engine, 1, "c")
    unwitnessed = _run("audit", "verify", "--witness", witness.vkey)
    assert unwitnessed.exit_code == 1, unwitnessed.output
    assert "not cosigned by every required witness" in unwitnessed.stdout
    assert "no cosignature by witness 'witness.test/w1'" in unwitnessed.stdout
    other = Cosigner("witness.test/w2", Ed25519PrivateKey.generate()).key.vkey()
    assert _run("audit", "verify", "--witness", other).exit_code == 1
    bad = _run("audit", "verify", "--witness", "nonsense")
    assert bad.exit_code == 2 and "--witness" in bad.output


def test_the_server_serves_cosigned_checkpoints_and_a_witness_catches_a_lost_file(
    engine: Engine, home: Path, witness: ThreadWitness, database_url: str
) -> None:
    settings = Settings(home=home, database_url=database_url, checkpoint_interval=0,
                        witnesses=json.loads(witness.config))  # fmt: skip
    with TestClient(create_app(settings, engine=engine)) as client:
        _append(engine, 6, "a")
        note = client.get("/v1/log/checkpoint").text
        assert witness.cosigner.key.verify(note) > 0
        assert (home / "log-checkpoint").read_text() == note
        # The database is restored AND the checkpoint file lost: only the witness remembers.
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM log_entry WHERE leaf_index >= 3"))
            conn.execute(text("DELETE FROM log_node WHERE (position + 1) * (1 << level) > 3"))
            conn.execute(text("UPDATE log_state SET size = 3"))
        (home / "log-checkpoint").unlink()
        refused = client.get("/v1/log/checkpoint")  # this process knows what it signed
        assert refused.status_code == 503, refused.text
        assert refused.json()["detail"].startswith("rollback: ")
    # A process started afterwards knows nothing: the witness, asked at start, remembers.
    with TestClient(create_app(settings, engine=engine)) as client:
        refused = client.get("/v1/log/checkpoint")
        assert refused.status_code == 503, refused.text
        assert refused.json()["type"] == "https://kcert.dev/problems/log-inconsistent"
        detail = refused.json()["detail"]
        assert detail.startswith("rollback: witness witness.test/w1 at "), detail
        assert "holds a checkpoint of 6 entries signed by this log" in detail
        assert not (home / "log-checkpoint").exists()


def test_the_server_submits_each_new_checkpoint_unasked(
    engine: Engine, home: Path, witness: ThreadWitness, database_url: str
) -> None:
    """No checkpoint is requested: the server's publisher signs and submits on its own."""
    settings = Settings(home=home, database_url=database_url, checkpoint_interval=0.05,
                        witnesses=json.loads(witness.config))  # fmt: skip
    origin = audit.log_signer(home).name

    def witnessed() -> int:
        record = witness.witness.state.read().get(origin)
        return record.size if record else 0

    with TestClient(create_app(settings, engine=engine)):
        for batch, total in ((4, 4), (5, 9)):  # the second goes with a consistency proof
            _append(engine, batch, f"b{total}")
            deadline = time.monotonic() + 20
            while witnessed() != total:
                assert time.monotonic() < deadline, f"the witness never got size {total}"
                time.sleep(0.05)
    assert witness.cosigner.key.verify((home / "log-checkpoint").read_text()) > 0

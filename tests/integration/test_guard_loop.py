"""The loop after promotion, end to end, on SQLite and on PostgreSQL.

A saxpy that is right on every size its spec probes and wrong past 16384
elements (``tests/assets/guard``) is certified for real (Triton interpreter, in
the sandbox), pushed, promoted to a target whose policy suspends on a runtime
mismatch, and served through ``kcert.guard`` with an ``HttpReporter`` posting to
a real server. Its first large call is a mismatch: the promotion is
suspended, the gate denies with ``runtime-mismatch``, and ``kcert audit
replay`` of the log agrees, re-checking the mismatch from its evidence with
the spec's reference.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from kcert.api.app import create_app
from kcert.attest.certificate import inspect_envelope, sign_report, write_certificate
from kcert.attest.keys import generate_private_key, public_key_hex
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.spec import load_spec
from kcert.cli.app import app
from kcert.registry.config import Settings
from kcert.registry.db import dispose_engines

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "guard"
SPEC = ASSETS / "kcert.toml"
ADMIN = "kcert_loop_admin_" + "z" * 24
TARGET = "prod-a"
runner = CliRunner()


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The wrong-on-large kernel, certified once for the module (its probes are small)."""
    folder = tmp_path_factory.mktemp("certified")
    key = generate_private_key()
    report = certify(load_spec(SPEC).kernel("saxpy_large"),
                     CertifyOptions(executor="triton-interpreter", timing=False))  # fmt: skip
    assert report.verdict.value == "pass", [c for c in report.checks if c.status == "fail"]
    envelope = sign_report(report, key)
    path = folder / "saxpy_large.cert.json"
    write_certificate(path, envelope)
    contents = inspect_envelope(envelope)
    environment = folder / "environment.json"
    environment.write_text(json.dumps(dict(report.environment)))
    return {"path": path, "public_key": public_key_hex(key.public_key()),
            "kernel": str(contents.source_digest), "environment": environment}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def server(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in ("KCERT_DATABASE_URL", "KCERT_REGISTRY", "KCERT_TOKEN", "KCERT_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(home=tmp_path / "server-home", database_url=database_url,
                        admin_token=SecretStr(ADMIN))  # fmt: skip
    port = _free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="off")  # fmt: skip
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "client-home"))
    monkeypatch.setenv("KCERT_REGISTRY", url)
    monkeypatch.setenv("KCERT_TOKEN", ADMIN)
    yield url
    srv.should_exit = True
    thread.join(timeout=30)
    dispose_engines()


def kcert(*args: str | Path, code: int = 0) -> Result:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr)
    return result


def _launcher(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Launch the asset kernel through the Triton interpreter on torch CPU tensors."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location("guard_loop_saxpy", ASSETS / "saxpy_large.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def launch(x_ptr: Any, y_ptr: Any, a: float, n: int) -> None:
        module.saxpy[(triton.cdiv(n, 1024),)](x_ptr, y_ptr, a, n, BLOCK=1024)

    return launch


def _tensors(n: int, seed: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    x, y = (np.clip(rng.standard_normal(n), -4, 4).astype(np.float32) for _ in range(2))
    return torch.from_numpy(x), torch.from_numpy(y)


def test_a_runtime_mismatch_suspends_the_promotion_and_the_log_replays(
    server: str, certified: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kcert.guard import Guard, HttpReporter

    kernel = certified["kernel"]
    kcert("keys", "trust", certified["public_key"], "--name", "ci")
    kcert("push", certified["path"])
    kcert("target", "report", TARGET, "--hw", "cpu", "--environment", certified["environment"])
    kcert("target", "policy", TARGET, "--on-mismatch", "suspend")
    kcert("promote", "--kernel", kernel, "--target", TARGET)
    kcert("gate", "--kernel", kernel, "--target", TARGET)
    made = json.loads(kcert("token", "create", "--scope", "observations:write", "--json").stdout)

    reporter = HttpReporter(server, made["token"], TARGET, flush_every_s=3600, backoff_s=0.0)
    guard = Guard.from_certificate(certified["path"], SPEC, sample_rate=1.0, seed=0,
                                   reporter=reporter)  # fmt: skip
    try:
        serve = guard.wrap(_launcher(monkeypatch))
        x, y = _tensors(3000, 1)
        y0 = y.clone()
        serve(x, y, 2.5, 3000)
        assert torch.equal(y, 2.5 * x + y0)  # the guard never changes the caller's result
        serve(*_tensors(20000, 2), 2.5, 20000)  # past 16384: wrong
        assert guard.flush(120)
        stats = guard.stats()
        assert stats.mismatches == 1 and stats.calls_checked == 2
    finally:
        guard.close()

    denied = kcert("gate", "--kernel", kernel, "--target", TARGET, "--json", code=1)
    reasons = json.loads(denied.stdout)["reasons"]
    assert any("runtime-mismatch" in r for r in reasons), reasons

    entries = httpx.get(f"{server}/v1/log/entries", params={"start": 0, "end": 1000}).json()
    kinds = [json.loads(base64.b64decode(e["leaf"]))["kind"] for e in entries["entries"]]
    index = kinds.index("observation.mismatch")
    replay = kcert("audit", "replay", str(index), "--spec", SPEC, "--json")
    body = json.loads(replay.stdout)
    assert body["same"] is True and body["replayed"]["suspend"] is True
    assert body["recheck"]["same"] is True
    assert any("same anchor as recorded" in n for n in body["recheck"]["notes"]), body
    kcert("audit", "replay", "--all", "--allow-unverified")

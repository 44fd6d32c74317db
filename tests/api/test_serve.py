"""``kcert serve --workers N``: the listening socket keeps TCP_NODELAY on accepted connections,
and two workers start and answer while every core is busy."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcert.api.serve import listening_socket, serving_app
from kcert.registry.db import dispose_engines


def test_accepted_connections_get_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only on sockets of proto IPPROTO_TCP (uvicorn's own has 0)."""
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted = writer.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


# --- kcert serve --workers 2 starts under load (issue 14, finding 6) -----------------------

#: The console script pip writes for ``kcert``: spawned workers re-run it as their
#: ``__main__`` before they can answer uvicorn's health check, so what it imports counts.
LAUNCHER = """import sys
from kcert.cli import main
if __name__ == '__main__':
    sys.exit(main())
"""
#: How long both workers may take to answer, on a machine whose every core is busy.
START_DEADLINE_S = 60


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _holder(pids: list[int], inode: str) -> int | None:
    """The process among ``pids`` that holds the socket with ``inode``."""
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except FileNotFoundError:
                continue
    return None


def _served_by(port: int, workers: list[int]) -> int | None:
    """Ask for the log's checkpoint on a new connection; the worker that answered, if any."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /v1/log/checkpoint HTTP/1.1\r\nHost: kcert\r\n\r\n")
        if not sock.recv(64).startswith(b"HTTP/1.1 200"):
            return None
        local = sock.getsockname()[1]
        # The connection is still open: the worker holding its other end answered.
        wanted = f"0100007F:{port:04X} 0100007F:{local:04X}"
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if f"{fields[1]} {fields[2]}" == wanted:
                return _holder(workers, fields[9])
    return None


@pytest.mark.slow
@pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(),
    reason="needs Linux's /proc with children lists",
)
def test_two_workers_start_and_answer_under_cpu_load(database_url: str, tmp_path: Path) -> None:
    launcher = tmp_path / "kcert"
    launcher.write_text(LAUNCHER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCERT_")}
    env.update(KCERT_HOME=str(tmp_path / "home"), KCERT_DATABASE_URL=database_url)
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    server = subprocess.Popen(
        [sys.executable, str(launcher), "serve", "--port", str(port), "--workers", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        answered: set[int] = set()
        deadline = time.monotonic() + START_DEADLINE_S
        while len(answered) < 2 and time.monotonic() < deadline and server.poll() is None:
            try:
                worker = _served_by(port, _children(server.pid))
            except OSError:
                time.sleep(0.2)
                continue
            if worker is not None:
                answered.add(worker)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        os.killpg(server.pid, signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
    log = stderr.decode(errors="replace")
    assert "died" not in log, log[-2000:]
    assert len(answered) == 2, (answered, log[-2000:])


def test_a_worker_does_not_migrate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kcert serve`` migrates once before the workers start; a worker's app never does."""
    database = tmp_path / "registry.db"
    monkeypatch.setenv("KCERT_HOME", str(tmp_path))
    monkeypatch.setenv("KCERT_DATABASE_URL", f"sqlite:///{database}")
    try:
        serving_app()
    finally:
        gc.unfreeze()
        dispose_engines()
    with sqlite3.connect(database) as db:
        tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == []

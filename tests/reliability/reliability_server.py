"""A real registry server for the reliability tests: ``kcert serve`` in a subprocess.

Each :class:`RegistryServer` runs the actual CLI entry point on a free
loopback port, with its own ``KCERT_HOME`` (database, log key) in a temp dir,
so these tests see what an operator's server does: process start, migrations,
uvicorn's HTTP parser, SIGKILL and restart. Every server is stopped (its whole
process group) when its test ends.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kcert.attest.keys import public_key_hex

#: A cold start imports FastAPI, SQLAlchemy and the migrations; CI machines are slow.
START_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_command(port: int) -> list[str]:
    """``kcert serve`` through the installed console script, or the same entry point."""
    script = Path(sys.executable).with_name("kcert")
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "import sys; from kcert.cli import main; sys.exit(main())", *args]


class RegistryServer:
    """One ``kcert serve`` process over one database; it can be killed and started again."""

    def __init__(
        self, home: Path, database_url: str, *, extra_env: dict[str, str] | None = None
    ) -> None:
        self.home = home
        self.extra_env = dict(extra_env or {})
        self.database_url = database_url
        self.admin_token = "kcert_reliability_admin_" + secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "server.log"

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def start(self) -> None:
        env = {
            **os.environ,
            "KCERT_HOME": str(self.home),
            "KCERT_DATABASE_URL": self.database_url,
            "KCERT_ADMIN_TOKEN": self.admin_token,
            **self.extra_env,
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                _serve_command(self.port), env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{self.url}/v1/log/checkpoint", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"kcert serve did not start:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, no flush, as in a power cut of the process."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)

    def client(self, token: str | None = None, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]

    def token(self, *scopes: str, expires_in: int | None = None) -> str:
        body: dict[str, object] = {"scopes": list(scopes)}
        if "observations:write" in scopes:
            body["all_targets"] = True
        if expires_in is not None:
            body["expires_in"] = expires_in
        with self.client() as c:
            r = c.post("/v1/tokens", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def trust(server: RegistryServer, key: Ed25519PrivateKey) -> None:
    with server.client() as c:
        r = c.post("/v1/keys", json={"name": "ci", "public_key": public_key_hex(key.public_key())})
    assert r.status_code in (200, 201), r.text

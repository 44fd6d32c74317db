"""A wheel built from the repository installs into a fresh venv and ``kcert serve`` works.

The installed registry must find its Alembic migrations inside the package: it
runs from a folder with no source tree, on a fresh ``KCERT_HOME``, migrates its
SQLite database and answers ``/v1/log/health``. Dependencies are not installed
again (that would take minutes and need the network): the fresh venv sees this
venv's site-packages through a plain ``.pth`` path line, which does not run this
venv's own ``.pth`` hooks, so the editable kcert of the checkout stays out of it.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: Building, installing and starting, each bounded; a busy machine gets this much.
STEP_TIMEOUT_S = 300
SERVE_DEADLINE_S = 90


def _run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=STEP_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KCERT_", "PYTHON", "VIRTUAL_ENV"))}  # fmt: skip
    env.update(KCERT_HOME=str(home), KCERT_ADMIN_TOKEN="wheel-test-admin-token")
    return env


def test_the_wheel_installs_and_kcert_serve_migrates_and_serves(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = _clean_env(home)
    # setuptools builds in the source folder (build/, kcert.egg-info): build a copy of what
    # a wheel is made from, so the checkout stays as it was.
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "kcert", source / "kcert",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    wheels = tmp_path / "wheels"
    # No build isolation: this venv's setuptools builds it, with no network needed.
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", wheels, source, env=env)  # fmt: skip
    (wheel,) = wheels.glob("kcert-*.whl")

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, env=env)
    python = venv / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                        env=env).strip())  # fmt: skip
    _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, env=env)
    # Only now: pip would take the checkout's kcert dist-info there as already installed.
    (purelib / "kcert-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"  # no source tree here, nor above on sys.path
    elsewhere.mkdir()
    where = _run(python, "-c", "import kcert; print(kcert.__file__)", cwd=elsewhere, env=env)
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel's kcert, not the checkout's

    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [venv / "bin" / "kcert", "serve", "--port", str(port)],
        cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + SERVE_DEADLINE_S
        response = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/v1/log/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        output = (tmp_path / "serve.log").read_text()
        assert response is not None, f"kcert serve never answered:\n{output}"
        assert response.status_code == 200, response.text
        assert "Traceback" not in output, output
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()

    installed = Path(where.strip()).parent / "registry" / "migrations" / "versions"
    heads = {path.stem for path in installed.glob("*.py")}
    with sqlite3.connect(home / "registry.db") as db:
        (version,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert version in heads and version == max(heads)

"""A kernel that attacks its certifier reaches none of its aims (the containment issue).

``tests/assets/attacks/attack.py.in`` is a Triton module whose module-level
code tries, at import, everything a model rewarded for passing might: read the
signing key (from the key file, ``KCERT_HOME``, the parent's command line and
environment), carry it out (a loopback socket, a marker file outside), write
the reference, its own source, the kcert installation and the registry
database, start a daemon that outlives certification, and patch kcert's
checks to forge a pass. Its kernel is wrong (it subtracts).

Each mode runs the real CLI once (``kcert certify ... --key K --out C``, a
separate process holding the key path in its argv) and the tests below each
check one aim: without ``--allow-module-code`` the module is refused before
anything imports it; with it, the code runs, inside the sandbox only. A
control run with ``--no-sandbox`` (its installation targets are decoys) shows
that every detector here does see the attack when nothing contains it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import kcert

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "attacks"
KCERT = Path(sys.executable).with_name("kcert")

pytestmark = pytest.mark.skipif(not KCERT.exists(), reason="the kcert console script is missing")


@dataclass
class Listener:
    """A loopback TCP server that records whatever connects to it."""

    sock: socket.socket
    received: list[bytes] = field(default_factory=list)
    connections: int = 0

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve(self) -> None:
        self.sock.settimeout(0.2)
        while True:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(1 << 20))
                except OSError:
                    pass


@dataclass
class Attack:
    allow: bool
    token: str
    folder: Path
    home: Path
    key: Path
    marker: Path
    certificate: Path
    listener: Listener
    before: dict[str, str]
    after: dict[str, str]
    site_before: set[str]
    site_after: set[str]
    source_bytes: bytes
    result: subprocess.CompletedProcess[str]
    survivors: list[int]

    @property
    def key_secrets(self) -> list[bytes]:
        """The key file's bytes and its base64 body line: neither may appear anywhere."""
        text = self.key.read_bytes()
        return [text, *(line for line in text.splitlines() if line and b"-----" not in line)]


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


def _watched(a: dict[str, Path]) -> dict[str, str]:
    return {name: _hash(path) for name, path in a.items()}


def _survivors(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(pid))
    return found


def _run_attack(mode: str, tmp_path_factory: pytest.TempPathFactory) -> Attack:
    allow = mode != "refused"
    token = f"kcert-attack-{uuid.uuid4().hex}"
    root = tmp_path_factory.mktemp("attack")
    folder, home = root / "spec", root / "home"
    folder.mkdir()
    home.mkdir()
    key, database = home / "signing.key", home / "registry.db"
    subprocess.run([str(KCERT), "keys", "generate", "--out", str(key)], check=True,
                   capture_output=True)  # fmt: skip
    with sqlite3.connect(database) as db:  # the embedded registry's stand-in
        db.execute("CREATE TABLE trusted_keys (keyid TEXT)")

    marker = Path("/tmp") / f"{token}.marker"
    site = Path(sysconfig.get_paths()["purelib"])
    install = Path(kcert.__file__)
    if mode == "control":  # unconfined: aim its writes at decoys, never the real install
        site, install = root / "site", root / "kcert-init.py"
        site.mkdir()
        install.write_text("# decoy\n")
    listener = Listener(socket.create_server(("127.0.0.1", 0)))
    threading.Thread(target=listener.serve, daemon=True).start()
    shutil.copy(ASSETS / "reference.py", folder / "reference.py")
    shutil.copy(ASSETS / "kcert.toml.in", folder / "kcert.toml")
    names = {"TOKEN": token, "KEY": str(key), "KCERT_HOME": str(home),
             "REFERENCE": str(folder / "reference.py"), "SOURCE": str(folder / "attack.py"),
             "INSTALL": str(install), "SITE": str(site), "DATABASE": str(database),
             "MARKER": str(marker), "PORT": str(listener.port)}  # fmt: skip
    source = (ASSETS / "attack.py.in").read_text()
    for name, value in names.items():
        source = source.replace(f"@{name}@", value)
    (folder / "attack.py").write_text(source)
    watched = {"reference": folder / "reference.py", "source": folder / "attack.py",
               "install": install, "database": database, "key": key}  # fmt: skip
    before, site_before = _watched(watched), set(os.listdir(site))
    certificate = root / "attack.cert.json"
    argv = [str(KCERT), "certify", str(folder / "attack.py"), "--executor", "triton-interpreter",
            "--hw", "cpu", "--key", str(key), "--out", str(certificate), "--json",
            *(["--allow-module-code"] if allow else []),
            *(["--no-sandbox"] if mode == "control" else [])]  # fmt: skip
    env = {**os.environ, "KCERT_HOME": str(home), "KCERT_TOKEN": token}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                            check=False)  # fmt: skip
    time.sleep(1.0)  # a daemon that escaped would be running by now
    survivors = _survivors(token)
    listener.sock.close()
    for pid in survivors:
        os.kill(pid, 9)
    attack = Attack(allow, token, folder, home, key, marker, certificate, listener, before,
                    _watched(watched), site_before, set(os.listdir(site)),
                    (folder / "attack.py").read_bytes(), result, survivors)  # fmt: skip
    if mode != "control":
        (site / "kcert_planted.pth").unlink(missing_ok=True)
    return attack


@pytest.fixture(scope="module", params=["refused", "allow-module-code"])
def attack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Attack]:  # fmt: skip
    attack = _run_attack(request.param, tmp_path_factory)
    yield attack
    attack.marker.unlink(missing_ok=True)


@pytest.mark.triton
def test_control_without_the_sandbox_every_attack_reaches_its_aim(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The detectors below are real: unconfined, the same module gets everywhere."""
    attack = _run_attack("control", tmp_path_factory)
    try:
        assert attack.marker.exists()
        assert attack.listener.connections >= 1  # the build child and the run worker
        assert any(secret in blob for blob in attack.listener.received
                   for secret in attack.key_secrets)  # fmt: skip
        assert attack.survivors, "the daemon outlived the unconfined certification"
        changed = {k for k in attack.before if attack.before[k] != attack.after[k]}
        assert {"reference", "source", "install", "database"} <= changed
        assert "kcert_planted.pth" in attack.site_after - attack.site_before
    finally:
        attack.marker.unlink(missing_ok=True)


@pytest.mark.triton
def test_without_the_flag_the_module_is_refused_before_it_runs(attack: Attack) -> None:
    if attack.allow:
        pytest.skip("the module runs under --allow-module-code")
    assert attack.result.returncode == 2, attack.result.stderr
    error = json.loads(attack.result.stdout)["error"]
    assert error["type"] == "module-code"
    # the first refusal is the first forbidden import, with its line
    assert "attack.py:8:" in error["detail"] and "glob" in error["detail"]
    assert not attack.certificate.exists()


@pytest.mark.triton
def test_with_the_flag_the_wrong_kernel_still_fails_and_the_certificate_says_why(
    attack: Attack,
) -> None:
    if not attack.allow:
        pytest.skip("refused before running")
    assert attack.result.returncode == 1, attack.result.stderr
    summary = json.loads(attack.result.stdout)
    failed = {c["name"] for c in summary["checks"] if c["status"] == "fail"}
    assert summary["verdict"] == "fail" and "correctness" in failed
    predicate = _predicate(attack.certificate)
    assert predicate["verdict"] == "fail"
    assert predicate["certifier"]["confinement"]["module_code"] is True
    assert predicate["certifier"]["confinement"]["sandbox"] is True


def test_no_marker_file_appears_outside_the_sandbox(attack: Attack) -> None:
    assert not attack.marker.exists()


def test_no_key_bytes_leave(attack: Attack) -> None:
    outputs = [attack.result.stdout.encode(), attack.result.stderr.encode(),
               *attack.listener.received]  # fmt: skip
    if attack.certificate.exists():
        outputs.append(attack.certificate.read_bytes())
        outputs.append(json.dumps(_predicate(attack.certificate)).encode())
    for secret in attack.key_secrets:
        assert not any(secret in blob for blob in outputs)


def test_a_loopback_listener_receives_nothing(attack: Attack) -> None:
    assert attack.listener.connections == 0 and attack.listener.received == []


def test_no_process_of_the_kernel_is_alive_afterwards(attack: Attack) -> None:
    assert attack.survivors == []


def test_reference_source_installation_registry_and_key_are_unchanged(attack: Attack) -> None:
    assert attack.after == attack.before
    assert attack.site_after == attack.site_before


@pytest.mark.triton
def test_the_certificate_names_the_bytes_that_ran(attack: Attack) -> None:
    if not attack.allow:
        pytest.skip("no certificate without the flag")
    predicate = _predicate(attack.certificate)
    digest = "sha256:" + hashlib.sha256(attack.source_bytes).hexdigest()
    assert predicate["kernel"]["source_digest"] == digest


def _predicate(certificate: Path) -> dict[str, object]:
    import base64

    envelope = json.loads(certificate.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    predicate: dict[str, object] = statement["predicate"]
    return predicate


def _spec_with(folder: Path, asset: str, token: str) -> Path:
    folder.mkdir()
    shutil.copy(ASSETS / "reference.py", folder / "reference.py")
    shutil.copy(ASSETS / "kcert.toml.in", folder / "kcert.toml")
    source = (ASSETS / asset).read_text().replace("@TOKEN@", token)
    (folder / "attack.py").write_text(source)
    return folder / "attack.py"


def _certify_argv(source: Path) -> list[str]:
    return [str(KCERT), "certify", str(source), "--executor", "triton-interpreter", "--hw", "cpu",
            "--allow-module-code", "--json"]  # fmt: skip


@pytest.mark.parametrize("signum", [15, 9], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.triton
def test_a_sandbox_that_stops_its_lifeline_dies_with_the_certifier(
    tmp_path: Path, signum: int
) -> None:
    """Module code breaks the worker's own exit path and spins; killing kcert still ends all."""
    token = f"kcert-outlive-{uuid.uuid4().hex}"
    source = _spec_with(tmp_path / "spec", "outlive.py.in", token)
    env = {**os.environ, "KCERT_HOME": str(tmp_path / "home")}
    cli = subprocess.Popen(_certify_argv(source), env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _survivors(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _survivors(token), "the daemon never started"
        os.kill(cli.pid, signum)
        cli.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _survivors(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _survivors(token)
    finally:
        cli.kill()
        cli.wait()
    for pid in left:
        os.kill(pid, 9)
    assert left == [], "the kernel's daemon outlived the certifier"


@pytest.mark.triton
def test_what_a_kernel_writes_in_its_tmp_never_reaches_the_host(tmp_path: Path) -> None:
    token = f"kcert-fill-{uuid.uuid4().hex}"
    source = _spec_with(tmp_path / "spec", "fill.py.in", token)
    env = {**os.environ, "KCERT_HOME": str(tmp_path / "home")}
    done = subprocess.run(_certify_argv(source), env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr  # a verdict, not a crash of the certifier
    # the module did plant them (inside): deep, and up to the private /tmp's size
    planted = re.search(r"planted (\d+) folders deep and (\d+) MiB", done.stdout)
    assert planted is not None, done.stdout
    assert int(planted.group(1)) > 1000 and int(planted.group(2)) > 1000
    found = subprocess.run(["find", "/tmp", "-xdev", "-name", f"{token}*", "-print", "-quit"],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert found.stdout == ""

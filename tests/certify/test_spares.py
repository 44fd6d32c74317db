"""The worker pool: warm workers taken once and never shared, started only when asked for,
and all gone when the pool closes or the certifier exits.

These run real worker processes on the Triton interpreter: no GPU is needed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_procs import sandboxed_python, worker_processes
from test_sandbox import gone, job, kernel

from kcert.certify.execution import RunStatus
from kcert.certify.pipeline import CertifyOptions, certify
from kcert.certify.report import Verdict
from kcert.certify.sandbox import Sandbox
from kcert.certify.spares import WorkerPool, worker_env
from kcert.certify.spec import SpecFile, load_spec

EXECUTOR = "triton-interpreter"
ROOT = Path(__file__).resolve().parents[2]


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    with WorkerPool() as made:
        yield made


@pytest.mark.triton
def test_a_sandbox_takes_the_warm_worker_and_with_spares_the_next_one_starts(
    pool: WorkerPool,
) -> None:
    pool.spares = 1
    pool.prefetch(EXECUTOR)
    [spare] = pool.spare_pids(EXECUTOR)
    with Sandbox(kernel("copy"), EXECUTOR, pool=pool) as first:
        assert first.pid == spare
        [following] = pool.spare_pids(EXECUTOR)
        assert following != spare
        outcome = first.run(job(first.kernel, 16))
        assert outcome.ok, outcome.message
        with Sandbox(kernel("copy"), EXECUTOR, pool=pool) as second:
            # the next sandbox gets its own process, never one a kernel already ran in
            assert second.pid == following != first.pid
            assert second.run(job(second.kernel, 16)).ok
    assert gone(spare) and gone(following)
    assert pool.used == 2 and pool.started == 3 and len(pool.spare_pids(EXECUTOR)) == 1


@pytest.mark.triton
def test_a_pool_without_spares_starts_only_what_is_taken(pool: WorkerPool) -> None:
    with Sandbox(kernel("copy"), EXECUTOR, pool=pool) as sandbox:
        assert sandbox.run(job(sandbox.kernel, 16)).ok
        assert pool.spare_pids(EXECUTOR) == []
    assert (pool.started, pool.used) == (1, 1)


@pytest.mark.triton
def test_a_one_shot_certify_starts_only_the_workers_it_uses(
    pool: WorkerPool, tmp_path: Path,
) -> None:  # fmt: skip
    spec = _spec(tmp_path)
    for name, verdict in (("scale", Verdict.PASS), ("scale_tail", Verdict.FAIL)):
        before = (pool.started, pool.used)
        report = certify(spec.kernel(name), CertifyOptions(executor=EXECUTOR, max_probes=2,
                                                            minimize=False), pool=pool)
        assert report.verdict is verdict
        started, used = pool.started - before[0], pool.used - before[1]
        assert started == used >= 1, (name, started, used)
        assert pool.spare_pids(EXECUTOR) == []


@pytest.mark.triton
def test_certify_without_a_pool_leaves_no_worker_behind(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    before = worker_processes()
    report = certify(spec.kernel("scale"), CertifyOptions(executor=EXECUTOR, max_probes=1))
    assert report.verdict is Verdict.PASS
    assert worker_processes() - before == set()


@pytest.mark.triton
def test_a_spare_imports_torch_before_any_kernel_is_given(pool: WorkerPool) -> None:
    pool.prefetch(EXECUTOR)
    [outer] = pool.spare_pids(EXECUTOR)
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
    pool: WorkerPool, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    pool.prefetch(EXECUTOR)
    [stale] = pool.spare_pids(EXECUTOR)
    # an allowlisted variable the worker inherits (torch, Triton or libc could read one at
    # import): the spare started without it
    monkeypatch.setenv("TZ", "Pacific/Auckland")
    with Sandbox(kernel("copy"), EXECUTOR, pool=pool) as sandbox:
        assert sandbox.pid != stale
        assert gone(stale), "the stale spare was not killed"
        assert sandbox.run(job(sandbox.kernel, 8)).ok


@pytest.mark.triton
def test_kcerts_own_variables_never_reach_a_worker(
    pool: WorkerPool, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("KCERT_TOKEN", "a-secret-token")
    monkeypatch.setenv("KCERT_HOME", "/somewhere/secret")
    pool.prefetch(EXECUTOR)
    [outer] = pool.spare_pids(EXECUTOR)
    environ = Path(f"/proc/{sandboxed_python(outer)}/environ").read_bytes().split(b"\0")
    names = {entry.split(b"=", 1)[0] for entry in environ if entry}
    assert not {n for n in names if n.startswith(b"KCERT_")}
    assert b"a-secret-token" not in b"".join(environ)
    # and a spare started with them set is the one the next sandbox takes: they are not its
    monkeypatch.delenv("KCERT_TOKEN")
    with Sandbox(kernel("copy"), EXECUTOR, pool=pool) as sandbox:
        assert sandbox.pid == outer


@pytest.mark.triton
def test_an_unused_sandbox_closes_its_worker_cleanly() -> None:
    sandbox = Sandbox(kernel("copy"), EXECUTOR)
    pid = sandbox.pid
    assert pid is not None
    sandbox.close()
    assert gone(pid) and sandbox.pid is None


@pytest.mark.triton
def test_closing_the_pool_kills_its_warm_and_its_taken_workers() -> None:
    pool = WorkerPool()
    pool.prefetch(EXECUTOR, count=2)
    warm = pool.spare_pids(EXECUTOR)
    assert len(warm) == 2
    sandbox = Sandbox(kernel("copy"), EXECUTOR, pool=pool)  # left open on purpose
    taken = sandbox.pid
    assert taken in warm
    pool.close()
    assert pool.closed and pool.spare_pids(EXECUTOR) == []
    assert all(gone(pid) for pid in warm)
    with pytest.raises(RuntimeError, match="closed"):
        pool.take(EXECUTOR)
    sandbox.close()  # after the pool: still clean
    pool.close()  # idempotent


def test_importing_the_certifier_starts_nothing_and_registers_no_exit_hook() -> None:
    code = ("import atexit, os\n"
            "hooks = []\n"
            "atexit.register = lambda fn, *a, **k: hooks.append(fn)\n"
            "import kcert.certify.pipeline, kcert.certify.sandbox, kcert.cli.app\n"
            "children = open(f'/proc/{os.getpid()}/task/{os.getpid()}/children').read().split()\n"
            "print([h.__module__ for h in hooks if h.__module__.startswith('kcert')], children)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True, timeout=120)  # fmt: skip
    assert done.stdout.strip() == "[] []"


@pytest.mark.triton
def test_workers_exit_with_the_certifier(tmp_path: Path) -> None:
    for how in ("killed", "exits"):
        script = tmp_path / f"certifier_{how}.py"
        # the pool is never closed: the lifeline alone must end its workers
        script.write_text(
            "import os, sys, time\n"
            f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
            "from test_sandbox import kernel\n"
            "from kcert.certify.spares import WorkerPool\n"
            "from kcert.certify.sandbox import Sandbox\n"
            "pool = WorkerPool(spares=1)\n"
            f"sandbox = Sandbox(kernel('copy'), {EXECUTOR!r}, pool=pool)\n"
            "assert sandbox._start() is None\n"
            f"print(sandbox.pid, *pool.spare_pids({EXECUTOR!r}), flush=True)\n"
            + ("time.sleep(600)\n" if how == "killed" else "os._exit(0)\n")
        )  # fmt: skip
        with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              text=True) as certifier:  # fmt: skip
            try:
                assert certifier.stdout is not None
                worker, spare = (int(p) for p in certifier.stdout.readline().split())
            finally:
                if how == "killed":
                    certifier.kill()
                certifier.wait(timeout=60)
        assert gone(worker, within_s=10.0), f"worker {worker} outlived its certifier ({how})"
        assert gone(spare, within_s=10.0), f"spare {spare} outlived its certifier ({how})"


KERNELS = """
import triton
import triton.language as tl


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 3.0, mask=offs < n)


@triton.jit
def scale_tail(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n, other=0.0) * 3.0)
"""

SPEC = """
[[kernel]]
name = "{name}"
source = "kernels.py"
entry = "{name}"
reference = "reference.py:scale"
grid = ["cdiv(n, BLOCK)"]
dims = {{ n = [1, 100] }}
probes = {{ fresh = 1 }}

[kernel.args]
x = "in f32[n]"
out = "out f32[n]"
n = "i32 = n"
BLOCK = "const = 64"
"""


def _spec(folder: Path) -> SpecFile:
    """A kernel that passes, and one that writes past the end of ``out`` (it fails)."""
    (folder / "kernels.py").write_text(KERNELS)
    (folder / "reference.py").write_text("def scale(*, x, out, n, BLOCK):\n    return x * 3.0\n")
    (folder / "kcert.toml").write_text(SPEC.format(name="scale") + SPEC.format(name="scale_tail"))
    return load_spec(folder / "kcert.toml")


def test_an_interpreter_worker_runs_one_blas_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # the interpreter calls BLAS on small tiles one program at a time: more threads only
    # spin between calls, on the kernel's CPU deadline; a GPU worker keeps the caller's
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    interpreter = worker_env("triton-interpreter")
    assert {k: interpreter[k] for k in names} == dict.fromkeys(names, "1")
    gpu = worker_env("triton")
    assert gpu["OMP_NUM_THREADS"] == "8" and "OPENBLAS_NUM_THREADS" not in gpu

"""The sandbox contains crashes, hangs and exceptions, and returns the padded arrays intact.

These run the Triton interpreter in a real child process: no GPU is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from sandbox_procs import sandboxed_python

from kcert.certify.deadline import WALL_CEILING_FACTOR
from kcert.certify.execution import PaddedBuffer, RunJob, RunStatus
from kcert.certify.executors.base import effective_shift
from kcert.certify.sandbox import DEFAULT_STARTUP_S, NoDeviceError, Sandbox, gpu_visible
from kcert.certify.spec import KernelSpec, load_spec
from kcert.errors import KcertError, UsageError

ASSETS = Path(__file__).resolve().parents[1] / "assets"
GUARD = 64
POISON = np.float32(-1234.5)


def kernel(name: str) -> KernelSpec:
    return load_spec(ASSETS / "sandbox" / "kcert.toml").kernel(name)


def job(spec: KernelSpec, n: int, *, shift: int = 0, dtype: type = np.float32) -> RunJob:
    """x = 0, 1, 2, ... and out poisoned, each inside GUARD elements of poison."""
    buffers = []
    for buf in spec.buffers:
        padded: np.ndarray = np.full(n + 2 * GUARD, POISON, dtype=dtype)
        if buf.name == "x":
            padded[GUARD : GUARD + n] = np.arange(n).astype(dtype)
        buffers.append(PaddedBuffer(buf.name, buf.dtype, (n,), GUARD, padded))
    return RunJob(spec.bind({"n": n}), tuple(buffers), address_shift=shift)


def gone(pid: int, within_s: float = 5.0) -> bool:
    """True when no process (not even a zombie) has this pid any more."""
    stop = time.monotonic() + within_s
    while time.monotonic() < stop:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)  # a zombie counts as still there: wait for its reaper
    return False


@pytest.fixture(scope="module")
def copier() -> Iterator[Sandbox]:
    with Sandbox(kernel("copy"), "triton-interpreter") as sandbox:
        yield sandbox


@pytest.mark.triton
def test_a_correct_kernel_writes_the_data_region_and_leaves_the_guards(copier: Sandbox) -> None:
    n = 100
    run = job(copier.kernel, n)
    before = {b.name: b.padded.copy() for b in run.buffers}
    outcome = copier.run(run)
    assert outcome.ok, outcome.message
    out = outcome.buffers["out"]
    assert out.dtype == np.float32 and out.shape == (n + 2 * GUARD,)
    np.testing.assert_array_equal(out[GUARD : GUARD + n], np.arange(n, dtype=np.float32))
    assert (out[:GUARD] == POISON).all() and (out[GUARD + n :] == POISON).all()
    np.testing.assert_array_equal(outcome.buffers["x"], before["x"])
    # the job's own arrays are the certifier's pristine copies: never written
    for b in run.buffers:
        np.testing.assert_array_equal(b.padded, before[b.name])
    assert outcome.elapsed_s > 0


@pytest.mark.parametrize("shift", [0, 16, 48, 100, 4096])
@pytest.mark.triton
def test_address_shifts_keep_results_and_alignment(copier: Sandbox, shift: int) -> None:
    outcome = copier.run(job(copier.kernel, 33, shift=shift))
    assert outcome.ok, outcome.message
    np.testing.assert_array_equal(outcome.buffers["out"][GUARD : GUARD + 33], np.arange(33))
    assert effective_shift(shift) % 16 == 0 and 0 <= shift - effective_shift(shift) < 16


@pytest.mark.triton
def test_large_buffers_cross_the_pipe_as_bytes(copier: Sandbox) -> None:
    n = 1 << 20
    outcome = copier.run(job(copier.kernel, n))
    assert outcome.ok, outcome.message
    np.testing.assert_array_equal(outcome.buffers["out"][GUARD : GUARD + n],
                                  np.arange(n, dtype=np.float32))  # fmt: skip


@pytest.mark.triton
def test_bf16_buffers_round_trip() -> None:
    with Sandbox(kernel("copy_bf16"), "triton-interpreter") as sandbox:
        outcome = sandbox.run(job(sandbox.kernel, 100, dtype=ml_dtypes.bfloat16))
    assert outcome.ok, outcome.message
    out = outcome.buffers["out"]
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out[GUARD : GUARD + 100].astype(np.float32), np.arange(100))
    assert (out[:GUARD] == POISON.astype(ml_dtypes.bfloat16)).all()


@pytest.mark.triton
def test_writes_past_both_ends_land_in_the_guard_bands() -> None:
    n = 100  # BLOCK is 32: the last block stores 28 elements past the end
    with Sandbox(kernel("overrun"), "triton-interpreter") as sandbox:
        outcome = sandbox.run(job(sandbox.kernel, n))
    assert outcome.ok, outcome.message
    out = outcome.buffers["out"]
    np.testing.assert_array_equal(out[GUARD + n : GUARD + 128], np.full(28, 7.0))
    assert (out[GUARD + 128 :] == POISON).all()
    assert out[GUARD - 1] == -3.0 and (out[: GUARD - 1] == POISON).all()


@pytest.mark.triton
def test_a_segfault_is_a_crash_and_the_next_job_gets_a_fresh_worker() -> None:
    with Sandbox(kernel("segfault"), "triton-interpreter") as sandbox:
        first = sandbox.run(job(sandbox.kernel, 8))
        pid_after = sandbox.pid
        second = sandbox.run(job(sandbox.kernel, 8))
        starts = sandbox.starts
    assert first.status is RunStatus.CRASH and "SIGSEGV" in first.message
    assert "Segmentation fault" in first.message  # faulthandler's report, from the child's stderr
    assert pid_after is None and second.status is RunStatus.CRASH and starts == 2


@pytest.mark.triton
def test_an_abort_is_a_crash() -> None:
    with Sandbox(kernel("abort"), "triton-interpreter") as sandbox:
        outcome = sandbox.run(job(sandbox.kernel, 8))
    assert outcome.status is RunStatus.CRASH and "SIGABRT" in outcome.message


@pytest.mark.triton
def test_a_worker_that_exits_is_a_crash_with_its_output() -> None:
    with Sandbox(kernel("exits"), "triton-interpreter") as sandbox:
        outcome = sandbox.run(job(sandbox.kernel, 8))
    assert outcome.status is RunStatus.CRASH
    assert "exited with status 0" in outcome.message and "goodbye" in outcome.message


@pytest.mark.triton
def test_an_infinite_loop_times_out_at_the_deadline_and_the_worker_restarts() -> None:
    with Sandbox(kernel("spin"), "triton-interpreter", deadline_s=1.5) as sandbox:
        started = time.monotonic()
        first = sandbox.run(job(sandbox.kernel, 4))
        waited = time.monotonic() - started
        assert sandbox.pid is None
        second = sandbox.run(job(sandbox.kernel, 4))
        assert sandbox.starts == 2
    assert first.status is RunStatus.TIMEOUT and "used 1.5 s of CPU" in first.message
    assert second.status is RunStatus.TIMEOUT
    # never killed early; the wait also holds the worker's start, which has its own limit
    assert 1.5 <= waited < 1.5 + DEFAULT_STARTUP_S


@pytest.mark.triton
def test_a_kernel_that_sleeps_is_killed_at_the_wall_ceiling() -> None:
    with Sandbox(kernel("sleeps"), "triton-interpreter", deadline_s=0.5) as sandbox:
        assert sandbox._start() is None  # loading has its own limit
        outcome = sandbox.run(job(sandbox.kernel, 4))
        assert sandbox.pid is None
    assert outcome.status is RunStatus.TIMEOUT
    assert f"no answer within {0.5 * WALL_CEILING_FACTOR:g} s of wall time" in outcome.message
    assert outcome.elapsed_s >= 0.5 * WALL_CEILING_FACTOR


@pytest.mark.triton
def test_a_kernel_starved_of_cpu_is_not_killed_before_it_used_its_deadline() -> None:
    """Load independence: a core shared with two spinners stretches the run past its
    deadline in wall time, and it passes, because it needs less CPU than the deadline."""
    core = max(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    with Sandbox(kernel("burns_n_ms"), "triton-interpreter", deadline_s=1.0) as sandbox:
        assert sandbox._start() is None and sandbox.pid is not None
        worker = sandboxed_python(sandbox.pid)
        for tid in os.listdir(f"/proc/{worker}/task"):
            os.sched_setaffinity(int(tid), {core})
        spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
        try:
            started = time.monotonic()
            # 0.75 s of the kernel's CPU: at most half the core is the worker's when the
            # sandbox's cgroup and the test's share it fairly (a third without cgroups)
            outcome = sandbox.run(job(sandbox.kernel, 750))
            waited = time.monotonic() - started
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    assert outcome.status is RunStatus.OK, outcome.message
    # what makes this test mean something: the run took longer than its deadline
    assert waited > 1.0, f"the spinners did not slow the worker ({waited:.2f} s)"


@pytest.mark.triton
def test_a_timeout_kills_the_workers_children_too() -> None:
    mark = b"kcert-test-grandchild-of-a-hung-kernel"  # tests/assets/sandbox/kernels.py
    seen: list[int] = []

    def watch() -> None:  # from outside: the grandchild must exist while the kernel hangs
        for _ in range(100):
            seen.extend(_pids_with(mark))
            if seen:
                return
            time.sleep(0.05)

    # the kernel sleeps: the wall ceiling (4 x 1.25 s) ends it
    with Sandbox(kernel("hang_with_grandchild"), "triton-interpreter",
                 deadline_s=1.25) as sandbox:  # fmt: skip
        # the worker imports its stack and loads the kernel first: the watch starts after
        assert sandbox._start() is None
        watcher = threading.Thread(target=watch)
        watcher.start()
        outcome = sandbox.run(job(sandbox.kernel, 4))
        watcher.join()
    assert outcome.status is RunStatus.TIMEOUT
    assert seen, "the hung kernel's grandchild never started"
    assert all(gone(pid) for pid in seen), f"processes {seen} outlived the sandbox"


def _pids_with(mark: bytes) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and mark in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.triton
def test_an_exception_in_the_kernel_is_a_launch_error_and_the_worker_lives_on() -> None:
    with Sandbox(kernel("undefined_name"), "triton-interpreter") as sandbox:
        first = sandbox.run(job(sandbox.kernel, 8))
        pid = sandbox.pid
        second = sandbox.run(job(sandbox.kernel, 8))
        assert sandbox.pid == pid is not None and sandbox.starts == 1
    assert first.status is RunStatus.LAUNCH_ERROR and "no_such_value" in first.message
    assert second.status is RunStatus.LAUNCH_ERROR


@pytest.mark.triton
def test_a_module_that_fails_to_import_fails_every_run_without_restarting() -> None:
    with Sandbox(kernel("broken_import"), "triton-interpreter") as sandbox:
        outcomes = [sandbox.run(job(sandbox.kernel, 8)) for _ in range(3)]
        assert sandbox.starts == 1 and sandbox.pid is None
    for outcome in outcomes:
        assert outcome.status is RunStatus.LAUNCH_ERROR
        assert "failed to load" in outcome.message and "broken on purpose" in outcome.message


@pytest.mark.triton
def test_memory_exhaustion_is_out_of_memory() -> None:
    with Sandbox(kernel("out_of_memory"), "triton-interpreter") as sandbox:
        outcome = sandbox.run(job(sandbox.kernel, 8))
    assert outcome.status is RunStatus.OOM
    assert "workspace" in outcome.message


@pytest.mark.triton
def test_close_leaves_no_process_behind() -> None:
    sandbox = Sandbox(kernel("copy"), "triton-interpreter")
    assert sandbox.run(job(sandbox.kernel, 8)).ok
    pid = sandbox.pid
    assert pid is not None
    sandbox.close()
    assert gone(pid) and sandbox.pid is None


@pytest.mark.triton
def test_a_kernel_crash_leaves_other_sandboxes_untouched(copier: Sandbox) -> None:
    with Sandbox(kernel("segfault"), "triton-interpreter") as bad:
        assert bad.run(job(bad.kernel, 8)).status is RunStatus.CRASH
    outcome = copier.run(job(copier.kernel, 50))
    assert outcome.ok and (outcome.buffers["out"][GUARD : GUARD + 50] == np.arange(50)).all()


@pytest.mark.triton
def test_job_buffers_must_match_the_kernel(copier: Sandbox) -> None:
    run = job(copier.kernel, 8)
    with pytest.raises(ValueError, match="do not match"):
        copier.run(RunJob(run.launch, run.buffers[:1]))


def test_executor_must_fit_the_kernels_language() -> None:
    with pytest.raises(UsageError, match="runs CUDA C kernels"):
        Sandbox(kernel("copy"), "cuda")
    with pytest.raises(UsageError, match="unknown executor"):
        Sandbox(kernel("copy"), "opencl")


@pytest.mark.skipif(gpu_visible()[0], reason="checks the message on a machine without a GPU")
@pytest.mark.triton
def test_a_gpu_executor_without_a_gpu_says_lint_still_works() -> None:
    with pytest.raises(NoDeviceError) as caught:
        Sandbox(kernel("copy"), "triton")
    assert isinstance(caught.value, KcertError)
    assert "kcert lint" in caught.value.diagnostics()
    assert "triton-interpreter" in caught.value.diagnostics()


@pytest.mark.triton
def test_timing_is_refused_on_the_interpreter(copier: Sandbox) -> None:
    with pytest.raises(KcertError, match="needs a GPU"):
        copier.time(job(copier.kernel, 8))


@pytest.mark.triton
def test_the_worker_exits_when_the_certifier_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "certifier.py"
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "from test_sandbox import job, kernel\n"
        "from kcert.certify.sandbox import Sandbox\n"
        "sandbox = Sandbox(kernel('spin'), 'triton-interpreter', deadline_s=600)\n"
        "sandbox._start()\n"
        "print(sandbox.pid, flush=True)\n"
        "sandbox.run(job(sandbox.kernel, 4))\n"
    )
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                          text=True) as certifier:  # fmt: skip
        try:
            assert certifier.stdout is not None
            worker = int(certifier.stdout.readline())
            time.sleep(1.0)  # the worker is spinning in the kernel by now
        finally:
            certifier.kill()
    assert gone(worker, within_s=10.0), f"worker {worker} outlived its certifier"

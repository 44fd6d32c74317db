"""Run candidate kernels in a child process with a deadline, and survive whatever they do.

A :class:`Sandbox` owns one persistent worker process (:mod:`kcert.certify.worker`)
per kernel, so that torch, Triton or CuPy are imported and the kernel loaded
once, not once per probe. Each :meth:`Sandbox.run` sends one
:class:`~kcert.certify.execution.RunJob` and waits until the worker has used
``deadline_s`` of CPU, or four times that of wall time when it uses none
(:mod:`kcert.certify.deadline`: load on the machine cannot trip it).
Whatever the kernel does, the parent gets a :class:`RunOutcome`:

- a segfault or abort in the child: ``crash``, with the signal and the tail of
  the child's stderr (faulthandler prints the Python stack there);
- a hang: ``timeout``; the child's whole process group is killed at the deadline
  (a spin after ``deadline_s`` of CPU, a block at the wall ceiling);
- a CUDA error: ``launch-error``; a sticky one (the context is dead) also makes
  the child exit, and the next job gets a fresh child;
- an exception in the kernel's Python (including a failed import): ``launch-error``;
- memory exhaustion: ``out-of-memory``.

The child is started with ``subprocess`` in a new session (never forked from a
process that may hold a CUDA context) and always reaped: no zombie or orphan
outlives the sandbox. It is started when the sandbox is made, or taken from
the caller's :class:`~kcert.certify.spares.WorkerPool`, where it may be warm:
it imported torch or CuPy before any kernel existed. Either way no other
kernel ever ran in it. Arrays
cross the pipes as raw bytes, never pickled lists, and the parent never
unpickles anything the child sends.

Every worker runs inside :mod:`kcert.certify.jail` (bubblewrap: its own user,
PID and network namespaces, a read-only view of Python and the driver, a
private writable folder, rlimits), so malice is contained as well as faults:
the kernel cannot read keys or the spec's folder, write outside its folder,
reach the network, or outlive the sandbox. ``sandbox=False`` is for trusted
code only, and the certificate records it. The spec's baseline is timed in a
second worker that never loads the kernel, so the kernel cannot slow it down
or replace it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import numpy as np

from kcert.certify import spares
from kcert.certify.deadline import Deadline, Overrun, TreeClock, wait
from kcert.certify.errors import (
    ExecutorUnavailable,
    NoDeviceError,
    TimedOutputError,
    TimingUnavailable,
)
from kcert.certify.execution import RunJob, RunOutcome, RunStatus
from kcert.certify.executors.base import BufferLayout, effective_shift
from kcert.certify.executors.choice import (
    check_executor,
    default_executor,
    device_arch,
    gpu_visible,
)
from kcert.certify.frames import Frames, ProtocolError
from kcert.certify.report import TimingResult
from kcert.certify.spec import KernelSpec

__all__ = [
    "ExecutorUnavailable", "NoDeviceError", "Sandbox", "TimingUnavailable", "check_executor",
    "default_executor", "device_arch", "gpu_visible",
]  # fmt: skip

#: How long a fresh worker may take to import its stack and load the kernel (CPU seconds,
#: under the same wall ceiling as a job's deadline).
DEFAULT_STARTUP_S = 120.0
#: Wall seconds for the answer's bytes to arrive once the answer began (the header), and
#: for the buffers after the wall ceiling.
_TRANSFER_GRACE_S = 30.0
_LOG_TAIL = 2000


class Sandbox:
    """One kernel, one executor, one child process at a time.

    ``build`` is the :class:`~kcert.certify.build.Build` to run for a CUDA
    kernel; without it the sandbox builds for ``arch`` (default: the device's).
    ``wrapper`` is put before every worker's command line (compute-sanitizer).
    ``pool`` is where its workers come from (warm ones when the pool has them);
    without one, each worker is started when the sandbox needs it.
    """

    def __init__(
        self, kernel: KernelSpec, executor: str, *, deadline_s: float = 30.0,
        arch: str | None = None, build: Any = None, startup_s: float = DEFAULT_STARTUP_S,
        sandbox: bool = True, mode: Literal["kernel", "baseline"] = "kernel",
        wrapper: tuple[str, ...] = (), share: Path | None = None,
        pool: spares.WorkerPool | None = None,
    ) -> None:  # fmt: skip
        check_executor(kernel, executor)
        if deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        self.kernel, self.executor = kernel, executor
        self.deadline_s, self.startup_s = deadline_s, startup_s
        self.sandbox, self.mode = sandbox, mode
        self.wrapper, self.share = tuple(wrapper), share
        self._pool = pool
        self.artifact: bytes | None = None
        if executor == "cuda" and mode == "kernel":
            if build is None:
                # lazy: only a CUDA kernel's sandbox builds it in the parent (NVRTC)
                from kcert.certify.build import build_cuda

                build = build_cuda(kernel, arch=arch or device_arch(), sandbox=sandbox)
            self.artifact = bytes(build.cubin)
        self._proc: subprocess.Popen[bytes] | None = None
        self._inbox: Connection | None = None  # what the child sends
        self._outbox: Connection | None = None  # what the child reads
        self._ready = False
        self._load_failure: RunOutcome | None = None
        self._log: IO[bytes] | None = None  # the current (or last) worker's output
        self._worker: spares.WorkerProcess | None = None
        self._finalizer = weakref.finalize(self, _reap, None, None, None, None)
        #: Workers started so far (a restart after a failure adds one).
        self.starts = 0
        # now, not at the first run: its imports overlap the caller's work until then
        self._spawn()

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()

    def close(self) -> None:
        """Ask the worker to exit, then make sure it and its children are gone."""
        if self._proc is not None and self._outbox is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self._outbox.send_bytes(pickle.dumps({"op": "exit"}))
            if self._inbox is not None:
                # end-of-file on its pipe: the worker is gone; the reaper then ends the sandbox
                # at once, rather than waiting the second bubblewrap takes to notice
                Frames(self._inbox.fileno()).ready(time.monotonic() + 5.0)
        self._stop_worker()
        self._finalizer()

    @property
    def pid(self) -> int | None:
        """The current worker's process id (None when no worker runs)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _spawn(self) -> None:
        """Adopt a worker no kernel has run in (a warm one when the pool has one that fits)."""
        take = self._pool.take if self._pool is not None else spares.start
        worker = take(self.executor, sandbox=self.sandbox, wrapper=self.wrapper, share=self.share)
        self._finalizer.detach()
        if self._log is not None:
            self._log.close()  # the previous worker's: it is reaped, its tail already read
        self._proc, self._inbox, self._outbox = worker.proc, worker.inbox, worker.outbox
        self._log, self._worker = worker.log, worker
        self._finalizer = weakref.finalize(
            self, _reap, self._proc, self._inbox, self._outbox, self._log, worker
        )
        self._ready = False
        self.starts += 1

    def _stop_worker(self) -> None:
        _reap(self._proc, self._inbox, self._outbox, None, self._worker)
        self._proc, self._inbox, self._outbox, self._ready = None, None, None, False

    def _start(self) -> RunOutcome | None:
        """Start a worker and wait for it to load the kernel; a failure comes back as an outcome."""
        if self._load_failure is not None:
            return self._load_failure
        if self._ready and self._proc is not None and self._proc.poll() is None:
            return None
        if self._proc is None or self._ready:
            # the last worker failed (or died after loading): a fresh one, never a reused one
            self._stop_worker()
            self._spawn()
        assert self._outbox is not None
        mark = self._log_mark()
        init = {"mode": self.mode, "kernel": self.kernel, "executor": self.executor,
                "artifact": self.artifact}  # fmt: skip
        try:
            self._outbox.send_bytes(pickle.dumps(init))
        except OSError:
            pass  # the child already died; the wait below says how
        header, failure, _ = self._receive(Deadline(self.startup_s), mark, "loading")
        if failure is None and header is not None and not header.get("ok"):
            status = str(header.get("status"))
            message = str(header.get("message", ""))
            if status == "environment":
                self._stop_worker()
                raise ExecutorUnavailable(f"executor '{self.executor}': {message}")
            failure = _outcome(status, f"the kernel failed to load: {message}")
        if failure is not None:
            # loading is the same for every job: don't pay the failure once per probe
            self._load_failure = failure
            self._stop_worker()
            return failure
        self._ready = True
        return None

    # ------------------------------------------------------------------ the wire

    def _log_mark(self) -> int:
        assert self._log is not None
        return os.fstat(self._log.fileno()).st_size

    def _log_tail(self, mark: int) -> str:
        assert self._log is not None
        end = os.fstat(self._log.fileno()).st_size
        start = max(mark, end - _LOG_TAIL)
        text = os.pread(self._log.fileno(), end - start, start).decode("utf-8", errors="replace")
        return text.strip()

    def _death(self, mark: int, what: str) -> RunOutcome:
        """The outcome for a child that died (or broke the protocol) while ``what``."""
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = None
        self._stop_worker()
        if self.sandbox and code is not None and code > 128:
            code = 128 - code  # bwrap's init passes a signal on as 128 + its number
        if code is not None and code < 0:
            name = _signal_name(-code)
            status = RunStatus.CRASH
            reason = f"the worker died of {name} while {what}"
            if -code == signal.SIGKILL:
                reason += " (killed from outside, often by the system's out-of-memory killer)"
        elif code is None:
            status, reason = RunStatus.CRASH, f"the worker broke the protocol while {what}"
        else:
            status, reason = RunStatus.CRASH, f"the worker exited with status {code} while {what}"
        tail = self._log_tail(mark)
        return RunOutcome(status, f"{reason}; its last output:\n{tail}" if tail else reason)

    def _timeout(self, over: Overrun, limit: Deadline, what: str) -> RunOutcome:
        self._stop_worker()
        if over.limit == "cpu":
            reason = (
                f"used {limit.cpu_s:g} s of CPU without an answer while {what}: the worker "
                "was killed (an infinite loop, or a kernel far slower than the deadline allows)"
            )
        else:
            reason = (
                f"no answer within {limit.wall_s:g} s of wall time while {what}, having used "
                f"{over.cpu_s:.1f} of its {limit.cpu_s:g} s of CPU: the worker was killed (it "
                "waited without computing: a deadlock, a sleep, a device that never finishes)"
            )
        return RunOutcome(RunStatus.TIMEOUT, reason, elapsed_s=over.wall_s)

    def _receive(
        self, limit: Deadline, mark: int, what: str
    ) -> tuple[dict[str, Any] | None, RunOutcome | None, TreeClock]:
        """One JSON header from the child within ``limit``, or the outcome of its failure.

        The clock starts now, so call this right after sending the job; it comes back
        with the header for the deadlines of what follows.
        """
        assert self._inbox is not None and self._proc is not None
        frames = Frames(self._inbox.fileno())
        clock = TreeClock(self._proc.pid)
        over = wait(frames.ready, clock, limit)
        if over is not None:
            return None, self._timeout(over, limit, what), clock
        try:
            header = frames.header(time.monotonic() + _TRANSFER_GRACE_S)
        except ProtocolError:
            # a half-sent, oversized or malformed header: the child is broken or lying
            return None, self._death(mark, what), clock
        return header, None, clock

    def _send_job(self, request: dict[str, Any], job: RunJob) -> bool:
        assert self._outbox is not None
        try:
            self._outbox.send_bytes(pickle.dumps(request))
            for buffer in job.buffers:
                raw = np.ascontiguousarray(buffer.padded).view(np.uint8)
                self._outbox.send_bytes(raw.data)
        except OSError:
            return False
        return True

    def _request(self, op: str, job: RunJob) -> dict[str, Any]:
        known = {b.name for b in self.kernel.buffers}
        given = [b.name for b in job.buffers]
        if sorted(given) != sorted(known):
            raise ValueError(f"job buffers {given} do not match the kernel's {sorted(known)}")
        layouts = [BufferLayout(b.name, b.dtype, tuple(b.shape), b.guard, int(b.padded.size))
                   for b in job.buffers]  # fmt: skip
        for b, layout in zip(job.buffers, layouts, strict=True):
            if b.padded.ndim != 1 or layout.guard + layout.size > layout.length:
                raise ValueError(f"buffer '{b.name}' is not a 1-D padded array holding its data")
        shift = [effective_shift(job.buffer_shifts.get(b.name, job.address_shift))
                 for b in job.buffers]  # fmt: skip
        return {"op": op, "launch": job.launch, "layouts": layouts, "shift": shift,
                "launches": max(1, job.launches)}  # fmt: skip

    # ------------------------------------------------------------------ jobs

    def run(self, job: RunJob) -> RunOutcome:
        """Run one job in the worker; kernel misbehaviour comes back as a failed outcome."""
        request = self._request("run", job)
        failure = self._start()
        if failure is not None:
            return failure
        mark = self._log_mark()
        what = f"running '{self.kernel.entry}'"
        if not self._send_job(request, job):
            return self._death(mark, what)
        limit = Deadline(self.deadline_s)
        header, failure, clock = self._receive(limit, mark, what)
        if failure is not None:
            return failure
        assert header is not None
        elapsed = clock.wall_s()
        if header.get("status") != "ok":
            outcome = _outcome(str(header.get("status")), str(header.get("message", "")), elapsed)
            if not header.get("healthy", True):
                self._reap_exited(mark)
            return outcome
        arrays = self._receive_arrays(job, clock.started + limit.wall_s + _TRANSFER_GRACE_S)
        if arrays is None:
            return self._death(mark, f"sending back the buffers of '{self.kernel.entry}'")
        return RunOutcome(RunStatus.OK, "", arrays, elapsed)

    def _receive_arrays(self, job: RunJob, deadline: float) -> dict[str, np.ndarray] | None:
        """Each buffer's bytes, exactly its size, before ``deadline``; None if the child fails."""
        assert self._inbox is not None
        frames = Frames(self._inbox.fileno())
        arrays: dict[str, np.ndarray] = {}
        for buffer in job.buffers:
            out = np.empty_like(buffer.padded)
            try:
                frames.read_into(out.view(np.uint8).data, deadline)
            except ProtocolError:
                return None
            arrays[buffer.name] = out
        return arrays

    def _reap_exited(self, mark: int) -> None:
        """After a sticky error the worker exits by itself; wait for it so it is no zombie."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10.0)
        self._stop_worker()

    def time(
        self, job: RunJob, which: Literal["kernel", "baseline"] = "kernel", *,
        budget_ms: float = 125.0,
        check: Callable[[Mapping[str, np.ndarray]], None] | None = None,
    ) -> TimingResult | RunOutcome:  # fmt: skip
        """Time the kernel or the spec's baseline on the job's inputs, in the worker.

        The worker makes device buffers from the job once, then calls
        :func:`kcert.certify.timing.time_callable` with a launch callable; before
        every timed run the ``out`` buffers get the job's fill back and the ``inout``
        buffers their pristine contents.
        ``check``, when given, gets the padded buffers as the last timed run
        left them (here, in the parent); if it raises, the timed work was not the
        real work and :class:`~kcert.certify.errors.TimedOutputError` is raised.

        Returns the :class:`TimingResult`, or a failed :class:`RunOutcome` when
        the kernel crashed, hung or raised while being timed. Raises
        :class:`TimingUnavailable` on the interpreter or without a baseline.
        """
        if which not in ("kernel", "baseline"):
            raise ValueError(f"which must be 'kernel' or 'baseline', not {which!r}")
        if self.executor == "triton-interpreter":
            raise TimingUnavailable(
                "timing needs a GPU: the Triton interpreter runs kernels on the CPU one program "
                "at a time, so its times say nothing about the kernel"
            )
        if which == "baseline" and self.kernel.baseline is None:
            raise TimingUnavailable(f"kernel '{self.kernel.name}' names no baseline to time")
        if (which == "baseline") != (self.mode == "baseline"):
            raise ValueError(f"a {self.mode} sandbox cannot time the {which}")
        request = self._request("time", job)
        request.update(which=which, budget_ms=float(budget_ms))
        failure = self._start()
        if failure is not None:
            return failure
        mark = self._log_mark()
        what = f"timing the {which}"
        if not self._send_job(request, job):
            return self._death(mark, what)
        # the routine runs for a few times its budget (warmup, calibration, flushes); each launch
        # is still bounded by the deadline (CPU seconds, as a run's)
        limit = Deadline(self.deadline_s + budget_ms / 1000.0 * 8)
        header, failure, _ = self._receive(limit, mark, what)
        if failure is not None:
            return failure
        assert header is not None
        if header.get("status") != "ok":
            outcome = _outcome(str(header.get("status")), str(header.get("message", "")))
            if not header.get("healthy", True):
                self._reap_exited(mark)
            return outcome
        result = _timing_result(header.get("result"))
        arrays = self._receive_arrays(job, time.monotonic() + _TRANSFER_GRACE_S)
        if arrays is None:
            return self._death(mark, f"sending back the buffers after {what}")
        if result is None:
            self._stop_worker()
            return RunOutcome(RunStatus.CRASH, f"the worker sent a malformed result after {what}")
        if check is not None:
            try:
                check(arrays)
            except Exception as exc:  # whatever the check raises means: wrong output
                raise TimedOutputError(f"{type(exc).__name__}: {exc}") from exc
        return result


def _timing_result(payload: Any) -> TimingResult | None:
    """A :class:`TimingResult` from the child's JSON, checked field by field."""
    if not isinstance(payload, dict) or set(payload) != set(TimingResult.__dataclass_fields__):
        return None
    floats = ("median_ms", "p99_ms", "min_ms", "cv")
    if not all(isinstance(payload[k], int | float) for k in floats):
        return None
    runs = payload["runs"]
    if not isinstance(runs, int) or isinstance(runs, bool):
        return None
    median, p99, least, cv = (float(payload[k]) for k in floats)
    return TimingResult(median_ms=median, p99_ms=p99, min_ms=least, cv=cv, runs=runs)


def _outcome(status: str, message: str, elapsed_s: float = 0.0) -> RunOutcome:
    try:
        parsed = RunStatus(status)
    except ValueError:
        parsed = RunStatus.CRASH
    if parsed is RunStatus.OK:
        parsed = RunStatus.CRASH  # an "ok" here means a failure without data: the protocol broke
    return RunOutcome(parsed, message or f"the kernel failed ({status})", elapsed_s=elapsed_s)


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


#: Kept under its old name: the finalizers and older callers use it.
_reap = spares.reap

"""Worker processes for the sandbox, and :class:`WorkerPool`, which keeps warm ones ready.

Starting a worker costs seconds, nearly all of it ``import torch`` and
``import triton`` (or ``import cupy``), while loading a kernel into a worker
that has them takes milliseconds. So the worker imports its executor's stack
*before* it waits for a kernel (:func:`kcert.certify.worker.preload`), and a
:class:`WorkerPool` can start one ahead of need: :meth:`WorkerPool.prefetch`
when its owner knows a sandbox is coming (the pipeline does it first thing,
so that the imports overlap the build, the reference and the probes), and,
with ``spares=N``, N more after every take, for an owner that knows more work
follows (the CLI certifying several kernels, a refine loop). A pool with no
spares starts exactly the workers its sandboxes take.

The pool is an object its owner makes and closes (a context manager), never
a global: nothing here runs at import. :meth:`WorkerPool.close` kills every
worker the pool started, taken or not, so after it no process that could
have run kernel code is left (the CLI reads the signing key only then).

Isolation is unchanged: a spare has loaded no kernel and never touched a GPU
(imports only), each worker serves exactly one sandbox worker's life, and a
worker that failed is never reused: the sandbox takes a fresh one. Every
worker is started inside :mod:`kcert.certify.jail` (unless the caller asked
for no sandbox) with an environment built from an allowlist, so a spare
started earlier is exactly what a fresh worker would be, and one started
under other variables is never handed out. Each worker also exits when the
lifeline pipe the certifier holds reaches end-of-file, so none outlives its
certifier even when a pool is never closed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import IO

from kcert.certify import jail

__all__ = ["WorkerKey", "WorkerPool", "WorkerProcess", "launch", "reap", "start"]

#: Worker kinds that launch on the GPU, and so see the NVIDIA device files.
GPU_KINDS = frozenset({"cuda", "triton"})


@dataclass(frozen=True)
class WorkerKey:
    """Everything a worker process is started with: two workers with one key are alike."""

    executor: str
    sandbox: bool
    python: str
    #: The allowlisted variables a worker started now inherits (OMP_NUM_THREADS, ...): a
    #: spare started under other values would not be what a fresh worker is.
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def now(cls, executor: str, *, sandbox: bool = True) -> WorkerKey:
        """The key of a worker for ``executor`` started now, from this process."""
        # absolute, not resolved: started by a relative path, Python reports a relative one,
        # and the worker's working directory is not ours; a venv's link decides its prefix
        python = os.path.abspath(sys.executable)
        return cls(executor, sandbox, python, tuple(sorted(worker_env(executor).items())))


def worker_env(executor: str, tmp: str = jail.INSIDE_TMP) -> dict[str, str]:
    """The whole environment of a worker for ``executor``: an allowlist, never the caller's."""
    extra: dict[str, str] = {}
    if executor == "triton-interpreter":
        # Triton reads TRITON_INTERPRET when it is imported and when @triton.jit decorates.
        # The interpreter runs one program at a time on tiles of a few KiB: BLAS threads only
        # spin between its calls, which on a busy machine made a matmul probe 16x slower
        # (9.5 s against 0.58 s) and billed their spinning to the kernel's CPU deadline.
        # The caller's OMP_NUM_THREADS is overridden too: it would bring the spinning back.
        extra = {"TRITON_INTERPRET": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                 "OMP_NUM_THREADS": "1"}  # fmt: skip
    return jail.child_env(extra, tmp=tmp)


@dataclass
class WorkerProcess:
    """A started worker: its process, the pipe ends, its log, and what to remove after it."""

    proc: subprocess.Popen[bytes]
    inbox: Connection  # what the child sends
    outbox: Connection  # what the child reads
    log: IO[bytes]
    key: WorkerKey
    owner: int  # the pid that started it: a forked certifier must not share it
    #: An unsandboxed child's private folder, removed when it is reaped (a sandboxed child's
    #: /tmp is a tmpfs that ends with its sandbox).
    workdir: Path | None = None
    #: Held open by the certifier: the child exits when it reads end-of-file here.
    lifeline: int | None = None
    cgroup: jail.ChildCgroup | None = None
    #: Where bwrap wrote its record (the PID namespace's init), read when the worker is reaped.
    info: int | None = None


def launch(
    key: WorkerKey, wrapper: tuple[str, ...] = (), share: Path | None = None
) -> WorkerProcess:  # fmt: skip
    """Start a worker, sandboxed unless the key says not; it preloads its modules, then waits.

    ``wrapper`` goes before the worker's command line, inside the sandbox (a tool
    that runs the worker as its child, such as compute-sanitizer); ``share`` is a
    folder of the caller's that the sandbox may write (where that tool reports).
    """
    child_reads, parent_writes = os.pipe()
    parent_reads, child_writes = os.pipe()
    life_child, life_parent = os.pipe()
    info_read, info_write = os.pipe()
    log: IO[bytes] = tempfile.TemporaryFile(prefix="kcert-worker-")
    workdir: Path | None = None
    cgroup: jail.ChildCgroup | None = None
    gpu = key.executor in GPU_KINDS
    limits = jail.Limits.for_child(gpu=gpu)
    argv = [*wrapper, key.python, "-m", "kcert.certify.worker", str(child_reads),
            str(child_writes), str(life_child), key.executor, jail.encode_limits(limits)]
    try:
        if key.sandbox:
            argv = jail.command(argv, gpu=gpu, info_fd=info_write, share=share, limits=limits)
            env = worker_env(key.executor)
            cgroup = jail.ChildCgroup.make(limits)
            if cgroup is not None:
                argv = cgroup.wrap(argv)
            cwd = "/"
        else:
            workdir = Path(tempfile.mkdtemp(prefix="kcert-worker-"))
            env = worker_env(key.executor, tmp=str(workdir))
            cwd = str(workdir)
        proc = subprocess.Popen(
            argv, pass_fds=(child_reads, child_writes, life_child, info_write),
            stdin=subprocess.DEVNULL,
            stdout=log, stderr=log, env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
    except BaseException:
        for fd in (parent_reads, parent_writes, life_parent, info_read):
            os.close(fd)
        log.close()
        if workdir is not None:
            _remove_tree(workdir)
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        for fd in (child_reads, child_writes, life_child, info_write):
            os.close(fd)
    inbox = Connection(parent_reads, writable=False)
    outbox = Connection(parent_writes, readable=False)
    return WorkerProcess(proc, inbox, outbox, log, key, os.getpid(), workdir, life_parent, cgroup,
                         info_read)  # fmt: skip


def reap(
    proc: subprocess.Popen[bytes] | None, inbox: Connection | None, outbox: Connection | None,
    log: IO[bytes] | None, worker: WorkerProcess | None = None,
) -> None:  # fmt: skip
    """Kill a worker's whole process group, wait for it, close its pipes (idempotent).

    With ``worker``, first end its sandbox's PID namespace (every process the
    kernel started dies with it), then close its lifeline and remove its private
    folder and cgroup.
    """
    if worker is not None and worker.info is not None:
        jail.end_sandbox(worker.info)
        worker.info = None
    for conn in (outbox, inbox):
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()
    if proc is not None:
        # the group first: a worker's own children (compilers, helpers) go with it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10.0)
    if log is not None:
        log.close()
    if worker is not None:
        release(worker)


def release(worker: WorkerProcess) -> None:
    """Free what a dead worker leaves: its lifeline, private folder and cgroup (idempotent)."""
    if worker.lifeline is not None:
        with contextlib.suppress(OSError):
            os.close(worker.lifeline)
        worker.lifeline = None
    if worker.workdir is not None:
        _remove_tree(worker.workdir)
        worker.workdir = None
    if worker.cgroup is not None:
        worker.cgroup.remove()
        worker.cgroup = None


def _remove_tree(folder: Path) -> None:
    """Remove an unsandboxed child's folder, however deep it made it (never raises).

    ``shutil.rmtree`` recurses in Python and gives up on a tree a few thousand deep;
    ``rm -rf`` does not.
    """
    try:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(folder)], timeout=120,
                       check=False, stdin=subprocess.DEVNULL, capture_output=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass


def _reap_worker(worker: WorkerProcess) -> None:
    reap(worker.proc, worker.inbox, worker.outbox, worker.log, worker)



def start(
    executor: str, *, sandbox: bool = True, wrapper: tuple[str, ...] = (),
    share: Path | None = None,
) -> WorkerProcess:  # fmt: skip
    """A fresh worker for ``executor``, started now: what a sandbox without a pool runs in."""
    return launch(WorkerKey.now(executor, sandbox=sandbox), wrapper, share)


class WorkerPool:
    """The sandbox workers of one owner: started on demand or ahead of it, all killed at close.

    ``spares`` is how many warm workers of a kind to keep ready after each
    take: 0 (the default) for a one-shot certification, which then starts only
    the workers it uses; 1 for an owner that certifies again soon. It may be
    changed between certifications (the CLI drops it to 0 before its last kernel).
    ``started`` and ``used`` count the workers started and handed to sandboxes.
    """

    def __init__(self, *, spares: int = 0) -> None:
        if spares < 0:
            raise ValueError("spares must be 0 or more")
        self.spares = spares
        self.started = 0
        self.used = 0
        self._lock = threading.Lock()
        self._closed = False
        #: Warm workers no kernel has run in, by executor, oldest first.
        self._warm: dict[str, list[WorkerProcess]] = {}
        #: Every worker started and not yet known dead, warm or handed out.
        self._workers: list[WorkerProcess] = []
        # a pool dropped without close() still frees its workers' folders and cgroups (the
        # lifeline already ends the processes with the certifier)
        self._finalizer = weakref.finalize(self, _kill_all, self._warm, self._workers)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Kill every worker this pool started, warm or taken, and wait for each (idempotent)."""
        self._closed = True
        self._finalizer()

    def take(
        self, executor: str, *, sandbox: bool = True, wrapper: tuple[str, ...] = (),
        share: Path | None = None,
    ) -> WorkerProcess:  # fmt: skip
        """A worker for ``executor`` that no kernel has run in: a warm one if it fits, else new.

        With ``spares`` set, the pool then starts that many more at once, so that they
        have imported their modules by the time the next sandbox wants one. A worker
        under a ``wrapper`` is always started afresh: warm workers run unwrapped.
        """
        key = WorkerKey.now(executor, sandbox=sandbox)
        if wrapper:
            worker = self._launch(key, wrapper, share)
        else:
            worker = self._claim(key) or self._launch(key)
        with self._lock:
            self.used += 1
        if self.spares and not wrapper:
            self._fill(key, self.spares)
        return worker

    def prefetch(self, executor: str, *, sandbox: bool = True, count: int = 1) -> None:
        """Have ``count`` warm workers for ``executor`` ready, starting the ones missing now.

        For an owner that knows a sandbox for ``executor`` is coming: its worker
        imports while the owner does other work.
        """
        self._fill(WorkerKey.now(executor, sandbox=sandbox), count)

    def spare_pids(self, executor: str) -> list[int]:
        """The process ids of the warm workers waiting for ``executor``."""
        with self._lock:
            warm = list(self._warm.get(executor, ()))
        return [w.proc.pid for w in warm if w.proc.poll() is None]

    # ------------------------------------------------------------------ inside

    def _launch(
        self, key: WorkerKey, wrapper: tuple[str, ...] = (), share: Path | None = None
    ) -> WorkerProcess:  # fmt: skip
        if self._closed:
            raise RuntimeError("this worker pool is closed")
        worker = launch(key, wrapper, share)
        with self._lock:
            # forget the workers their sandboxes already reaped
            self._workers[:] = [w for w in self._workers if not _released(w)]
            self._workers.append(worker)
            self.started += 1
        return worker

    def _claim(self, key: WorkerKey) -> WorkerProcess | None:
        """Remove and return the oldest warm worker that fits ``key``; reap any that do not."""
        with self._lock:
            warm = self._warm.get(key.executor, [])
            fits = [w for w in warm if _usable(w, key)]
            stale = [w for w in warm if w not in fits]
            self._warm[key.executor] = fits[1:]
        for worker in stale:
            _reap_worker(worker)  # started under another environment, or it died: never used
        return fits[0] if fits else None

    def _fill(self, key: WorkerKey, count: int) -> None:
        """Start warm workers for ``key`` until ``count`` fit; reap the ones that do not fit."""
        with self._lock:
            warm = self._warm.get(key.executor, [])
            fits = [w for w in warm if _usable(w, key)]
            stale = [w for w in warm if w not in fits]
            self._warm[key.executor] = fits
        for worker in stale:
            _reap_worker(worker)
        for _ in range(count - len(fits)):
            worker = self._launch(key)
            with self._lock:
                self._warm.setdefault(key.executor, []).append(worker)


def _usable(worker: WorkerProcess, key: WorkerKey) -> bool:
    return worker.owner == os.getpid() and worker.key == key and worker.proc.poll() is None


def _released(worker: WorkerProcess) -> bool:
    """Whether the worker's sandbox has already reaped it and freed what it left."""
    return worker.proc.returncode is not None and worker.lifeline is None and worker.info is None


def _kill_all(warm: dict[str, list[WorkerProcess]], workers: list[WorkerProcess]) -> None:
    """Reap every worker a pool started: its warm ones, and the taken ones still alive."""
    spares = [w for kind in warm.values() for w in kind]
    warm.clear()
    taken = [w for w in workers if all(w is not s for s in spares)]
    workers.clear()
    for worker in spares:
        if worker.owner == os.getpid():  # a forked certifier must not kill its parent's
            _reap_worker(worker)
    for worker in taken:
        if worker.owner == os.getpid() and not _released(worker):
            # the sandbox owns the log: it reads the tail, then closes it
            reap(worker.proc, worker.inbox, worker.outbox, None, worker)

"""Worker processes for the sandbox, and one warm spare of each kind kept ready.

Starting a worker costs seconds, nearly all of it ``import torch`` and
``import triton`` (or ``import cupy``), while loading a kernel into a worker
that has them takes milliseconds. So the worker imports its executor's stack
*before* it waits for a kernel (:func:`kcert.certify.worker.preload`), and
this module keeps one such spare per kind of worker: when a
:class:`~kcert.certify.sandbox.Sandbox` takes it, the next spare starts at
once, and imports while the taken one runs its kernel. The pipeline calls
:func:`prewarm` first thing, so that the first import overlaps the build,
the reference and the probes.

Isolation is unchanged: a spare has loaded no kernel and never touched a GPU
(imports only), each spare serves exactly one sandbox worker's life, and a
worker that failed is never reused: the sandbox takes a fresh one. Every
worker is started inside :mod:`kcert.certify.jail` (unless the caller asked
for no sandbox) with an environment built from an allowlist, so a spare
started earlier is exactly what a fresh worker would be. Spares exit with the
certifier: an ``atexit`` hook kills them, and each worker also exits when the
lifeline pipe the certifier holds reaches end-of-file.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO

from kcert.certify import jail

__all__ = ["WorkerKey", "WorkerProcess", "discard_spares", "prewarm", "reap", "spare_pid", "take"]

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
    extra = {"TRITON_INTERPRET": "1"} if executor == "triton-interpreter" else {}
    # Triton reads TRITON_INTERPRET when it is imported and when @triton.jit decorates
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


_lock = threading.Lock()
_spares: dict[str, WorkerProcess] = {}  # by executor: one spare of each kind


def _usable(worker: WorkerProcess, key: WorkerKey) -> bool:
    return worker.owner == os.getpid() and worker.key == key and worker.proc.poll() is None


def _claim(key: WorkerKey) -> WorkerProcess | None:
    """Remove and return the spare for ``key``'s executor if it fits ``key``."""
    with _lock:
        spare = _spares.pop(key.executor, None)
    if spare is None:
        return None
    if spare.owner != os.getpid():
        return None  # started by the process we were forked from: not ours to use or kill
    if _usable(spare, key):
        return spare
    _reap_worker(spare)  # started under another environment, or it died: never used
    return None


def _refill(key: WorkerKey) -> None:
    spare = launch(key)
    extra: WorkerProcess | None
    with _lock:
        previous = _spares.get(key.executor)
        if previous is not None and _usable(previous, key):
            extra = spare  # another thread refilled first
        else:
            _spares[key.executor], extra = spare, previous
    if extra is not None and extra.owner == os.getpid():
        _reap_worker(extra)


def take(
    executor: str, *, sandbox: bool = True, wrapper: tuple[str, ...] = (),
    share: Path | None = None,
) -> WorkerProcess:  # fmt: skip
    """A worker for ``executor`` that no kernel has run in: the spare if it fits, else a new one.

    Either way the next spare starts at once, so that it has imported its
    modules by the time the next sandbox wants it (while the taken worker,
    when it was a spare, has nothing left to import). A worker under a
    ``wrapper`` is always started afresh: spares run unwrapped.
    """
    key = WorkerKey.now(executor, sandbox=sandbox)
    if wrapper:
        return launch(key, wrapper, share)
    worker = _claim(key) or launch(key)
    _refill(key)
    return worker


def prewarm(executor: str, *, sandbox: bool = True) -> None:
    """Start a spare for ``executor`` now, unless a fitting one is already there."""
    key = WorkerKey.now(executor, sandbox=sandbox)
    with _lock:
        spare = _spares.get(executor)
        if spare is not None and _usable(spare, key):
            return
    _refill(key)


def spare_pid(executor: str) -> int | None:
    """The process id of the spare waiting for ``executor``, if one is."""
    with _lock:
        spare = _spares.get(executor)
    return spare.proc.pid if spare is not None and spare.proc.poll() is None else None


def discard_spares() -> None:
    """Kill every spare this process started (at exit, and where a test wants none)."""
    with _lock:
        spares = list(_spares.values())
        _spares.clear()
    for spare in spares:
        if spare.owner == os.getpid():
            _reap_worker(spare)


atexit.register(discard_spares)

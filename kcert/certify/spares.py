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
worker that failed is never reused: the sandbox takes a fresh one. A spare is
only used when it was started with the environment, working directory and
interpreter a fresh worker would get now, or else killed and replaced by a
worker started the ordinary way. Only kcert's own variables and pytest's
per-test marker may differ: no preloaded module reads them, and the worker
takes their current values before it loads the kernel
(:func:`kcert.certify.worker.late_variable`). Spares
exit with the certifier: an ``atexit`` hook kills them, and each worker also
watches its parent process.
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

import kcert
from kcert.certify.worker import late_variable

__all__ = ["WorkerKey", "WorkerProcess", "discard_spares", "prewarm", "reap", "spare_pid", "take"]


@dataclass(frozen=True)
class WorkerKey:
    """Everything a worker process is started with: two workers with one key are alike."""

    executor: str
    env: tuple[tuple[str, str], ...]
    cwd: str
    python: str

    @classmethod
    def now(cls, executor: str) -> WorkerKey:
        """The key of a worker for ``executor`` started now, from this process.

        Variables the worker sets again at init (:func:`late_variable`) are left out.
        """
        env = {k: v for k, v in worker_env(executor).items() if not late_variable(k)}
        return cls(executor, tuple(sorted(env.items())), os.getcwd(), sys.executable)


def worker_env(executor: str) -> dict[str, str]:
    """The environment a worker for ``executor`` gets, started now."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # the child must import this very kcert, even when it is not installed
    root = str(Path(kcert.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if executor == "triton-interpreter":
        # Triton reads it when it is imported and when @triton.jit decorates the kernel
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


@dataclass
class WorkerProcess:
    """A started worker: its process, the two pipe ends, and the log its output goes to."""

    proc: subprocess.Popen[bytes]
    inbox: Connection  # what the child sends
    outbox: Connection  # what the child reads
    log: IO[bytes]
    key: WorkerKey
    owner: int  # the pid that started it: a forked certifier must not share it


def late_env(executor: str) -> dict[str, str]:
    """The late variables (:func:`late_variable`) a worker started now would get."""
    return {k: v for k, v in worker_env(executor).items() if late_variable(k)}


def launch(key: WorkerKey, wrapper: tuple[str, ...] = ()) -> WorkerProcess:
    """Start a worker in its own session; it preloads its executor's modules, then waits.

    ``wrapper`` goes before the worker's command line (a tool that runs the worker as
    its child, such as compute-sanitizer); the worker then watches that parent.
    """
    child_reads, parent_writes = os.pipe()
    parent_reads, child_writes = os.pipe()
    log: IO[bytes] = tempfile.TemporaryFile(prefix="kcert-worker-")
    try:
        proc = subprocess.Popen(
            [*wrapper, key.python, "-m", "kcert.certify.worker", str(child_reads),
             str(child_writes), key.executor, *(() if wrapper else (str(os.getpid()),))],
            pass_fds=(child_reads, child_writes), stdin=subprocess.DEVNULL, stdout=log,
            stderr=log, env={**dict(key.env), **late_env(key.executor)}, cwd=key.cwd,
            start_new_session=True,
        )  # fmt: skip
    except BaseException:
        for fd in (parent_reads, parent_writes):
            os.close(fd)
        log.close()
        raise
    finally:
        os.close(child_reads)
        os.close(child_writes)
    inbox = Connection(parent_reads, writable=False)
    outbox = Connection(parent_writes, readable=False)
    return WorkerProcess(proc, inbox, outbox, log, key, os.getpid())


def reap(
    proc: subprocess.Popen[bytes] | None, inbox: Connection | None, outbox: Connection | None,
    log: IO[bytes] | None,
) -> None:  # fmt: skip
    """Kill a worker's whole process group, wait for it, close its pipes (idempotent)."""
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


def _reap_worker(worker: WorkerProcess) -> None:
    reap(worker.proc, worker.inbox, worker.outbox, worker.log)


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


def take(executor: str, wrapper: tuple[str, ...] = ()) -> WorkerProcess:
    """A worker for ``executor`` that no kernel has run in: the spare if it fits, else a new one.

    Either way the next spare starts at once, so that it has imported its
    modules by the time the next sandbox wants it (while the taken worker,
    when it was a spare, has nothing left to import). A worker under a
    ``wrapper`` is always started afresh: spares run unwrapped.
    """
    key = WorkerKey.now(executor)
    if wrapper:
        return launch(key, wrapper)
    worker = _claim(key) or launch(key)
    _refill(key)
    return worker


def prewarm(executor: str) -> None:
    """Start a spare for ``executor`` now, unless a fitting one is already there."""
    key = WorkerKey.now(executor)
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

"""The sandbox's child process: load one kernel once, then run jobs until told to stop.

Started for :class:`kcert.certify.sandbox.Sandbox` (by
:mod:`kcert.certify.spares`) as ``python -m kcert.certify.worker READ_FD
WRITE_FD [EXECUTOR PARENT_PID]`` in its own session, with stdout and stderr going to a
log the parent reads when the child dies. Given its executor, the worker
imports that executor's modules (torch and Triton, or CuPy) before it waits
for a kernel, so a spare is warm when a sandbox takes it; it touches no
device until a kernel is loaded. The parent speaks pickle to the child (the
parent is trusted); the child answers in JSON headers followed by raw array
bytes, because the child runs code that a model wrote and the parent must
never unpickle what that code could forge.

Messages, parent to child: ``init`` (kernel, executor, artifact, baseline)
or ``exit`` (a spare that is not needed), then ``run`` or ``time`` headers
each followed by one raw frame per padded buffer, or ``exit``. Child to
parent: one ``ready`` header after init; for a run, a header then one raw
frame per buffer when the status is ``ok``; for a timing, a header with the
figures. A kernel fault that leaves the device unusable makes the child
answer and then exit, so the parent starts a fresh
one for the next job.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from kcert.certify.execution import RunStatus
from kcert.certify.executors.base import (
    BufferLayout,
    Executor,
    Fault,
    Unavailable,
    describe,
    import_source,
)
from kcert.certify.spec import Callable_, KernelSpec, Launch


def make_executor(name: str, kernel: KernelSpec) -> Executor:
    if name == "cuda":
        from kcert.certify.executors.cuda_exec import CudaExecutor

        return CudaExecutor(kernel)
    from kcert.certify.executors.triton_exec import TritonExecutor

    return TritonExecutor(kernel, interpret=name == "triton-interpreter")


def _send(conn: Connection, header: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(header).encode("utf-8"))


def _receive_buffers(conn: Connection, layouts: Sequence[BufferLayout]) -> list[np.ndarray]:
    host = []
    for layout in layouts:
        data = np.empty(layout.nbytes, dtype=np.uint8)
        conn.recv_bytes_into(data)
        host.append(data)
    return host


def _load_baseline(ref: Callable_) -> Callable[..., Any]:
    module = import_source(ref.path, "kcert_baseline")
    fn = getattr(module, ref.function, None)
    if not callable(fn):
        raise Fault(RunStatus.LAUNCH_ERROR, f"{ref.path.name} defines no function '{ref.function}'")
    return fn  # type: ignore[no-any-return]


def _time(
    executor: Executor, request: dict[str, Any], host: list[np.ndarray]
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Time the kernel or its baseline with the certifier's timing routine, in this process.

    Returns the figures and the padded buffers as the last timed run left them.
    """
    try:
        from kcert.certify import timing
    except ImportError as exc:
        raise Fault(RunStatus.LAUNCH_ERROR, "timing routine not available "
                    f"(kcert.certify.timing does not import: {exc})") from exc  # fmt: skip
    baseline = None
    if request["which"] == "baseline":
        ref = executor.kernel.baseline
        if ref is None:
            raise Fault(RunStatus.LAUNCH_ERROR, "the spec names no baseline to time")
        baseline = _load_baseline(ref)
    run = executor.device_run(request["launch"], request["layouts"], host, baseline=baseline)
    result = timing.time_callable(run.launch, synchronize=run.synchronize,
                                  budget_ms=request["budget_ms"], refresh=run.refresh)  # fmt: skip
    return asdict(result), run.read_back()


#: What each executor imports before its kernel; importing touches no device.
PRELOAD: dict[str, tuple[str, ...]] = {
    "triton-interpreter": ("torch", "triton", "kcert.certify.executors.triton_exec"),
    "triton": ("torch", "triton", "kcert.certify.executors.triton_exec"),
    "cuda": ("cupy", "kcert.certify.executors.cuda_exec"),
}


def late_variable(name: str) -> bool:
    """Whether an environment variable may change between a spare's start and its kernel.

    kcert's own variables and pytest's per-test marker are read by no module a
    worker preloads (Python, torch, Triton, CuPy), so a spare started under other
    values is still alike; the init message brings their current values, and
    :func:`serve` sets them before the kernel is loaded.
    """
    return name.startswith("KCERT_") or name == "PYTEST_CURRENT_TEST"


def _apply_late_env(env: dict[str, str]) -> None:
    for name in [n for n in os.environ if late_variable(n) and n not in env]:
        del os.environ[name]
    os.environ.update({k: v for k, v in env.items() if late_variable(k)})


def preload(executor: str) -> None:
    """Import the executor's heavy modules now, while nobody waits for this worker yet.

    A failure is left for :meth:`Executor.load` to meet again and report, exactly as
    without the preload.
    """
    for module in PRELOAD.get(executor, ()):
        try:
            importlib.import_module(module)
        except Exception:  # ImportError and whatever a broken install raises: load says it
            return


def serve(inbox: Connection, outbox: Connection) -> int:
    init = pickle.loads(inbox.recv_bytes())
    if init.get("op") == "exit":
        return 0  # a spare the certifier did not need
    _apply_late_env(init.get("env", {}))
    kernel: KernelSpec = init["kernel"]
    try:
        executor = make_executor(init["executor"], kernel)
        executor.load(init["artifact"])
    except Fault as fault:
        _send(outbox, {"op": "ready", "ok": False, "status": str(fault.status),
                       "message": fault.message})  # fmt: skip
        return 0
    except (ImportError, Unavailable) as exc:
        what = "cannot import what it needs" if isinstance(exc, ImportError) else "cannot run here"
        _send(outbox, {"op": "ready", "ok": False, "status": "environment",
                       "message": f"the executor {what}: {exc}"})  # fmt: skip
        return 0
    except Exception as exc:  # anything else while loading is the kernel's or the artifact's
        failure = describe(exc, "loading the kernel")
        _send(outbox, {"op": "ready", "ok": False, "status": str(failure.status),
                       "message": failure.message})  # fmt: skip
        return 0
    _send(outbox, {"op": "ready", "ok": True})
    while True:
        try:
            request = pickle.loads(inbox.recv_bytes())
        except EOFError:
            return 0
        if request["op"] == "exit":
            return 0
        launch: Launch = request["launch"]
        layouts: list[BufferLayout] = request["layouts"]
        host = _receive_buffers(inbox, layouts)
        healthy = True
        try:
            started = time.perf_counter()
            figures: dict[str, Any] | None = None
            if request["op"] == "time":
                figures, results = _time(executor, request, host)
            else:
                results = executor.run(launch, layouts, host, shift=request["shift"],
                                       launches=request["launches"])  # fmt: skip
            elapsed = time.perf_counter() - started
            _send(outbox, {"op": request["op"], "status": "ok", "message": "",
                           "elapsed_s": elapsed, "result": figures})  # fmt: skip
            for data in results:
                outbox.send_bytes(data.data)
        except Exception as exc:  # the kernel's or baseline's own code: any exception is theirs
            failure = exc if isinstance(exc, Fault) else describe(exc, request["op"])
            healthy = failure.healthy and executor.healthy()
            _send(outbox, {"op": request["op"], "status": str(failure.status),
                           "message": failure.message, "healthy": healthy})  # fmt: skip
        if not healthy:
            return 3


def _watch_parent(parent: int) -> None:
    """Exit when the certifier dies, even while a kernel hangs: nobody would reap us."""
    while True:
        if os.getppid() != parent:
            os._exit(70)
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    read_fd, write_fd = int(args[0]), int(args[1])
    # the certifier's pid from the command line: a spare's certifier may die while this
    # interpreter starts, and getppid() would then already name the new parent
    parent = int(args[3]) if len(args) > 3 else os.getppid()
    # a thread, not PR_SET_PDEATHSIG: that signal follows the parent *thread*, and a
    # certifier may run in a worker thread that ends long before the sandbox does
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    # a segfault prints the Python stack to stderr, which the parent shows in the outcome
    faulthandler.enable(all_threads=False)
    if len(args) > 2:
        preload(args[2])
    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    try:
        return serve(inbox, outbox)
    except (BrokenPipeError, EOFError):
        return 0  # the parent went away: nothing is left to report to
    finally:
        inbox.close()
        outbox.close()
        sys.stdout.flush()


if __name__ == "__main__":
    code = main()
    # skip interpreter teardown: a kernel may have left threads or device state behind
    os._exit(code)

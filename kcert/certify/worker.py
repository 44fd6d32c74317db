"""The sandbox's child process: load one kernel once, then run jobs until told to stop.

Started (by :mod:`kcert.certify.spares`) as ``python -m kcert.certify.worker
READ_FD WRITE_FD LIFELINE_FD KIND LIMITS``, inside :mod:`kcert.certify.jail`
unless the certifier was told not to sandbox, with stdout and stderr going to
a log the parent reads when the child dies. Before anything else it sets its
rlimits (:func:`kcert.certify.jail.apply_limits`) and starts a thread that
exits the process when the certifier's end of the lifeline pipe closes.
Given its kind, it imports that kind's modules (torch and Triton, or CuPy)
before it waits for work, so a spare is warm when a sandbox takes it; it
touches no device until a kernel is loaded. The parent speaks pickle to the
child (the parent is trusted); the child answers in JSON headers followed by
raw bytes, because the child runs code that a model wrote and the parent must
never unpickle what that code could forge.

Modes, from the first message: ``kernel`` loads the kernel (from the bytes
the spec carries, never a path) and serves ``run`` and ``time`` jobs;
``baseline`` loads only the spec's baseline, so that the baseline is timed in
a process the kernel never ran in; ``build`` compiles the kernel once for each
const assignment and exits (:mod:`kcert.certify.build_child`); ``exit`` is a
spare the certifier did not need. A kernel fault that leaves the device
unusable makes the child answer and then exit, so the parent starts a fresh
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
    import_code,
)
from kcert.certify.jail import apply_limits
from kcert.certify.spec import Callable_, KernelSpec, Launch


def make_executor(name: str, kernel: KernelSpec) -> Executor:
    if name == "cuda":
        # lazy: the worker child imports only the executor and build it runs
        from kcert.certify.executors.cuda_exec import CudaExecutor

        return CudaExecutor(kernel)
    # lazy: the worker child imports only the executor and build it runs
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
    module = import_code(ref.code, "kcert_baseline")
    fn = getattr(module, ref.function, None)
    if not callable(fn):
        raise Fault(RunStatus.LAUNCH_ERROR, f"{ref.path.name} defines no function '{ref.function}'")
    return fn  # type: ignore[no-any-return]


def _time(
    executor: Executor, request: dict[str, Any], host: list[np.ndarray],
    baseline: Callable[..., Any] | None,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Time the kernel or its baseline with the certifier's timing routine, in this process.

    Returns the figures and the padded buffers as the last timed run left them.
    """
    try:
        # lazy: the worker child imports only the executor and build it runs
        from kcert.certify import timing
    except ImportError as exc:
        raise Fault(RunStatus.LAUNCH_ERROR, "timing routine not available "
                    f"(kcert.certify.timing does not import: {exc})") from exc  # fmt: skip
    if (request["which"] == "baseline") != (baseline is not None):
        raise Fault(RunStatus.LAUNCH_ERROR, f"this worker cannot time the {request['which']}")
    run = executor.device_run(request["launch"], request["layouts"], host, baseline=baseline)
    result = timing.time_callable(run.launch, synchronize=run.synchronize,
                                  budget_ms=request["budget_ms"], refresh=run.refresh)  # fmt: skip
    return asdict(result), run.read_back()


#: What each executor imports before its kernel; importing touches no device.
PRELOAD: dict[str, tuple[str, ...]] = {
    "triton-interpreter": ("torch", "triton", "kcert.certify.executors.triton_exec"),
    "triton": ("torch", "triton", "kcert.certify.executors.triton_exec"),
    "cuda": ("cupy", "kcert.certify.executors.cuda_exec"),
    "build-cuda": ("cupy.cuda.nvrtc", "kcert.certify.build"),
    "build-triton": ("triton", "kcert.certify.triton_build"),
}


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
    mode = init.get("mode", "kernel")
    if init.get("op") == "exit":
        return 0  # a spare the certifier did not need
    kernel: KernelSpec = init["kernel"]
    if mode == "build":
        return _serve_build(outbox, kernel, init)
    try:
        executor = make_executor(init["executor"], kernel)
        if mode == "kernel":
            executor.load(init["artifact"])
            baseline = None
        else:  # the baseline alone: this process never sees the kernel's code
            if kernel.baseline is None:
                raise Fault(RunStatus.LAUNCH_ERROR, "the spec names no baseline to time")
            baseline = _load_baseline(kernel.baseline)
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
                figures, results = _time(executor, request, host, baseline)
            elif baseline is not None:
                raise Fault(RunStatus.LAUNCH_ERROR, "a baseline worker only times")
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


def _serve_build(outbox: Connection, kernel: KernelSpec, init: dict[str, Any]) -> int:
    """Compile ``kernel`` for each const assignment; one header, then PTX and cubin frames."""
    # lazy: the worker child imports only the executor and build it runs
    from kcert.certify.build import compile_cuda
    from kcert.certify.errors import BuildError, CompilerUnavailable

    arg_names: list[str] | None = None
    try:
        if kernel.language == "cuda":
            builds = [compile_cuda(kernel, init["arch"])]
        else:
            # lazy: the worker child imports only the executor and build it runs
            from kcert.certify.triton_build import compile_triton, load_entry

            fn = load_entry(kernel)
            arg_names = list(fn.arg_names)
            builds = compile_triton(kernel, fn, init["arch"], init["const_sets"])
    except CompilerUnavailable as exc:
        _send(outbox, {"ok": False, "status": "environment", "message": exc.diagnostics()})
        return 0
    except BuildError as exc:
        # the parameter names too: a spec that lists the wrong ones is told so first
        _send(outbox, {"ok": False, "status": "build-error", "message": exc.message,
                       "log": exc.log, "arg_names": arg_names})  # fmt: skip
        return 0
    except Exception as exc:  # the kernel module's own code, run by its import
        failure = describe(exc, "building the kernel")
        _send(outbox, {"ok": False, "status": "build-error", "message": failure.message})
        return 0
    _send(outbox, {"ok": True, "arg_names": arg_names, "builds": [
        {"options": list(b.options), "compiler": b.compiler, "log": b.log} for b in builds]})
    for b in builds:
        outbox.send_bytes(b.ptx)
        outbox.send_bytes(b.cubin)
    return 0


def _watch_lifeline(fd: int) -> None:
    """Exit when the certifier's end of the lifeline closes, even while a kernel hangs."""
    while True:
        try:
            if not os.read(fd, 1):
                os._exit(70)
        except InterruptedError:
            continue
        except OSError:
            os._exit(70)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    read_fd, write_fd, lifeline = int(args[0]), int(args[1]), int(args[2])
    kind = args[3]
    # first of all: nothing the kernel brings may run before the limits hold
    apply_limits(json.loads(args[4]))
    # a thread, not PR_SET_PDEATHSIG: that signal follows the parent *thread*, and a
    # certifier may start the sandbox from a worker thread that ends long before it
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    # a segfault prints the Python stack to stderr, which the parent shows in the outcome
    faulthandler.enable(all_threads=False)
    preload(kind)
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

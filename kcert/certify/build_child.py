"""Compile a kernel in a sandboxed child: the certifier never imports or compiles kernel code.

A Triton module is Python: importing it to reach its ``@triton.jit`` function
runs its module code, and Triton's compiler runs inside that import's
process. NVRTC parses a hostile source and can be asked to include any file.
So both happen in a one-shot worker (:mod:`kcert.certify.worker`, ``build``
mode) inside :mod:`kcert.certify.jail`. The child gets the source's bytes with
the spec (never a path to read) and answers with a JSON header and raw frames
for each build's PTX and cubin. The parent checks what comes back
(:func:`kcert.certify.build.finish_build` finds the entry and reads the
resources) and caches it; nothing the child sends is unpickled.
"""

from __future__ import annotations

import pickle
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcert.certify import spares
from kcert.certify.errors import BuildError, CompilerUnavailable
from kcert.certify.frames import Frames, ProtocolError
from kcert.certify.spec import ConstValue, KernelSpec

#: Seconds one build child may take, start-up and every const assignment together.
BUILD_DEADLINE_S = 300.0
#: The most one PTX or cubin may take.
MAX_ARTIFACT_BYTES = 256 << 20
_LOG_TAIL = 4000


@dataclass(frozen=True, slots=True)
class RawBuild:
    """One compile as the child reports it, before the parent checks it."""

    options: tuple[str, ...]
    compiler: str
    ptx: bytes
    cubin: bytes
    log: str


@dataclass(frozen=True, slots=True)
class ChildBuilds:
    builds: tuple[RawBuild, ...]
    #: The Triton entry's parameter names (None for CUDA C).
    arg_names: tuple[str, ...] | None


def kind_for(kernel: KernelSpec) -> str:
    return "build-cuda" if kernel.language == "cuda" else "build-triton"


def build_in_child(
    kernel: KernelSpec, *, arch: str, const_sets: Sequence[Mapping[str, ConstValue]] = (),
    sandbox: bool = True, deadline_s: float = BUILD_DEADLINE_S,
) -> ChildBuilds:  # fmt: skip
    """Compile ``kernel`` for ``arch`` (each const assignment, for Triton) in a fresh child."""
    worker = spares.launch(spares.WorkerKey.now(kind_for(kernel), sandbox=sandbox))
    try:
        request = {"mode": "build", "kernel": kernel, "executor": worker.key.executor,
                   "arch": arch, "const_sets": [dict(c) for c in const_sets]}  # fmt: skip
        try:
            worker.outbox.send_bytes(pickle.dumps(request))
        except OSError:
            pass  # the child already died: the wait below says how
        return _answer(worker, time.monotonic() + deadline_s, deadline_s)
    finally:
        spares.reap(worker.proc, worker.inbox, worker.outbox, None, worker)
        worker.log.close()


def _answer(worker: spares.WorkerProcess, deadline: float, limit: float) -> ChildBuilds:
    header = _receive(worker, deadline, limit)
    if not header.get("ok"):
        message = str(header.get("message", "the build failed"))
        if header.get("status") == "environment":
            raise CompilerUnavailable(message)
        raise BuildError(message, log=str(header.get("log", "")), arg_names=_names(header))
    builds: list[RawBuild] = []
    entries = header.get("builds")
    if not isinstance(entries, list) or not entries:
        raise BuildError("the build process sent a malformed answer")
    for entry in entries:
        try:
            ptx = _frame(worker, deadline)
            cubin = _frame(worker, deadline)
            builds.append(RawBuild(tuple(str(o) for o in entry["options"]), str(entry["compiler"]),
                                   ptx, cubin, str(entry["log"])))  # fmt: skip
        except (KeyError, TypeError) as exc:
            raise BuildError("the build process sent a malformed answer") from exc
    return ChildBuilds(tuple(builds), _names(header))


def _names(header: dict[str, Any]) -> tuple[str, ...] | None:
    names = header.get("arg_names")
    return tuple(str(n) for n in names) if isinstance(names, list) else None


def _receive(worker: spares.WorkerProcess, deadline: float, limit: float) -> dict[str, Any]:
    frames = Frames(worker.inbox.fileno())
    if not frames.ready(deadline):
        raise BuildError(f"the build took longer than {limit:g} s and was stopped")
    try:
        return frames.header(deadline)
    except ProtocolError as exc:
        raise BuildError(f"the build process broke the protocol: {exc}",
                         log=_tail(worker)) from exc  # fmt: skip


def _frame(worker: spares.WorkerProcess, deadline: float) -> bytes:
    try:
        return Frames(worker.inbox.fileno()).read(MAX_ARTIFACT_BYTES, deadline)
    except ProtocolError as exc:
        raise BuildError(f"the build process broke the protocol: {exc}",
                         log=_tail(worker)) from exc  # fmt: skip


def _tail(worker: spares.WorkerProcess) -> str:
    try:
        worker.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass
    worker.log.seek(0, 2)
    size = worker.log.tell()
    worker.log.seek(max(0, size - _LOG_TAIL))
    return worker.log.read().decode("utf-8", errors="replace").strip()

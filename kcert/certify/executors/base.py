"""What every executor does, and the errors the sandbox raises for the environment.

An executor lives in the sandbox's child process. It loads one kernel once,
then for each :class:`~kcert.certify.execution.RunJob` it copies the padded
host arrays to device memory verbatim, launches with pointers to the data
regions, synchronizes and copies the padded arrays back. It knows nothing of
the checks: the certifier makes them on the host.

A kernel's misbehaviour never escapes as an exception from :meth:`Executor.run`:
it comes back as a :class:`Fault` with a status. Only this module's
:class:`ExecutorUnavailable` family is about the environment, and the sandbox
raises it from its constructor in the parent, before any child exists.
"""

from __future__ import annotations

import abc
import importlib.util
import math
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kcert.certify.execution import RunStatus
from kcert.certify.sources import SourceFile
from kcert.certify.spec import ConstArg, KernelSpec, Launch, NoneArg, ScalarArg

#: Every padded array starts at this alignment plus the job's address shift. A page,
#: not the 256 bytes CUDA promises, so that the certifier's two runs differ in
#: alignment too: with a shift of 4096 + 256, run A's arrays sit on 4096-byte
#: boundaries and run B's on 256-byte ones, and a kernel whose result depends on
#: the alignment of its pointers shows up as non-deterministic.
BASE_ALIGN = 4096
#: The address shift is rounded down to a multiple of this, so that vector loads
#: of up to 16 bytes stay aligned whatever shift the certifier asks for.
SHIFT_ALIGN = 16

_MESSAGE_LIMIT = 4000


def host_dtype(dtype: str) -> np.dtype[Any]:
    """The NumPy dtype of a spec dtype (bf16 through ml_dtypes)."""
    if dtype == "bf16":
        # lazy: ml_dtypes is needed only for the narrow float dtypes
        import ml_dtypes

        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    names = {
        "f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "i16": "int16",
        "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
        "u64": "uint64", "bool": "bool",
    }  # fmt: skip
    return np.dtype(names[dtype])


def per_buffer(shift: int | Sequence[int], count: int) -> list[int]:
    """One shift per buffer: ``shift`` for each, or the given list."""
    return [shift] * count if isinstance(shift, int) else [int(s) for s in shift]


def effective_shift(address_shift: int) -> int:
    """The byte shift actually applied: non-negative and 16-byte aligned."""
    return max(0, address_shift) // SHIFT_ALIGN * SHIFT_ALIGN


@dataclass(frozen=True, slots=True)
class BufferLayout:
    """Where one padded buffer sits, sent to the child instead of the array itself."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    guard: int
    #: Elements in the whole padded array.
    length: int

    @property
    def itemsize(self) -> int:
        return host_dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.length * self.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Unavailable(Exception):
    """Raised in the child when the executor's stack cannot run here: not the kernel's fault."""


class Fault(Exception):
    """Raised inside an executor when the kernel misbehaved; carries the outcome's status."""

    def __init__(self, status: RunStatus, message: str, *, healthy: bool = True) -> None:
        super().__init__(message)
        self.status, self.message, self.healthy = status, message, healthy


@dataclass(frozen=True, slots=True)
class DeviceRun:
    """Device buffers made once for timing, and what the timing routine calls on them."""

    #: Enqueue one launch of the kernel (or the baseline) on the device, asynchronously.
    launch: Callable[[], None]
    #: Wait for the whole device.
    synchronize: Callable[[], None]
    #: Before each timed run (not timed): the ``out`` buffers get their fill back and the
    #: ``inout`` buffers their pristine contents, so the last run's output is its own work.
    refresh: Callable[[], None]
    #: Copy every padded buffer back to the host, in the job's order.
    read_back: Callable[[], list[np.ndarray]]


class Executor(abc.ABC):
    """One kernel loaded in the child, launched on padded buffers."""

    def __init__(self, kernel: KernelSpec) -> None:
        self.kernel = kernel

    @abc.abstractmethod
    def load(self, artifact: bytes | None) -> None:
        """Import or load the kernel; raise :class:`Fault` when the kernel itself fails to load."""

    @abc.abstractmethod
    def run(
        self, launch: Launch, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        *, shift: int | Sequence[int], launches: int,
    ) -> list[np.ndarray]:  # fmt: skip
        """Launch on copies of ``host`` (padded uint8 arrays); return the padded bytes after."""

    def device_run(
        self, launch: Launch, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        *, baseline: Callable[..., Any] | None,
    ) -> DeviceRun:  # fmt: skip
        """Device buffers made from ``host`` and a launch of the kernel, or of ``baseline``.

        The baseline is called with every argument by name, buffers as device
        arrays of their shape (views of the data regions), like the reference.
        """
        raise Fault(RunStatus.LAUNCH_ERROR, "timing is not available on this executor")

    def healthy(self) -> bool:
        """False when the device context is unusable (a sticky error): the worker must restart."""
        return True


def scalar_kwargs(kernel: KernelSpec, launch: Launch) -> Mapping[str, Any]:
    """Scalars and consts by name, as plain Python values of the declared kind; unused
    pointers (``none``) as ``None``."""

    values: dict[str, Any] = {}
    for arg in kernel.args:
        if isinstance(arg, ScalarArg):
            value = launch.scalars[arg.name]
            if arg.dtype == "bool":
                values[arg.name] = bool(value)
            elif arg.dtype in ("f16", "bf16", "f32", "f64"):
                values[arg.name] = float(value)
            else:
                values[arg.name] = int(value)
        elif isinstance(arg, ConstArg):
            const = launch.consts[arg.name]
            values[arg.name] = const if isinstance(const, str | float) else int(const)
        elif isinstance(arg, NoneArg):
            values[arg.name] = None
    return values


def import_code(code: SourceFile, module_name: str) -> ModuleType:
    """Import a module from the bytes the certifier read, never from the user's file.

    The bytes are written into this process's private temporary folder first:
    Triton's JIT reads a kernel's source back through ``inspect``, which needs a
    file. Its folder is importable, so a kernel may import a header-like helper
    only if the certifier handed it over too.
    """
    folder = Path(tempfile.gettempdir()) / "kcert-code" / module_name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(code.name).name
    path.write_bytes(code.data)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise Fault(RunStatus.LAUNCH_ERROR, f"cannot import {code.name} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Triton's JIT reads the kernel's source through the module, so register it
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # the kernel's own code: anything it raises is its fault
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise Fault(RunStatus.LAUNCH_ERROR, f"importing {code.name} exited") from exc
        raise describe(exc, f"importing {code.name}") from exc
    return module


def describe(exc: BaseException, what: str, *, healthy: bool = True) -> Fault:
    """Turn an exception raised by kernel code into a :class:`Fault` with a fitting status."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    root = chain[-1]
    text = " ".join(str(e) for e in chain).lower()
    oom = any(isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" for e in chain)
    if oom or "out of memory" in text:
        status = RunStatus.OOM
    else:
        status = RunStatus.LAUNCH_ERROR
    detail = f"{type(root).__name__}: {root}".strip()
    if len(detail) > _MESSAGE_LIMIT:
        detail = detail[:_MESSAGE_LIMIT] + " [...]"
    return Fault(status, f"{what} raised {detail}", healthy=healthy)

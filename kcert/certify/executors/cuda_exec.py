"""CUDA C kernels: the cubin from the build, loaded and launched with CuPy.

Each padded buffer gets its own device allocation; the job's address shift
moves the padded array inside it, so a second run sees other addresses. The
kernel receives the address of the data region, and every scalar is packed
as a NumPy scalar of its declared dtype, so an ``f32`` parameter gets four
bytes whatever Python number the spec produced. Errors surface at the launch
or at the synchronize after it; after a sticky one (an illegal address, a
trap) the context is dead and :meth:`CudaExecutor.healthy` says so, which
makes the worker exit and the sandbox start a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kcert.certify.execution import RunStatus
from kcert.certify.executors.base import (
    BASE_ALIGN,
    BufferLayout,
    DeviceRun,
    Executor,
    Fault,
    Unavailable,
    host_dtype,
    per_buffer,
    scalar_kwargs,
)
from kcert.certify.spec import BufferArg, Intent, KernelSpec, Launch, NoneArg, ScalarArg

# above this, a kernel must opt in to more dynamic shared memory
_DEFAULT_SHARED_LIMIT = 48 * 1024


class CudaExecutor(Executor):
    def __init__(self, kernel: KernelSpec) -> None:
        super().__init__(kernel)
        self.module: Any = None
        self.function: Any = None

    def load(self, artifact: bytes | None) -> None:
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy

        if not artifact:
            raise Fault(RunStatus.LAUNCH_ERROR, "no cubin was given to the CUDA executor")
        try:
            cupy.cuda.Device(0).use()
        except Exception as exc:  # no driver or no device in the child: the machine's problem
            raise Unavailable(f"CUDA device 0 cannot be used: {exc}") from exc
        try:
            self.module = cupy.cuda.function.Module()
            self.module.load(artifact)
            self.function = self.module.get_function(self.kernel.entry)
        except Exception as exc:
            raise _fault(exc, f"loading the cubin's entry '{self.kernel.entry}'",
                         healthy=self.healthy()) from exc  # fmt: skip

    # ------------------------------------------------------------------ buffers and args

    def _allocate(
        self, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        shift: int | Sequence[int],
    ) -> tuple[list[Any], dict[str, Any]]:
        """Device copies of the padded arrays, and the data regions' pointers by name."""
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy

        padded, pointers = [], {}
        shifts = per_buffer(shift, len(layouts))
        for layout, data, offset in zip(layouts, host, shifts, strict=True):
            memory = cupy.cuda.alloc(layout.nbytes + offset + BASE_ALIGN)
            start = memory + ((-memory.ptr) % BASE_ALIGN + offset)
            start.copy_from_host(data.ctypes.data, layout.nbytes)
            padded.append((memory, start, layout.nbytes))
            pointers[layout.name] = start + layout.guard * layout.itemsize
        return padded, pointers

    def _args(self, launch: Launch, pointers: dict[str, Any]) -> tuple[Any, ...]:
        args: list[Any] = []
        for arg in self.kernel.args:
            if isinstance(arg, BufferArg):
                # the raw address, 8 bytes, whatever the element type (CuPy has no bf16 arrays)
                args.append(np.uint64(pointers[arg.name].ptr))
            elif isinstance(arg, ScalarArg):
                args.append(_scalar(arg.dtype, launch.scalars[arg.name]))
            elif isinstance(arg, NoneArg):
                args.append(np.uint64(0))  # an unused pointer: null
        return tuple(args)

    def _launch_once(self, launch: Launch, args: tuple[Any, ...]) -> None:
        grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
        block = tuple(launch.block) + (1,) * (3 - len(launch.block))
        if launch.shared_mem > _DEFAULT_SHARED_LIMIT:
            # lazy: CuPy needs the CUDA stack; only a GPU path imports it
            import cupy

            driver = cupy.cuda.driver
            driver.funcSetAttribute(self.function.ptr,
                                    driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    launch.shared_mem)  # fmt: skip
        self.function(grid, block, args, shared_mem=launch.shared_mem)

    # ------------------------------------------------------------------ runs

    def run(
        self, launch: Launch, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        *, shift: int | Sequence[int], launches: int,
    ) -> list[np.ndarray]:  # fmt: skip
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy

        try:
            padded, pointers = self._allocate(layouts, host, shift)
        except Exception as exc:
            raise _fault(exc, "allocating the buffers", healthy=self.healthy()) from exc
        args = self._args(launch, pointers)
        try:
            for _ in range(launches):
                self._launch_once(launch, args)
            cupy.cuda.runtime.deviceSynchronize()
        except Exception as exc:
            raise _fault(exc, f"running '{self.kernel.entry}'", healthy=self.healthy()) from exc
        results = []
        try:
            for _, start, nbytes in padded:
                out = np.empty(nbytes, dtype=np.uint8)
                start.copy_to_host(out.ctypes.data, nbytes)
                results.append(out)
            cupy.cuda.runtime.deviceSynchronize()
        except Exception as exc:
            raise _fault(exc, "copying the buffers back", healthy=self.healthy()) from exc
        return results

    def device_run(
        self, launch: Launch, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        *, baseline: Callable[..., Any] | None,
    ) -> DeviceRun:  # fmt: skip
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy

        padded, pointers = self._allocate(layouts, host, 0)
        if baseline is None:
            args = self._args(launch, pointers)

            def launch_once() -> None:
                self._launch_once(launch, args)

        else:
            named: dict[str, Any] = dict(scalar_kwargs(self.kernel, launch))
            for layout in layouts:
                dtype = host_dtype(layout.dtype)
                if layout.dtype == "bf16":
                    dtype = np.dtype(np.uint16)  # CuPy has no bfloat16: the baseline sees bits
                named[layout.name] = cupy.ndarray(layout.shape, dtype,
                                                  memptr=pointers[layout.name])  # fmt: skip

            def launch_once() -> None:
                baseline(**named)

        # device copies of what every written buffer held before the first run: the
        # fill of the outputs, the pristine contents of the inout buffers
        written = {b.name for b in self.kernel.buffers if b.intent is not Intent.IN}
        pristine = []
        for (_, start, nbytes), layout in zip(padded, layouts, strict=True):
            if layout.name in written:
                copy = cupy.cuda.alloc(nbytes)
                copy.copy_from_device(start, nbytes)
                pristine.append((start, copy, nbytes))

        def refresh() -> None:
            for start, copy, nbytes in pristine:
                start.copy_from_device(copy, nbytes)

        def read_back() -> list[np.ndarray]:
            cupy.cuda.runtime.deviceSynchronize()
            results = []
            for _, start, nbytes in padded:
                out = np.empty(nbytes, dtype=np.uint8)
                start.copy_to_host(out.ctypes.data, nbytes)
                results.append(out)
            return results

        return DeviceRun(launch_once, cupy.cuda.runtime.deviceSynchronize, refresh, read_back)

    def healthy(self) -> bool:
        try:
            # lazy: CuPy needs the CUDA stack; only a GPU path imports it
            import cupy

            # a memset and a copy, no kernel: a JIT compile here would cost seconds
            cupy.cuda.runtime.deviceSynchronize()
            memory = cupy.cuda.alloc(16)
            memory.memset(7, 16)
            back = np.zeros(16, dtype=np.uint8)
            memory.copy_to_host(back.ctypes.data, 16)
            return bool((back == 7).all())
        except Exception:  # any error here means the context is gone (sticky)
            return False


def _scalar(dtype: str, value: float | int) -> Any:
    if dtype == "bf16":
        # lazy: ml_dtypes is needed only for the narrow float dtypes
        import ml_dtypes

        # CuPy cannot pack a bfloat16 scalar; its two bytes go as a uint16 of the same bits
        return np.array(value, dtype=ml_dtypes.bfloat16).view(np.uint16)[()]
    return host_dtype(dtype).type(value)


def _fault(exc: BaseException, what: str, *, healthy: bool) -> Fault:
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if name == "OutOfMemoryError" or "out of memory" in text.lower():
        return Fault(RunStatus.OOM, f"{what}: {text}", healthy=healthy)
    sticky = "" if healthy else " (a sticky error: the CUDA context is unusable)"
    return Fault(RunStatus.LAUNCH_ERROR, f"{what}: {text}{sticky}", healthy=healthy)

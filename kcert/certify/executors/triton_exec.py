"""Triton kernels, on a GPU (``triton``) or on the CPU (``triton-interpreter``).

The child process is started with ``TRITON_INTERPRET=1`` for the interpreter,
before anything imports Triton, because Triton reads it when ``@triton.jit``
decorates the kernel. Buffers are torch tensors over one raw byte allocation
per buffer, offset by the job's address shift; the kernel gets a view of the
data region with the buffer's shape, so an unmasked store past the end lands
in the guard band that comes back to the certifier. Arguments are passed
positionally in the spec's order (the spec lists every parameter in order,
constexprs included, and its names need not be the kernel's).
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
    describe,
    import_code,
    per_buffer,
    scalar_kwargs,
)
from kcert.certify.spec import Intent, KernelSpec, Launch


class TritonExecutor(Executor):
    """A ``@triton.jit`` kernel launched through its Python launcher."""

    def __init__(self, kernel: KernelSpec, *, interpret: bool) -> None:
        super().__init__(kernel)
        self.interpret = interpret
        self.device = "cpu" if interpret else "cuda"
        self.fn: Any = None

    def load(self, artifact: bytes | None) -> None:
        # lazy: torch is heavy and optional; only this path needs it
        import torch
        import triton  # noqa: F401  (imported before the kernel: its cost is not the kernel's)

        if not self.interpret and not torch.cuda.is_available():
            raise Unavailable(f"torch {torch.__version__} cannot use a GPU here "
                              "(torch.cuda.is_available() is False)")  # fmt: skip
        if self.interpret:
            self._exact_bf16()

        module = import_code(self.kernel.code.main, f"kcert_kernel_{self.kernel.name}")
        fn = getattr(module, self.kernel.entry, None)
        if fn is None:
            raise Fault(RunStatus.LAUNCH_ERROR,
                        f"{self.kernel.source.name} defines no '{self.kernel.entry}'")  # fmt: skip
        if not hasattr(fn, "__getitem__"):
            raise Fault(RunStatus.LAUNCH_ERROR, f"'{self.kernel.entry}' is not a @triton.jit "
                        "function (it cannot be launched as fn[grid](...))")  # fmt: skip
        self.fn = fn

    def _exact_bf16(self) -> None:
        """The interpreter's bfloat16 arithmetic made the compiler's, before the kernel loads."""
        # lazy: imports Triton's interpreter, which only this executor's worker loads
        from kcert.certify.executors import interpreter_numerics

        try:
            interpreter_numerics.install()
        except interpreter_numerics.Unsupported as exc:
            bf16 = [b.name for b in self.kernel.buffers if b.dtype == "bf16"]
            if bf16:  # the raw-bits arithmetic would fail (or pass) it for the interpreter's sake
                raise Unavailable(f"{exc}; bfloat16 buffer(s) {', '.join(bf16)} cannot be "
                                  "certified on this interpreter: certify on a GPU") from exc

    # ------------------------------------------------------------------ buffers

    def _allocate(
        self, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        shift: int | Sequence[int],
    ) -> tuple[list[Any], dict[str, Any]]:
        """Device byte ranges holding the padded buffers, and the data views by name."""
        # lazy: torch is heavy and optional; only this path needs it
        import torch

        from kcert.certify.executors.base import host_dtype

        padded, views = [], {}
        shifts = per_buffer(shift, len(layouts))
        for layout, data, offset in zip(layouts, host, shifts, strict=True):
            raw = torch.empty(layout.nbytes + offset + 2 * BASE_ALIGN, dtype=torch.uint8,
                              device=self.device)  # fmt: skip
            start = (-raw.data_ptr()) % BASE_ALIGN + offset
            region = raw[start : start + layout.nbytes]
            region.copy_(torch.from_numpy(data))
            typed = region.view(_torch_dtype(layout.dtype))
            assert typed.element_size() == host_dtype(layout.dtype).itemsize
            views[layout.name] = typed[layout.guard : layout.guard + layout.size].view(layout.shape)
            padded.append(region)
        return padded, views

    def _args(self, launch: Launch, views: dict[str, Any]) -> list[Any]:
        # positional, in the spec's order: the spec lists every parameter in order, and its
        # names need not be the kernel's
        values = {**scalar_kwargs(self.kernel, launch), **views}
        return [values[arg.name] for arg in self.kernel.args]

    def _options(self) -> dict[str, Any]:
        return {} if self.kernel.num_warps is None else {"num_warps": self.kernel.num_warps}

    def _synchronize(self) -> None:
        if not self.interpret:
            # lazy: torch is heavy and optional; only this path needs it
            import torch

            torch.cuda.synchronize()

    # ------------------------------------------------------------------ runs

    def run(
        self, launch: Launch, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        *, shift: int | Sequence[int], launches: int,
    ) -> list[np.ndarray]:  # fmt: skip
        try:
            padded, views = self._allocate(layouts, host, shift)
        except Exception as exc:
            raise describe(exc, "allocating the buffers", healthy=self.healthy()) from exc
        args, options = self._args(launch, views), self._options()
        grid = tuple(launch.grid)
        try:
            for _ in range(launches):
                self.fn[grid](*args, **options)
            self._synchronize()
        except Exception as exc:
            raise describe(exc, f"launching '{self.kernel.entry}'", healthy=self.healthy()) from exc
        try:
            return [np.ascontiguousarray(region.cpu().numpy()) for region in padded]
        except Exception as exc:
            raise describe(exc, "copying the buffers back", healthy=self.healthy()) from exc

    def device_run(
        self, launch: Launch, layouts: Sequence[BufferLayout], host: Sequence[np.ndarray],
        *, baseline: Callable[..., Any] | None,
    ) -> DeviceRun:  # fmt: skip
        if self.interpret:
            raise Fault(RunStatus.LAUNCH_ERROR, "timing needs a GPU; the Triton interpreter"
                        " runs one program at a time on the CPU: its times mean nothing")
        padded, views = self._allocate(layouts, host, 0)
        grid = tuple(launch.grid)
        if baseline is None:
            args, options = self._args(launch, views), self._options()

            def launch_once() -> None:
                self.fn[grid](*args, **options)

        else:
            named = {**scalar_kwargs(self.kernel, launch), **views}

            def launch_once() -> None:
                baseline(**named)

        # device copies of what every written buffer held before the first run: the
        # fill of the outputs, the pristine contents of the inout buffers
        pristine = [(region, region.clone())
                    for region, layout in zip(padded, layouts, strict=True)
                    if layout.name in self._written]  # fmt: skip

        def refresh() -> None:
            for region, copy in pristine:
                region.copy_(copy)

        def read_back() -> list[np.ndarray]:
            return [np.ascontiguousarray(region.cpu().numpy()) for region in padded]

        return DeviceRun(launch_once, self._synchronize, refresh, read_back)

    @property
    def _written(self) -> frozenset[str]:
        return frozenset(b.name for b in self.kernel.buffers if b.intent is not Intent.IN)

    def healthy(self) -> bool:
        if self.interpret:
            return True
        try:
            # lazy: torch is heavy and optional; only this path needs it
            import torch

            torch.cuda.synchronize()
            probe = torch.ones(16, device="cuda")
            return bool(float(probe.sum().item()) == 16.0)
        except Exception:  # any error here means the context is gone (sticky)
            return False


def _torch_dtype(dtype: str) -> Any:
    # lazy: torch is heavy and optional; only this path needs it
    import torch

    return {
        "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
        "f64": torch.float64, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
        "i64": torch.int64, "u8": torch.uint8, "u16": torch.uint16, "u32": torch.uint32,
        "u64": torch.uint64, "bool": torch.bool,
    }[dtype]  # fmt: skip

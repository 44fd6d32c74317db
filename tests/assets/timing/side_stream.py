"""Kernels for the timing tests: a spin of known length, launched openly or hidden.

``spin`` holds one thread for a fixed number of nanoseconds of the GPU's global
timer, so its true cost is known without any timing routine. The *hidden*
launchers put that spin on a side stream and return at once, leaving only a
tiny kernel on the timing stream: a routine that reads events on its own
stream alone reports the tiny kernel, not the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""

TOUCH_SOURCE = r"""
extern "C" __global__ void touch(float* out) {
    out[threadIdx.x] = 1.0f;
}
"""


def _kernels() -> tuple[Any, Any, Any]:
    import cupy

    spin = cupy.RawKernel(SPIN_SOURCE, "spin")
    touch = cupy.RawKernel(TOUCH_SOURCE, "touch")
    scratch = cupy.zeros(32, dtype=cupy.float32)
    return spin, touch, scratch


def open_spin(ns: int) -> Callable[[], None]:
    """The spin on the current stream: what an honest kernel of that cost looks like."""
    import cupy

    spin, _, _ = _kernels()

    def launch() -> None:
        spin((1,), (1,), (cupy.uint64(ns),))

    return launch


def hidden_spin(ns: int, *, non_blocking: bool) -> Callable[[], None]:
    """The spin on a side stream, and only a tiny kernel on the current stream."""
    import cupy

    spin, touch, scratch = _kernels()
    side = cupy.cuda.Stream(non_blocking=non_blocking)

    def launch() -> None:
        with side:
            spin((1,), (1,), (cupy.uint64(ns),))
        touch((1,), (32,), (scratch,))

    return launch

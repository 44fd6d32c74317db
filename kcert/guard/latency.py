"""Call latency: a fixed log-spaced histogram, timed by CUDA events or a monotonic clock.

The bucket bounds are fixed (1-2-5 steps from 1 µs to 10 s) rather than adapted
to the traffic, so that histograms from different processes, windows and
kernels add bucket by bucket and the registry can compare before and after. A
value ``v`` lands in the first bucket whose bound is ``>= v``; the last count is
the overflow beyond the largest bound (``len(counts) == len(bounds) + 1``).

On the CPU a call is timed with :func:`time.perf_counter_ns` around it. When
the call's arrays live on a GPU the wall clock would time the launch, not the
kernel, and waiting for the kernel would block the caller, so a pair of CUDA
events is recorded around the call on the current stream and read later, when
the device has passed them (``query``: never waits). Event timing follows
torch's and CuPy's documented APIs; CI has no GPU, so that path is untested there.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

#: Bucket bounds in microseconds: 1, 2, 5, 10, ..., 5e6, 1e7.
BOUNDS_US: tuple[int, ...] = tuple(m * 10**e for e in range(8) for m in (1, 2, 5))[:-2]
#: Event pairs waiting for the device; beyond this the oldest are dropped (and counted).
MAX_PENDING = 4096


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Counts of call latencies per bucket (microseconds)."""

    bounds: tuple[int, ...] = BOUNDS_US
    counts: tuple[int, ...] = (0,) * (len(BOUNDS_US) + 1)
    unit: str = "us"

    @property
    def total(self) -> int:
        return sum(self.counts)

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "bounds": list(self.bounds), "counts": list(self.counts)}


class Histogram:
    """Counts over :data:`BOUNDS_US` for the current window and since the start; thread-safe."""

    def __init__(self) -> None:
        self._window = [0] * (len(BOUNDS_US) + 1)
        self._total = [0] * (len(BOUNDS_US) + 1)
        self._lock = threading.Lock()

    def add(self, microseconds: float) -> None:
        index = bisect.bisect_left(BOUNDS_US, microseconds)
        with self._lock:
            self._window[index] += 1
            self._total[index] += 1

    def snapshot(self, *, reset: bool = False) -> LatencyHistogram:
        """The current window (``reset``: and start a new one)."""
        with self._lock:
            counts = tuple(self._window)
            if reset:
                self._window = [0] * len(self._window)
        return LatencyHistogram(counts=counts)

    def since_start(self) -> LatencyHistogram:
        with self._lock:
            return LatencyHistogram(counts=tuple(self._total))


class _Events:
    """A start/end CUDA event pair of torch or CuPy."""

    def __init__(self, library: str) -> None:
        self.library = library
        if library == "torch":
            # lazy: torch is heavy and optional; only this path needs it
            import torch

            self.start: Any = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.end: Any = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        else:
            # lazy: CuPy needs the CUDA stack; only a GPU path imports it
            import cupy

            self.start, self.end = cupy.cuda.Event(), cupy.cuda.Event()
        self.start.record()

    def stop(self) -> None:
        self.end.record()

    def done(self) -> bool:
        return bool(self.end.query()) if self.library == "torch" else bool(self.end.done)

    def microseconds(self) -> float:
        if self.library == "torch":
            return float(self.start.elapsed_time(self.end)) * 1000.0
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy

        return float(cupy.cuda.get_elapsed_time(self.start, self.end)) * 1000.0


class Timer:
    """Times calls into ``histogram``; GPU timings are added once the device has passed them."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self._pending: deque[_Events] = deque()
        self._lock = threading.Lock()
        self.dropped = 0

    def start(self, gpu: str | None) -> _Events | int:
        """Before the call: ``gpu`` is ``"torch"`` or ``"cupy"`` when its arrays are on a GPU."""
        if gpu is not None:
            return _Events(gpu)
        return time.perf_counter_ns()

    def stop(self, started: _Events | int) -> None:
        """After the call: record its latency now (CPU) or when the device gets there (GPU)."""
        if isinstance(started, int):
            self.histogram.add((time.perf_counter_ns() - started) / 1000.0)
            return
        started.stop()
        with self._lock:
            self._pending.append(started)
            if len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self.dropped += 1
        self.poll()

    def poll(self, *, wait: bool = False) -> None:
        """Move finished event pairs into the histogram; ``wait`` (worker only) syncs on each."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                head = self._pending[0]
                if not wait and not head.done():
                    return
                self._pending.popleft()
            if wait:
                head.end.synchronize()
            self.histogram.add(head.microseconds())

"""The one timing routine (after triton.testing.do_bench), its statistics, the ``timing`` check.

How to call it (the sandbox's worker does this, in the child process, on the GPU)::

    from kcert.certify import timing

    result = timing.measure(
        launch,                 # () -> None: enqueue one kernel launch on the current stream
        refresh=refresh,        # () -> None: give the inputs new contents (not timed)
        check=check,            # () -> None: check the output of the last timed run; raise if wrong
        warmup_ms=25.0, rep_ms=100.0,
    )                           # -> TimingResult (median_ms, p99_ms, min_ms, cv, runs)

``measure`` raises :class:`TimedOutputError` when ``check`` raises, and lets CUDA
errors from ``launch`` through (they are the ``launch`` check's business). Time
the kernel and the baseline with the same arguments, in the same process, then
turn both results into the ``timing`` check in the parent with
:func:`timing_outcome` (or :func:`skipped_timing` on the CPU interpreter path,
which never gets a figure). :func:`time_callable` is the same routine under the
signature the worker already uses (``synchronize=``, ``budget_ms=``).

Each timed run, following ``triton.testing.do_bench`` where it can:

1. ``refresh()``, then an L2 flush: a memset of at least twice the device's L2
   (and at least 256 MiB, as do_bench uses) on the legacy default stream, so
   that neither the inputs nor earlier outputs are served from L2; any limit
   on persisting L2 lines is set back to zero first.
2. A device-wide synchronize, then a short *gate* kernel that spins on the
   GPU's global timer for a little longer than ``launch()`` takes on the host.
   The start event follows the gate, so the GPU is not idle waiting for the
   host between the start event and the kernel (do_bench gets this by never
   synchronizing; we must synchronize, see 3).
3. start event, ``launch()``, end event, all on the legacy default stream,
   whose events wait for every *blocking* stream; then a device-wide
   synchronize and a ``done`` event. ``done - start`` bounds the time until
   the whole device was idle, so work hidden on a *non-blocking* stream is
   counted too: each sample is ``end - start``, or ``done - start - tail``
   where that is longer by more than the tail's noise (``tail``: the host's
   wake-up latency, calibrated with empty runs; see :func:`device_wide_samples`).

The garbage collector is off while a measurement runs: a pause between the
gate and the launch would land in a sample.
"""

from __future__ import annotations

import ctypes
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kcert.certify.errors import TimedOutputError, TimingError
from kcert.certify.report import CheckResult, Status, TimingReport, TimingResult
from kcert.certify.spec import Intent, KernelSpec, Launch

__all__ = [
    "METHOD", "Measurement", "TimedOutputError", "TimingError", "TimingResult",
    "device_peak_bandwidth", "flush_bytes", "gate_ns", "l2_cache_bytes", "launch_lower_bound",
    "measure", "measure_detailed", "memory_lower_bound_ms", "peak_bandwidth_from_clock",
    "percentile", "run_counts", "skipped_timing", "summarize", "time_callable", "timing_outcome",
    "traffic_bytes",
]  # fmt: skip

#: Recorded in the certificate as the timing method.
METHOD = "cuda-events/device-sync/l2-flush"
DEFAULT_WARMUP_MS = 25.0
DEFAULT_REP_MS = 100.0
#: Fewer runs make p99 and cv meaningless; more only cost memory and time.
MIN_RUNS = 10
MAX_RUNS = 5000
_MIN_FLUSH_BYTES = 256 << 20
_ESTIMATE_RUNS = 5
_CALIBRATION_RUNS = 50
_GATE_MIN_NS, _GATE_MAX_NS = 20_000, 2_000_000
#: cudaLimitPersistingL2CacheSize (cuda_runtime_api.h); CuPy has no name for it.
_LIMIT_PERSISTING_L2 = 0x06

_ITEMSIZE = {
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
    "u8": 1, "u16": 2, "u32": 4, "u64": 8, "bool": 1,
}  # fmt: skip

_GATE_SOURCE = r"""
extern "C" __global__ void kcert_gate(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


# --------------------------------------------------------------------------- pure parts


def run_counts(
    estimate_ms: float, *, warmup_ms: float, rep_ms: float,
    min_runs: int = MIN_RUNS, max_runs: int = MAX_RUNS,
) -> tuple[int, int]:  # fmt: skip
    """Warmup and timed run counts that fill the time budgets, as do_bench derives them."""
    if not estimate_ms > 0 or not math.isfinite(estimate_ms):
        raise ValueError(f"run time estimate must be positive and finite, got {estimate_ms}")
    if not 2 <= min_runs <= max_runs:
        raise ValueError(f"need 2 <= min_runs <= max_runs, got {min_runs} and {max_runs}")
    warmup = max(1, int(warmup_ms / estimate_ms))
    repeat = min(max_runs, max(min_runs, int(rep_ms / estimate_ms)))
    return warmup, repeat


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile by linear interpolation (NumPy's and torch.quantile's default)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def summarize(samples_ms: Sequence[float]) -> TimingResult:
    """Median, p99, min and coefficient of variation (sample stdev / mean) of run times."""
    if len(samples_ms) < 2:
        raise ValueError(f"need at least 2 timed runs, got {len(samples_ms)}")
    if any(not math.isfinite(s) or s < 0 for s in samples_ms):
        raise ValueError("run times must be finite and non-negative")
    ordered = sorted(samples_ms)
    mean = statistics.fmean(ordered)
    cv = statistics.stdev(ordered) / mean if mean > 0 else 0.0
    return TimingResult(
        median_ms=statistics.median(ordered),
        p99_ms=percentile(ordered, 99.0),
        min_ms=ordered[0],
        cv=cv,
        runs=len(ordered),
    )


def device_wide_samples(
    stream_ms: Sequence[float], span_ms: Sequence[float], tail_ms: float, noise_ms: float = 0.0,
) -> list[float]:  # fmt: skip
    """Per run: the stream's time, or the time until the device was idle if that is longer.

    ``span_ms`` runs from the start event to the ``done`` event recorded after a
    device-wide synchronize; ``tail_ms`` is what that typically adds when nothing
    is hidden, and ``noise_ms`` how much more it adds now and then (the host's
    wake-up jitter). Only a span longer than the stream's time by more than that
    noise counts as hidden work: jitter must not pass for work, or it would add
    its own spread to an honest kernel's samples.
    """
    if len(stream_ms) != len(span_ms):
        raise ValueError("one span per stream time is needed")
    if noise_ms < 0:
        raise ValueError(f"noise cannot be negative: {noise_ms}")
    return [d - tail_ms if d - tail_ms > s + noise_ms else s
            for s, d in zip(stream_ms, span_ms, strict=True)]  # fmt: skip


def flush_bytes(l2_bytes: int) -> int:
    """Size of the L2 flush buffer: twice the L2, and never less than do_bench's 256 MiB."""
    return max(2 * max(l2_bytes, 0), _MIN_FLUSH_BYTES)


def gate_ns(host_launch_ms: float) -> int:
    """How long the gate holds the stream: longer than ``launch()`` takes on the host."""
    wanted = 1.5 * host_launch_ms * 1e6 + 10_000
    return int(min(max(wanted, _GATE_MIN_NS), _GATE_MAX_NS))


def memory_lower_bound_ms(bytes_moved: int, peak_bandwidth_bytes_per_s: float) -> float:
    """The least time that moving ``bytes_moved`` through DRAM can take, in milliseconds."""
    if bytes_moved < 0:
        raise ValueError(f"bytes moved cannot be negative: {bytes_moved}")
    if not peak_bandwidth_bytes_per_s > 0 or not math.isfinite(peak_bandwidth_bytes_per_s):
        raise ValueError(f"peak bandwidth must be positive, got {peak_bandwidth_bytes_per_s}")
    return bytes_moved / peak_bandwidth_bytes_per_s * 1e3


def peak_bandwidth_from_clock(memory_clock_khz: int, bus_width_bits: int) -> float:
    """Theoretical DRAM bandwidth in bytes/s: two transfers per memory clock over the bus."""
    if memory_clock_khz <= 0 or bus_width_bits <= 0:
        raise ValueError(f"memory clock {memory_clock_khz} kHz and bus {bus_width_bits} bits")
    return 2.0 * memory_clock_khz * 1e3 * bus_width_bits / 8


def traffic_bytes(kernel: KernelSpec, launch: Launch, *, l2_bytes: int) -> int:
    """Bytes a launch must move through DRAM, counted so that the bound stays a lower bound.

    Every ``in``/``inout`` element is read once; the flush after ``refresh`` put
    them out of L2. Writes (``out``/``inout``) count only beyond the L2's size,
    because a write-back cache can hold that much when the end event is taken.
    """
    reads = writes = 0
    for buffer in kernel.buffers:
        size = math.prod(launch.shapes[buffer.name]) * _ITEMSIZE[buffer.dtype]
        if buffer.intent in (Intent.IN, Intent.INOUT):
            reads += size
        if buffer.intent in (Intent.OUT, Intent.INOUT):
            writes += size
    return reads + max(0, writes - max(l2_bytes, 0))


def timing_outcome(
    kernel: TimingResult, baseline: TimingResult | None, *, lower_bound_ms: float | None,
    bytes_moved: int | None = None, output_error: str | None = None,
) -> tuple[CheckResult, TimingReport]:  # fmt: skip
    """The ``timing`` check and the certificate's timing record for one measured kernel."""
    speedup = baseline.median_ms / kernel.median_ms if baseline and kernel.median_ms > 0 else None
    report = TimingReport(METHOD, kernel, baseline, speedup, lower_bound_ms)
    details: dict[str, Any] = {"kernel": kernel.to_json(), "lower_bound_ms": lower_bound_ms,
                               "bytes_moved": bytes_moved, "speedup": speedup}  # fmt: skip
    if baseline is not None:
        details["baseline"] = baseline.to_json()
    if output_error is not None:
        message = f"the output of the last timed run is wrong: {output_error}"
        return CheckResult("timing", Status.FAIL, message, details=details), report
    if lower_bound_ms is not None and kernel.median_ms < lower_bound_ms:
        message = (
            f"physically impossible: median {kernel.median_ms:.4g} ms is below the memory-traffic "
            f"lower bound {lower_bound_ms:.4g} ms ({bytes_moved} bytes at the device's peak "
            "bandwidth); the timed work cannot be the kernel's real work"
        )
        return CheckResult("timing", Status.FAIL, message, details=details), report
    parts = [f"median {kernel.median_ms:.4g} ms (cv {kernel.cv:.2%}, {kernel.runs} runs)"]
    if baseline is not None and speedup is not None:
        parts.append(f"baseline {baseline.median_ms:.4g} ms, speedup {speedup:.3g}x")
    else:
        parts.append("no baseline named")
    if lower_bound_ms is None:
        parts.append("no memory-traffic lower bound (peak bandwidth unknown)")
    else:
        parts.append(f"lower bound {lower_bound_ms:.4g} ms")
    return CheckResult("timing", Status.PASS, "; ".join(parts), details=details), report


def skipped_timing(reason: str) -> tuple[CheckResult, TimingReport]:
    """The ``timing`` check when nothing can be timed (the CPU interpreter): a skip, no figure."""
    check = CheckResult("timing", Status.SKIP, reason, required=False)
    return check, TimingReport("none", None, None, None, None, skipped_reason=reason)


# --------------------------------------------------------------------------- the GPU part


@dataclass(frozen=True, slots=True)
class Measurement:
    """A timing with what it was made of, for the benchmark and the tests."""

    result: TimingResult
    #: What each sample was: the larger of the stream's and the device-wide time.
    samples_ms: tuple[float, ...]
    #: Start to end event on the timing stream alone (what do_bench would see).
    stream_ms: tuple[float, ...]
    #: Median time the device stayed busy after the stream's end event, beyond the
    #: calibrated tail: work hidden on a non-blocking stream. About 0 when none is.
    hidden_ms: float
    #: The host's typical wake-up after the device-wide synchronize (median of empty
    #: runs), and how much longer it is now and then (95th percentile minus median).
    tail_ms: float
    tail_noise_ms: float
    warmup_runs: int
    flush_bytes: int
    gate_ns: int
    persisting_l2_resets: int


def measure(
    launch: Callable[[], None], *, refresh: Callable[[], None] | None = None,
    check: Callable[[], None] | None = None, warmup_ms: float = DEFAULT_WARMUP_MS,
    rep_ms: float = DEFAULT_REP_MS, min_runs: int = MIN_RUNS, max_runs: int = MAX_RUNS,
    synchronize: Callable[[], None] | None = None,
) -> TimingResult:  # fmt: skip
    """Time ``launch`` on the current CUDA device; see the module docstring."""
    return measure_detailed(
        launch, refresh=refresh, check=check, warmup_ms=warmup_ms, rep_ms=rep_ms,
        min_runs=min_runs, max_runs=max_runs, synchronize=synchronize,
    ).result  # fmt: skip


def time_callable(
    launch: Callable[[], None], *, synchronize: Callable[[], None] | None = None,
    budget_ms: float | None = None, refresh: Callable[[], None] | None = None,
    check: Callable[[], None] | None = None,
) -> TimingResult:  # fmt: skip
    """:func:`measure` with one time budget, a fifth of it for warmup (the worker's call)."""
    total = DEFAULT_WARMUP_MS + DEFAULT_REP_MS if budget_ms is None else budget_ms
    return measure(launch, refresh=refresh, check=check, warmup_ms=total / 5,
                   rep_ms=total * 4 / 5, synchronize=synchronize)  # fmt: skip


def measure_detailed(
    launch: Callable[[], None], *, refresh: Callable[[], None] | None = None,
    check: Callable[[], None] | None = None, warmup_ms: float = DEFAULT_WARMUP_MS,
    rep_ms: float = DEFAULT_REP_MS, min_runs: int = MIN_RUNS, max_runs: int = MAX_RUNS,
    synchronize: Callable[[], None] | None = None,
) -> Measurement:  # fmt: skip
    """:func:`measure`, returning the samples and the calibration beside the result."""
    bench = _Bench(synchronize)
    # a collection pause between the gate and the launch would be timed (timeit does the same)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _measure(bench, launch, refresh, check, warmup_ms, rep_ms, min_runs, max_runs)
    finally:
        if collecting:
            gc.enable()


def _measure(
    bench: _Bench, launch: Callable[[], None], refresh: Callable[[], None] | None,
    check: Callable[[], None] | None, warmup_ms: float, rep_ms: float, min_runs: int,
    max_runs: int,
) -> Measurement:  # fmt: skip
    with bench.stream:
        launch()  # first call: compiles, loads modules, allocates
        bench.sync()
        host_ms: list[float] = []
        started = time.perf_counter()
        for _ in range(_ESTIMATE_RUNS):
            host_ms.append(bench.run(launch, refresh, None))
        estimate_ms = (time.perf_counter() - started) * 1e3 / _ESTIMATE_RUNS
        bench.gate_ns = gate_ns(statistics.median(host_ms))
        tails = sorted(bench.calibrate(_CALIBRATION_RUNS))
        tail_ms = percentile(tails, 50.0)
        noise_ms = percentile(tails, 95.0) - tail_ms
        n_warmup, n_repeat = run_counts(estimate_ms, warmup_ms=warmup_ms, rep_ms=rep_ms,
                                        min_runs=min_runs, max_runs=max_runs)  # fmt: skip
        for _ in range(n_warmup):
            bench.run(launch, refresh, None)
        marks = [bench.events() for _ in range(n_repeat)]
        for mark in marks:
            bench.run(launch, refresh, mark)
        bench.sync()
        if check is not None:
            try:
                check()
            except Exception as exc:  # whatever the check raises means: wrong output
                raise TimedOutputError(f"{type(exc).__name__}: {exc}") from exc
        stream = [bench.elapsed(m[0], m[1]) for m in marks]
        span = [bench.elapsed(m[0], m[2]) for m in marks]
    samples = device_wide_samples(stream, span, tail_ms, noise_ms)
    hidden = statistics.median(max(0.0, d - tail_ms - s) for s, d in zip(stream, span, strict=True))
    return Measurement(
        result=summarize(samples), samples_ms=tuple(samples), stream_ms=tuple(stream),
        hidden_ms=hidden, tail_ms=tail_ms, tail_noise_ms=noise_ms, warmup_runs=n_warmup,
        flush_bytes=bench.flush_size,
        gate_ns=bench.gate_ns, persisting_l2_resets=bench.resets,
    )  # fmt: skip


_Marks = tuple[Any, Any, Any]


class _Bench:
    """The device state of one measurement: flush buffer, gate kernel, events, stream."""

    def __init__(self, synchronize: Callable[[], None] | None) -> None:
        try:
            # lazy: CuPy needs the CUDA stack; only a GPU path imports it
            import cupy
        except ImportError as exc:
            raise TimingError(f"timing needs CuPy: {exc}") from exc
        self.cupy = cupy
        runtime = cupy.cuda.runtime
        try:
            device = runtime.getDevice()
            l2 = int(runtime.deviceGetAttribute(runtime.cudaDevAttrL2CacheSize, device))
        except runtime.CUDARuntimeError as exc:
            raise TimingError(f"timing needs a CUDA device: {exc}") from exc
        self.sync: Callable[[], None] = synchronize or runtime.deviceSynchronize
        # the legacy default stream: its events wait for every blocking stream
        self.stream = cupy.cuda.Stream.null
        self.flush_size = flush_bytes(l2)
        self.flush_buffer = cupy.empty(self.flush_size, dtype=cupy.uint8)
        self.gate = cupy.RawKernel(_GATE_SOURCE, "kcert_gate")
        self.gate_ns = _GATE_MIN_NS
        # compile (NVRTC) and load the gate now, not inside the run-time estimate
        self.gate((1,), (1,), (cupy.uint64(0),))
        self.sync()
        self.resets = 0
        self._persisting_supported = True
        self._reset_l2_lines = _driver_function("cuCtxResetPersistingL2Cache")

    def events(self) -> _Marks:
        event = self.cupy.cuda.Event
        return event(), event(), event()

    def elapsed(self, start: Any, end: Any) -> float:
        return float(self.cupy.cuda.get_elapsed_time(start, end))

    def prepare(self, refresh: Callable[[], None] | None) -> None:
        """Everything before the timed region: limits, fresh inputs, L2 flush, idle device."""
        self._reset_persisting_l2()
        if refresh is not None:
            refresh()
        # after refresh, so that the fresh inputs are not left in L2 either
        self.cupy.cuda.runtime.memsetAsync(
            self.flush_buffer.data.ptr, 0, self.flush_size, self.stream.ptr
        )
        self.sync()
        self.gate((1,), (1,), (self.cupy.uint64(self.gate_ns),))

    def run(self, launch: Callable[[], None], refresh: Callable[[], None] | None,
            marks: _Marks | None) -> float:  # fmt: skip
        """One run; returns how long ``launch()`` took on the host, in ms."""
        start, end, done = marks if marks is not None else self.events()
        self.prepare(refresh)
        start.record(self.stream)
        before = time.perf_counter()
        launch()
        host_ms = (time.perf_counter() - before) * 1e3
        end.record(self.stream)
        self.sync()
        done.record(self.stream)
        return host_ms

    def calibrate(self, runs: int) -> list[float]:
        """``done - end`` of empty runs: what the synchronize adds when nothing is hidden."""
        marks = [self.events() for _ in range(runs)]
        for start, end, done in marks:
            self.prepare(None)
            start.record(self.stream)
            end.record(self.stream)
            self.sync()
            done.record(self.stream)
        self.sync()
        return [self.elapsed(end, done) for _, end, done in marks]

    def _reset_persisting_l2(self) -> None:
        """Undo any persisting-L2 set-aside a launch made, so no run keeps data in L2."""
        runtime = self.cupy.cuda.runtime
        if self._persisting_supported:
            try:
                if runtime.deviceGetLimit(_LIMIT_PERSISTING_L2) != 0:
                    runtime.deviceSetLimit(_LIMIT_PERSISTING_L2, 0)
                    self.resets += 1
            except runtime.CUDARuntimeError:
                self._persisting_supported = False  # before Ampere: no persisting L2 at all
        if self._reset_l2_lines is not None:
            self._reset_l2_lines()


def _driver_function(name: str) -> Callable[[], int] | None:
    """A no-argument CUDA driver entry point, or None where the driver lacks it."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        function = getattr(driver, name)
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return function  # type: ignore[no-any-return]


def l2_cache_bytes(device: int = 0) -> int:
    """The device's L2 cache size in bytes."""
    runtime = _runtime()
    return int(runtime.deviceGetAttribute(runtime.cudaDevAttrL2CacheSize, device))


def device_peak_bandwidth(device: int = 0) -> float:
    """Theoretical DRAM bandwidth of a CUDA device in bytes/s (attributes, then NVML)."""
    runtime = _runtime()
    try:
        clock = int(runtime.deviceGetAttribute(runtime.cudaDevAttrMemoryClockRate, device))
        bus = int(runtime.deviceGetAttribute(runtime.cudaDevAttrGlobalMemoryBusWidth, device))
        if clock > 0 and bus > 0:
            return peak_bandwidth_from_clock(clock, bus)
    except runtime.CUDARuntimeError:
        pass  # CUDA 13 may no longer report the memory clock: ask NVML
    try:
        # lazy: NVML is there only where an NVIDIA driver is
        import pynvml
    except ImportError as exc:
        raise TimingError(f"cannot tell the device's peak memory bandwidth: {exc}") from exc
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(runtime.deviceGetPCIBusId(device))
            clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            bus = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        finally:
            pynvml.nvmlShutdown()
        return peak_bandwidth_from_clock(int(clock_mhz) * 1000, int(bus))
    # NVML missing or a query unsupported on this device; a zero clock or bus (ValueError)
    except (OSError, ValueError, pynvml.NVMLError, runtime.CUDARuntimeError) as exc:
        raise TimingError(f"cannot tell the device's peak memory bandwidth: {exc}") from exc


def launch_lower_bound(
    kernel: KernelSpec, launch: Launch, *, device: int = 0
) -> tuple[float | None, int]:
    """The memory-traffic lower bound of one launch on ``device``, and the bytes it counts.

    The bound is None when the device's peak bandwidth cannot be told; the check
    then says so instead of judging against a guess.
    """
    moved = traffic_bytes(kernel, launch, l2_bytes=l2_cache_bytes(device))
    try:
        peak = device_peak_bandwidth(device)
    except TimingError:
        return None, moved
    return memory_lower_bound_ms(moved, peak), moved


def _runtime() -> Any:
    try:
        # lazy: CuPy needs the CUDA stack; only a GPU path imports it
        import cupy
    except ImportError as exc:
        raise TimingError(f"timing needs CuPy: {exc}") from exc
    return cupy.cuda.runtime

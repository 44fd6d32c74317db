"""The timing routine's pure parts, and its loop driven against a simulated GPU, on the CPU."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kcert.certify import timing
from kcert.certify.report import Status, TimingResult
from kcert.certify.spec import load_spec

# --------------------------------------------------------------------------- counts and statistics


def test_counts_fill_the_budgets() -> None:
    assert timing.run_counts(0.2, warmup_ms=25, rep_ms=100) == (125, 500)


def test_counts_respect_the_floor_for_slow_kernels() -> None:
    assert timing.run_counts(50.0, warmup_ms=25, rep_ms=100, min_runs=10) == (1, 10)


def test_counts_respect_the_ceiling_for_fast_kernels() -> None:
    warmup, repeat = timing.run_counts(0.001, warmup_ms=25, rep_ms=100, max_runs=700)
    assert (warmup, repeat) == (25000, 700)


@pytest.mark.parametrize("estimate", [0.0, -1.0, math.nan, math.inf])
def test_counts_reject_meaningless_estimates(estimate: float) -> None:
    with pytest.raises(ValueError, match="estimate"):
        timing.run_counts(estimate, warmup_ms=25, rep_ms=100)


def test_counts_reject_too_few_runs() -> None:
    with pytest.raises(ValueError, match="min_runs"):
        timing.run_counts(1.0, warmup_ms=25, rep_ms=100, min_runs=1)


def test_percentile_interpolates_linearly() -> None:
    values = [float(v) for v in range(1, 101)]
    assert timing.percentile(values, 99.0) == pytest.approx(99.01)
    assert timing.percentile([1.0, 2.0, 3.0, 4.0], 50.0) == pytest.approx(2.5)
    assert timing.percentile([7.0], 99.0) == 7.0


def test_summary_against_hand_computed_figures() -> None:
    # mean 4; squared deviations 9, 4, 1, 0, 36 -> sample variance 50 / 4 = 12.5
    result = timing.summarize([10.0, 2.0, 4.0, 1.0, 3.0])
    assert result.median_ms == 3.0
    assert result.min_ms == 1.0
    assert result.runs == 5
    assert result.cv == pytest.approx(math.sqrt(12.5) / 4.0)
    # position 0.99 * 4 = 3.96 between 4 and 10
    assert result.p99_ms == pytest.approx(4.0 + 0.96 * 6.0)


def test_summary_of_an_even_count_takes_the_middle_pair() -> None:
    result = timing.summarize([1.0, 1.0, 2.0, 4.0])
    assert result.median_ms == 1.5
    assert result.cv == pytest.approx(math.sqrt(2.0) / 2.0)  # mean 2, variance 6 / 3


@pytest.mark.parametrize("samples", [[], [1.0], [1.0, math.nan], [1.0, -0.5]])
def test_summary_refuses_what_it_cannot_summarize(samples: list[float]) -> None:
    with pytest.raises(ValueError):
        timing.summarize(samples)


def test_device_wide_samples_take_the_longer_of_stream_and_device() -> None:
    samples = timing.device_wide_samples([1.0, 1.0, 0.1], [1.01, 3.0, 0.1], 0.02)
    assert samples == pytest.approx([1.0, 2.98, 0.1])


def test_host_jitter_within_the_tail_noise_is_not_taken_for_hidden_work() -> None:
    # a wake-up 0.01 ms slower than typical, with 0.02 ms of known noise: still the stream's time
    samples = timing.device_wide_samples([1.0, 1.0], [1.03, 1.5], 0.02, noise_ms=0.02)
    assert samples == pytest.approx([1.0, 1.48])
    with pytest.raises(ValueError):
        timing.device_wide_samples([1.0], [1.0], 0.0, noise_ms=-1.0)


def test_the_collector_is_off_while_measuring_and_back_on_after(sim: _SimGpu) -> None:
    import gc

    seen: list[bool] = []

    def launch() -> None:
        seen.append(gc.isenabled())
        sim.enqueue(0.5, "kernel")

    assert gc.isenabled()
    _measure(launch)
    assert gc.isenabled() and not any(seen)


def test_flush_is_twice_the_l2_and_never_below_256_mib() -> None:
    assert timing.flush_bytes(50 << 20) == 256 << 20
    assert timing.flush_bytes(200 << 20) == 400 << 20


def test_gate_outlasts_the_host_launch_within_limits() -> None:
    assert timing.gate_ns(0.01) == 25_000
    assert timing.gate_ns(0.0) == 20_000
    assert timing.gate_ns(100.0) == 2_000_000


# --------------------------------------------------------------------------- lower bound


def test_lower_bound_arithmetic() -> None:
    assert timing.memory_lower_bound_ms(3_350_000_000, 3.35e12) == pytest.approx(1.0)
    assert timing.memory_lower_bound_ms(0, 1e12) == 0.0
    with pytest.raises(ValueError):
        timing.memory_lower_bound_ms(-1, 1e12)
    with pytest.raises(ValueError):
        timing.memory_lower_bound_ms(1, 0.0)


def test_peak_bandwidth_of_an_h100_sxm() -> None:
    # 2619 MHz HBM3 on a 5120-bit bus: the 3.35 TB/s of the data sheet
    assert timing.peak_bandwidth_from_clock(2_619_000, 5120) == pytest.approx(3.35232e12)
    with pytest.raises(ValueError):
        timing.peak_bandwidth_from_clock(0, 5120)


def _spec(tmp_path: Path) -> Any:
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k() {}\n')
    (tmp_path / "reference.py").write_text("def k(**kw):\n    return kw['y']\n")
    (tmp_path / "kcert.toml").write_text(
        '[[kernel]]\nname = "k"\nsource = "k.cu"\nentry = "k"\n'
        'reference = "reference.py:k"\ngrid = ["cdiv(n, 256)"]\nblock = [256]\n'
        "dims = { n = [1000] }\n[kernel.args]\n"
        'x = "in f32[n]"\ny = "out f32[n]"\nz = "inout f16[n]"\nn = "i32 = n"\n'
    )
    return load_spec(tmp_path / "kcert.toml").kernel("k")


def test_traffic_counts_reads_and_writes_beyond_l2(tmp_path: Path) -> None:
    kernel = _spec(tmp_path)
    launch = kernel.bind({"n": 1000})
    # reads: x 4000 + z 2000; writes: y 4000 + z 2000
    assert timing.traffic_bytes(kernel, launch, l2_bytes=0) == 12000
    assert timing.traffic_bytes(kernel, launch, l2_bytes=5000) == 6000 + 1000
    assert timing.traffic_bytes(kernel, launch, l2_bytes=1 << 20) == 6000


# --------------------------------------------------------------------------- the timing check


def _result(median: float) -> TimingResult:
    return TimingResult(median_ms=median, p99_ms=median * 1.1, min_ms=median * 0.9, cv=0.01,
                        runs=100)  # fmt: skip


def test_faster_than_the_lower_bound_fails_as_impossible() -> None:
    check, report = timing.timing_outcome(_result(0.5), _result(2.0), lower_bound_ms=1.0,
                                          bytes_moved=3_350_000_000)  # fmt: skip
    assert check.name == "timing"
    assert check.status is Status.FAIL
    assert "physically impossible" in check.message
    assert report.lower_bound_ms == 1.0
    assert report.speedup == pytest.approx(4.0)


def test_a_plausible_kernel_passes_with_its_speedup() -> None:
    check, report = timing.timing_outcome(_result(2.0), _result(3.0), lower_bound_ms=1.0)
    assert check.status is Status.PASS
    assert report.speedup == pytest.approx(1.5)
    assert report.method == timing.METHOD
    data = report.to_json()
    assert data["kernel"]["median_ms"] == 2.0
    assert data["baseline"]["median_ms"] == 3.0


def test_slower_than_the_baseline_is_recorded_not_failed() -> None:
    check, report = timing.timing_outcome(_result(4.0), _result(2.0), lower_bound_ms=None)
    assert check.status is Status.PASS
    assert report.speedup == pytest.approx(0.5)
    assert "lower bound" in check.message


def test_a_wrong_output_in_the_timed_runs_fails_timing() -> None:
    check, _ = timing.timing_outcome(_result(2.0), None, lower_bound_ms=0.1,
                                     output_error="max abs error 3.0")  # fmt: skip
    assert check.status is Status.FAIL
    assert "last timed run" in check.message


def test_the_cpu_path_skips_without_a_figure() -> None:
    check, report = timing.skipped_timing("the Triton interpreter runs on the CPU")
    assert check.status is Status.SKIP
    assert not check.required
    assert report.kernel is None and report.baseline is None and report.speedup is None
    assert report.to_json()["skipped_reason"] == "the Triton interpreter runs on the CPU"


def test_the_worker_call_splits_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_measure(launch: Any, **kwargs: Any) -> TimingResult:
        seen.update(kwargs)
        return _result(1.0)

    monkeypatch.setattr(timing, "measure", fake_measure)
    timing.time_callable(lambda: None, budget_ms=1000.0)
    assert seen["warmup_ms"] == pytest.approx(200.0)
    assert seen["rep_ms"] == pytest.approx(800.0)


# --------------------------------------------------------------------------- a simulated GPU


class _SimGpu:
    """A GPU timeline in milliseconds: one timing stream, side streams, host latencies."""

    SYNC_LATENCY = 0.004
    RECORD_LATENCY = 0.002
    LAUNCH_COST = 0.003

    def __init__(self) -> None:
        self.host = 0.0
        self.stream_free = 0.0
        self.blocking_free = 0.0  # work on blocking side streams (legacy stream waits for it)
        self.nonblocking_free = 0.0
        self.persisting_limit = 0
        self.calls: list[str] = []

    def enqueue(self, duration: float, what: str) -> None:
        self.host += self.LAUNCH_COST
        start = max(self.host, self.stream_free, self.blocking_free)
        self.stream_free = start + duration
        self.calls.append(what)

    def side(self, duration: float, *, blocking: bool) -> None:
        self.host += self.LAUNCH_COST
        if blocking:  # blocking streams wait for earlier legacy-stream work
            self.blocking_free = max(self.host, self.stream_free, self.blocking_free) + duration
        else:
            self.nonblocking_free = max(self.host, self.nonblocking_free) + duration
        self.calls.append("side")

    def record(self) -> float:
        self.host += self.LAUNCH_COST
        stamp = max(self.host + self.RECORD_LATENCY, self.stream_free, self.blocking_free)
        self.stream_free = stamp
        self.calls.append("record")
        return stamp

    def synchronize(self) -> None:
        idle = max(self.host, self.stream_free, self.blocking_free, self.nonblocking_free)
        self.host = idle + self.SYNC_LATENCY
        self.calls.append("sync")


def _fake_cupy(gpu: _SimGpu) -> types.ModuleType:
    class CUDARuntimeError(RuntimeError):
        pass

    class Event:
        stamp: float | None = None

        def record(self, stream: Any = None) -> None:
            self.stamp = gpu.record()

    class Stream:
        ptr = 0

        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    class Buffer:
        def __init__(self, size: int) -> None:
            self.data = types.SimpleNamespace(ptr=1234)
            self.size = size

    def limit_get(limit: int) -> int:
        assert limit == 0x06
        return gpu.persisting_limit

    def limit_set(limit: int, value: int) -> None:
        assert limit == 0x06
        gpu.persisting_limit = value

    def memset(ptr: int, value: int, size: int, stream: int) -> None:
        gpu.enqueue(size / 3e9, "flush")  # 3 TB/s in bytes per ms

    def gate(source: str, name: str) -> Any:
        return lambda grid, block, args: gpu.enqueue(int(args[0]) / 1e6, "gate")

    def elapsed(start: Event, end: Event) -> float:
        assert start.stamp is not None and end.stamp is not None
        return end.stamp - start.stamp

    runtime = types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError, cudaDevAttrL2CacheSize=1, getDevice=lambda: 0,
        deviceGetAttribute=lambda attr, dev: 50 << 20, deviceSynchronize=gpu.synchronize,
        memsetAsync=memset, deviceGetLimit=limit_get, deviceSetLimit=limit_set,
    )  # fmt: skip
    cuda = types.SimpleNamespace(runtime=runtime, Stream=types.SimpleNamespace(null=Stream()),
                                 Event=Event, get_elapsed_time=elapsed)  # fmt: skip
    module = types.ModuleType("cupy")
    module.cuda = cuda  # type: ignore[attr-defined]
    module.uint8, module.uint64 = "uint8", int  # type: ignore[attr-defined]
    module.empty = lambda size, dtype: Buffer(size)  # type: ignore[attr-defined]
    module.RawKernel = gate  # type: ignore[attr-defined]
    return module


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> _SimGpu:
    gpu = _SimGpu()
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(gpu))
    monkeypatch.setattr(timing, "_driver_function", lambda name: None)
    return gpu


def _measure(launch: Any, **kwargs: Any) -> timing.Measurement:
    return timing.measure_detailed(launch, warmup_ms=1.0, rep_ms=5.0, max_runs=40, **kwargs)


def test_simulated_kernel_on_the_timing_stream_is_timed_exactly(sim: _SimGpu) -> None:
    measured = _measure(lambda: sim.enqueue(0.5, "kernel"))
    assert measured.result.median_ms == pytest.approx(0.5)
    assert measured.result.cv == pytest.approx(0.0, abs=1e-9)
    assert measured.hidden_ms == pytest.approx(0.0, abs=1e-9)
    assert measured.flush_bytes == 256 << 20


@pytest.mark.parametrize("blocking", [True, False])
def test_simulated_work_hidden_on_a_side_stream_is_counted(sim: _SimGpu, blocking: bool) -> None:
    def hide() -> None:
        sim.side(0.5, blocking=blocking)

    measured = _measure(hide)
    # a non-blocking stream may start during the gate, so a little of it can escape
    gate_ms = measured.gate_ns / 1e6
    assert 0.5 - gate_ms <= measured.result.median_ms <= 0.5 + 1e-9
    if not blocking:
        # what the timing stream alone shows: almost nothing; do_bench would report this
        assert max(measured.stream_ms) < 0.05
        assert measured.hidden_ms > 0.4


def test_refresh_runs_outside_the_timed_region_and_check_after_the_last_run(
    sim: _SimGpu,
) -> None:
    log: list[str] = []

    def launch() -> None:
        log.append("launch")
        sim.enqueue(0.2, "kernel")

    measured = _measure(launch, refresh=lambda: log.append("refresh"),
                        check=lambda: log.append("check"))  # fmt: skip
    assert log.count("check") == 1 and log[-1] == "check"
    # every launch after the first (which compiles) is preceded by its own refresh
    assert log[1:-1] == ["refresh", "launch"] * ((len(log) - 2) // 2)
    assert measured.result.runs >= timing.MIN_RUNS
    # the refresh is never timed: nothing sits between a start event and the kernel but the gate
    assert measured.result.median_ms == pytest.approx(0.2)


def test_a_failing_check_is_a_timed_output_error(sim: _SimGpu) -> None:
    def check() -> None:
        raise AssertionError("y[3] is 0.0, expected 6.0")

    with pytest.raises(timing.TimedOutputError, match=r"y\[3\]"):
        _measure(lambda: sim.enqueue(0.1, "kernel"), check=check)


def test_a_persisting_l2_set_aside_is_undone_before_each_run(sim: _SimGpu) -> None:
    def greedy() -> None:
        sim.persisting_limit = 30 << 20
        sim.enqueue(0.1, "kernel")

    measured = _measure(greedy)
    assert measured.persisting_l2_resets >= measured.result.runs


def test_the_flush_comes_after_refresh_and_before_the_start_event(sim: _SimGpu) -> None:
    _measure(lambda: sim.enqueue(0.1, "kernel"), refresh=lambda: sim.enqueue(0.01, "refresh"))
    calls = sim.calls
    last = len(calls) - 1 - calls[::-1].index("kernel")
    window = calls[:last]
    start = len(window) - 1 - window[::-1].index("refresh")
    assert calls[start:last + 1] == ["refresh", "flush", "sync", "gate", "record", "kernel"]


def test_without_a_gpu_measure_refuses_rather_than_inventing_a_figure() -> None:
    from kcert.certify.environment import gpu_status

    if gpu_status()[0]:
        pytest.skip("a GPU is present: this test is about machines without one")
    with pytest.raises(timing.TimingError):
        timing.measure(lambda: None)

"""The timing routine on a real GPU: hidden work is counted, fresh inputs are checked."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kcert.certify import timing

pytestmark = pytest.mark.gpu

SPIN_NS = 500_000  # 0.5 ms: long next to every latency the routine has to hide


def _assets() -> ModuleType:
    path = Path(__file__).parents[1] / "assets" / "timing" / "side_stream.py"
    spec = importlib.util.spec_from_file_location("kcert_timing_assets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _naive_ms(launch: Any, runs: int = 20) -> float:
    """Events on the current stream with no device-wide synchronize (what do_bench reads)."""
    import cupy

    launch()
    cupy.cuda.runtime.deviceSynchronize()
    times = []
    for _ in range(runs):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(float(cupy.cuda.get_elapsed_time(start, end)))
        cupy.cuda.runtime.deviceSynchronize()
    return sorted(times)[len(times) // 2]


def test_an_open_spin_is_timed_at_its_length() -> None:
    measured = timing.measure_detailed(_assets().open_spin(SPIN_NS), rep_ms=50)
    assert SPIN_NS / 1e6 <= measured.result.median_ms <= SPIN_NS / 1e6 * 1.05
    assert measured.result.cv < 0.02
    assert measured.hidden_ms < 0.01


@pytest.mark.parametrize("non_blocking", [False, True], ids=["blocking", "non-blocking"])
def test_work_hidden_on_a_side_stream_is_timed_at_its_true_cost(non_blocking: bool) -> None:
    assets = _assets()
    hidden = assets.hidden_spin(SPIN_NS, non_blocking=non_blocking)
    if non_blocking:
        # the test means something only if events on the stream alone miss the work
        assert _naive_ms(hidden) < 0.2 * SPIN_NS / 1e6
    honest = timing.measure(assets.open_spin(SPIN_NS), rep_ms=50)
    caught = timing.measure_detailed(hidden, rep_ms=50)
    # a non-blocking stream may start under the gate (tens of microseconds) before the
    # start event, so allow that much to escape, and nothing more
    slack_ms = caught.gate_ns / 1e6
    assert caught.result.median_ms >= honest.median_ms - slack_ms
    assert caught.result.median_ms <= honest.median_ms * 1.10


def _doubler() -> tuple[Any, Any, Any]:
    import cupy

    n = 1 << 24
    x = cupy.random.standard_normal(n, dtype=cupy.float32)
    y = cupy.empty_like(x)
    double = cupy.ElementwiseKernel("float32 x", "float32 y", "y = 2.0f * x", "kcert_double")
    return x, y, double


def test_fresh_inputs_and_the_output_check_pass_an_honest_kernel() -> None:
    import cupy

    x, y, double = _doubler()
    refreshes = 0

    def refresh() -> None:
        nonlocal refreshes
        refreshes += 1
        x[...] = cupy.random.standard_normal(x.size, dtype=cupy.float32)

    def check() -> None:
        assert bool(cupy.allclose(y, 2 * x)), "y != 2x after the last timed run"

    result = timing.measure(lambda: double(x, y), refresh=refresh, check=check, rep_ms=30)
    assert refreshes >= result.runs
    assert result.median_ms > 0


def test_a_kernel_that_replays_a_cached_result_fails_the_output_check() -> None:
    import cupy

    x, y, double = _doubler()
    calls = 0

    def lazy() -> None:  # computes once, then pretends: the output goes stale
        nonlocal calls
        calls += 1
        if calls == 1:
            double(x, y)

    def refresh() -> None:
        x[...] = cupy.random.standard_normal(x.size, dtype=cupy.float32)

    def check() -> None:
        assert bool(cupy.allclose(y, 2 * x)), "y != 2x after the last timed run"

    with pytest.raises(timing.TimedOutputError, match="y != 2x"):
        timing.measure(lazy, refresh=refresh, check=check, rep_ms=10)


def test_a_copy_is_never_faster_than_its_memory_lower_bound() -> None:
    import cupy

    n = 1 << 27  # 512 MiB of float32 each way
    src = cupy.random.standard_normal(n, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    l2 = timing.l2_cache_bytes()
    peak = timing.device_peak_bandwidth()
    assert 1e11 < peak < 2e13  # somewhere between an L4 and anything that exists
    bytes_moved = src.nbytes + max(0, dst.nbytes - l2)
    bound = timing.memory_lower_bound_ms(bytes_moved, peak)
    result = timing.measure(lambda: cupy.copyto(dst, src), rep_ms=50)
    check, report = timing.timing_outcome(result, None, lower_bound_ms=bound,
                                          bytes_moved=bytes_moved)  # fmt: skip
    assert result.median_ms >= bound
    assert check.status == "pass", check.message
    assert report.lower_bound_ms == bound


def test_the_environment_is_read_and_matches_its_own_hardware_class() -> None:
    from kcert.certify import environment

    env = environment.collect_environment("cuda")
    assert env.device is not None
    for name in environment.GPU_FIELDS:
        assert name in env.fields
    assert env.fields["compute_capability"].count(".") == 1
    assert env.fields["driver_version"], "neither NVML nor /proc told the driver version"
    if env.hw_class in environment.HW_CLASSES:
        assert environment.check_hw_class(env.hw_class, env.device) == env.hw_class
    with pytest.raises(environment.HardwareMismatch):
        environment.check_hw_class("cpu", env.device)


_EARLY_EXIT_SOURCE = r"""
__device__ unsigned int kcert_test_launches = 1000;

extern "C" __global__ void empty() {}

// what add_after_warmup_skips does once it skips: every thread reads one global flag
// and returns
extern "C" __global__ void flag_then_return(float* out) {
    if (*(volatile unsigned int*)&kcert_test_launches > 64) return;
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}
"""


def _early_exit_kernels() -> tuple[Any, Any, Any]:
    import cupy

    module = cupy.RawModule(code=_EARLY_EXIT_SOURCE)
    out = cupy.empty(1 << 23, dtype=cupy.float32)
    return module.get_function("empty"), module.get_function("flag_then_return"), out


def test_an_empty_launch_is_timed_at_its_launch_cost() -> None:
    """Nothing but the kernel lies between the events: no flush, no refresh, no host wait."""
    empty, _, _ = _early_exit_kernels()
    measured = timing.measure_detailed(lambda: empty((1,), (1,), ()), rep_ms=20)
    assert measured.result.median_ms < 0.010, measured


def test_a_launch_that_returns_at_once_costs_what_do_bench_says() -> None:
    """A grid of 32768 blocks that each read one flag and return is not free: both
    routines see the same cost, so a median far above an empty launch is the kernel's."""
    do_bench = pytest.importorskip("triton.testing").do_bench
    _, flagged, out = _early_exit_kernels()

    def launch() -> None:
        flagged((out.size // 256,), (256,), (out,))

    ours = timing.measure(launch, rep_ms=50)
    theirs = float(do_bench(launch, warmup=10, rep=50, return_mode="median"))
    print(f"flag-then-return over 32768 blocks: kcert {ours.median_ms:.4f} ms, "  # noqa: T201
          f"do_bench {theirs:.4f} ms")
    assert abs(ours.median_ms / theirs - 1.0) < 0.15 or abs(ours.median_ms - theirs) < 0.004

"""Executors: argument packing and fault classification everywhere; launches on a GPU.

The CPU tests check what needs no device (dtypes, scalar packing, how an
exception becomes a status, what the parent accepts from a child). The ``gpu``
tests launch real CUDA C and Triton kernels through the sandbox.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kcert.certify.execution import PaddedBuffer, RunJob, RunOutcome, RunStatus
from kcert.certify.executors.base import (
    Fault,
    describe,
    effective_shift,
    host_dtype,
    scalar_kwargs,
)
from kcert.certify.executors.cuda_exec import _scalar
from kcert.certify.report import TimingResult
from kcert.certify.sandbox import NoDeviceError, Sandbox, _timing_result, gpu_visible
from kcert.certify.spec import DTYPES, KernelSpec, load_spec

ASSETS = Path(__file__).resolve().parents[1] / "assets"
GUARD = 1024


def kernel(folder: str, name: str) -> KernelSpec:
    return load_spec(ASSETS / folder / "kcert.toml").kernel(name)


def job(spec: KernelSpec, dims: dict[str, int], inputs: dict[str, np.ndarray] | None = None,
        *, shift: int = 0) -> RunJob:  # fmt: skip
    """Buffers of the spec's shapes with GUARD elements of poison each side."""
    launch = spec.bind(dims)
    buffers = []
    for buf in spec.buffers:
        shape = launch.shapes[buf.name]
        size = int(np.prod(shape))
        padded = np.full(size + 2 * GUARD, -777, dtype=host_dtype(buf.dtype))
        if inputs and buf.name in inputs:
            padded[GUARD : GUARD + size] = inputs[buf.name].reshape(-1)
        buffers.append(PaddedBuffer(buf.name, buf.dtype, shape, GUARD, padded))
    return RunJob(launch, tuple(buffers), address_shift=shift)


def data(outcome: RunOutcome, name: str, size: int) -> np.ndarray:
    return outcome.buffers[name][GUARD : GUARD + size]


# ---------------------------------------------------------------------------- no device needed


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_spec_dtype_has_a_host_dtype_of_its_width(dtype: str) -> None:
    width = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
             "u8": 1, "u16": 2, "u32": 4, "u64": 8, "bool": 1}[dtype]  # fmt: skip
    assert host_dtype(dtype).itemsize == width
    if dtype == "bf16":
        assert host_dtype(dtype) == np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize(
    ("dtype", "value", "packed"),
    [("f64", 0.1, np.float64(0.1)), ("f32", 0.1, np.float32(0.1)), ("f16", 0.1, np.float16(0.1)),
     ("i64", 3_000_000_000, np.int64(3_000_000_000)), ("i32", -7, np.int32(-7)),
     ("u8", 200, np.uint8(200)), ("i16", -300, np.int16(-300)), ("bool", 1, np.bool_(True))],
)  # fmt: skip
def test_cuda_scalars_are_packed_at_their_declared_width(dtype: str, value: float,
                                                         packed: np.generic) -> None:  # fmt: skip
    got = _scalar(dtype, value)
    assert type(got) is type(packed) and got == packed
    assert np.asarray(got).nbytes == host_dtype(dtype).itemsize


def test_a_bf16_scalar_travels_as_its_two_bytes() -> None:
    got = _scalar("bf16", 1.5)
    assert isinstance(got, np.uint16)
    assert np.array(got).view(ml_dtypes.bfloat16) == 1.5


def test_triton_scalars_and_consts_are_python_numbers_of_their_kind() -> None:
    spec = kernel("sandbox", "cuda_scalars")
    values = scalar_kwargs(spec, spec.bind({"n": 1}))
    assert values == {"a": 0.1, "b": 3_000_000_001, "c": 2.5, "d": -7, "e": 200, "f": -300}
    assert isinstance(values["a"], float) and isinstance(values["b"], int)


def test_exceptions_become_statuses() -> None:
    def chained() -> Fault:
        try:
            try:
                raise MemoryError("no room")
            except MemoryError as inner:
                raise RuntimeError("InterpreterError: MemoryError()") from inner
        except RuntimeError as exc:
            return describe(exc, "launching 'k'")

    oom = chained()
    assert oom.status is RunStatus.OOM and "MemoryError: no room" in oom.message
    error = describe(ValueError("bad block"), "launching 'k'")
    assert error.status is RunStatus.LAUNCH_ERROR and error.message.startswith("launching 'k'")
    assert describe(RuntimeError("CUDA error: out of memory"), "x").status is RunStatus.OOM
    assert len(describe(ValueError("x" * 10_000), "y").message) < 4100


def test_shifts_are_rounded_to_16_bytes() -> None:
    assert [effective_shift(s) for s in (0, 15, 16, 4352, -5)] == [0, 0, 16, 4352, 0]


def test_the_parent_accepts_only_well_formed_timing_results() -> None:
    good = {"median_ms": 1.0, "p99_ms": 2.0, "min_ms": 0.5, "cv": 0.1, "runs": 10}
    assert _timing_result(good) == TimingResult(1.0, 2.0, 0.5, 0.1, 10)
    bads: tuple[object, ...] = (
        None, [], {**good, "runs": 1.5}, {**good, "extra": 1}, {**good, "cv": "0.1"},
        {k: v for k, v in good.items() if k != "p99_ms"}, {**good, "runs": True},
    )  # fmt: skip
    for bad in bads:
        assert _timing_result(bad) is None


@pytest.mark.skipif(gpu_visible()[0], reason="checks the message on a machine without a GPU")
def test_a_cuda_kernel_without_a_gpu_is_refused_before_building() -> None:
    with pytest.raises(NoDeviceError) as caught:
        Sandbox(kernel("cuda", "vector_add"), "cuda")
    assert "kcert lint" in caught.value.diagnostics()


# ---------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_cuda_scalars_arrive_with_their_values() -> None:
    spec = kernel("sandbox", "cuda_scalars")
    with Sandbox(spec, "cuda") as sandbox:
        outcome = sandbox.run(job(spec, {"n": 1}))
    assert outcome.ok, outcome.message
    np.testing.assert_array_equal(data(outcome, "out", 6),
                                  [0.1, 3_000_000_001, np.float32(2.5), -7, 200, -300])  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [0, 4352])
def test_cuda_copy_lands_in_the_data_region_with_guards_intact(shift: int) -> None:
    spec = kernel("sandbox", "cuda_big_shared")  # 64 KiB of dynamic shared memory
    x = np.arange(5000, dtype=np.float32)
    with Sandbox(spec, "cuda") as sandbox:
        outcome = sandbox.run(job(spec, {"n": 5000}, {"x": x}, shift=shift))
    assert outcome.ok, outcome.message
    np.testing.assert_array_equal(data(outcome, "out", 5000), x)
    out = outcome.buffers["out"]
    assert (out[:GUARD] == -777).all() and (out[GUARD + 5000 :] == -777).all()


@pytest.mark.gpu
def test_cuda_overrun_lands_in_the_guard_band() -> None:
    spec = kernel("cuda", "add_unmasked_tail")
    with Sandbox(spec, "cuda") as sandbox:
        outcome = sandbox.run(job(spec, {"n": 1000}, {"x": np.ones(1000, np.float32),
                                                      "y": np.ones(1000, np.float32)}))  # fmt: skip
    assert outcome.ok, outcome.message
    out = outcome.buffers["out"]
    assert (out[GUARD : GUARD + 1000] == 2).all()
    assert (out[GUARD + 1000 : GUARD + 1024] == 0).all()  # the rest of the last block of 256
    assert (out[GUARD + 1024 :] == -777).all()


@pytest.mark.gpu
def test_a_sticky_cuda_error_restarts_the_worker_and_spares_other_sandboxes() -> None:
    spec = kernel("sandbox", "cuda_illegal_address")
    with Sandbox(spec, "cuda") as sandbox:
        first = sandbox.run(job(spec, {"n": 100}))
        second = sandbox.run(job(spec, {"n": 100}))
        assert sandbox.starts == 2
    assert first.status is RunStatus.LAUNCH_ERROR and "sticky" in first.message
    assert second.status is RunStatus.LAUNCH_ERROR
    good = kernel("sandbox", "cuda_copy")
    x = np.arange(100, dtype=np.float32)
    with Sandbox(good, "cuda") as sandbox:
        outcome = sandbox.run(job(good, {"n": 100}, {"x": x}))
    assert outcome.ok and (data(outcome, "out", 100) == x).all()


@pytest.mark.gpu
def test_cuda_hang_is_killed_at_the_deadline() -> None:
    spec = kernel("cuda", "add_spin")
    with Sandbox(spec, "cuda", deadline_s=3) as sandbox:
        outcome = sandbox.run(job(spec, {"n": 100}))
        assert sandbox.pid is None
    assert outcome.status is RunStatus.TIMEOUT


@pytest.mark.gpu
@pytest.mark.parametrize(("folder", "executor"), [("cuda", "cuda"), ("triton", "triton")])
def test_kernel_and_baseline_are_timed_on_the_gpu(folder: str, executor: str) -> None:
    spec = kernel(folder, "vector_add")
    n = 1 << 20
    x, y = np.ones(n, np.float32), np.full(n, 2, np.float32)
    run = job(spec, {"n": n}, {"x": x, "y": y})
    seen: list[np.ndarray] = []
    with Sandbox(spec, executor) as sandbox:
        timed = sandbox.time(run, "kernel", budget_ms=50,
                             check=lambda bufs: seen.append(bufs["out"]))  # fmt: skip
        baseline = sandbox.time(run, "baseline", budget_ms=50)
    assert isinstance(timed, TimingResult) and isinstance(baseline, TimingResult)
    assert 0 < timed.median_ms <= timed.p99_ms and timed.runs >= 10
    assert (seen[0][GUARD : GUARD + n] == 3).all()


@pytest.mark.gpu
def test_triton_on_the_gpu_writes_the_data_region() -> None:
    spec = kernel("triton", "vector_add")
    x = np.arange(1000, dtype=np.float32)
    with Sandbox(spec, "triton") as sandbox:
        outcome = sandbox.run(job(spec, {"n": 1000}, {"x": x, "y": x}, shift=4352))
    assert outcome.ok, outcome.message
    np.testing.assert_array_equal(data(outcome, "out", 1000), 2 * x)
    assert (outcome.buffers["out"][:GUARD] == -777).all()

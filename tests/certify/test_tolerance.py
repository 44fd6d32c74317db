"""The default tolerance model: no false alarms on correct float32 kernels, yet it
catches a float16 accumulator and a constant off by 1e-3."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kcert.certify.spec import KernelSpec, parse_spec
from kcert.certify.tolerance import accumulation_length, allowances

Arrays = Mapping[str, np.ndarray[Any, Any]]


def make_kernel(tmp_path: Path, args: dict[str, str], dims: dict[str, list[int]],
                **extra: Any) -> KernelSpec:
    (tmp_path / "k.py").write_text("def k():\n    pass\n")
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    table = {"name": "k", "source": "k.py", "entry": "k", "reference": "ref.py:ref",
             "grid": ["1"], "dims": dims, "args": args, **extra}
    return parse_spec({"kernel": [table]}, tmp_path / "kcert.toml").kernels[0]


def violations(kernel: KernelSpec, reference: Any, inputs: Arrays, got: Arrays,
               dims: Mapping[str, int]) -> int:
    expected = reference(inputs)
    bounds = allowances(kernel, reference, inputs, expected, dims)
    bad = 0
    for name, value in got.items():
        error = np.abs(value.astype(np.float64) - expected[name])
        bad += int(np.sum(~(error <= bounds[name].allowed)))
    return bad


def large_mixed(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Values spanning 1e-3 to 4e3 with random signs, as the probes draw them."""
    magnitude = np.exp2(rng.uniform(-10, 12, size=shape))
    values: np.ndarray[Any, Any] = magnitude * rng.choice([-1.0, 1.0], size=shape)
    return values.astype(np.float32)


def sequential_matmul(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any],
                      acc: type) -> np.ndarray[Any, Any]:
    out = np.zeros((a.shape[0], b.shape[1]), dtype=acc)
    for k in range(a.shape[1]):
        out = (out + (a[:, k : k + 1].astype(acc) * b[k : k + 1, :].astype(acc))).astype(acc)
    return out


def matmul_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    a = np.asarray(inputs["a"], dtype=np.float64)
    b = np.asarray(inputs["b"], dtype=np.float64)
    return {"c": a @ b}


@pytest.fixture(scope="module")
def matmul_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[KernelSpec, Arrays]:
    kernel = make_kernel(tmp_path_factory.mktemp("mm"),
                         {"a": "in f32[m, k]", "b": "in f32[k, n]", "c": "out f32[m, n]"},
                         {"m": [16], "n": [16], "k": [4096]})
    rng = np.random.default_rng(7)
    return kernel, {"a": large_mixed(rng, (16, 4096)), "b": large_mixed(rng, (4096, 16))}


DIMS_MM = {"m": 16, "n": 16, "k": 4096}


def test_accumulation_length_is_the_reduced_dims(matmul_case: tuple[KernelSpec, Arrays]) -> None:
    kernel, _ = matmul_case
    assert accumulation_length(kernel, kernel.outputs[0], DIMS_MM) == 4096


def test_correct_float32_matmuls_pass(matmul_case: tuple[KernelSpec, Arrays]) -> None:
    kernel, inputs = matmul_case
    a, b = inputs["a"], inputs["b"]
    for got in (a @ b, sequential_matmul(a, b, np.float32),
                sequential_matmul(a[:, ::-1], b[::-1, :], np.float32)):
        assert violations(kernel, matmul_ref, inputs, {"c": got}, DIMS_MM) == 0


def test_float16_accumulation_fails(matmul_case: tuple[KernelSpec, Arrays]) -> None:
    kernel, inputs = matmul_case
    # unit-scale inputs so that f16 partial sums stay finite: only rounding differs
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 4096)).astype(np.float32)
    b = rng.standard_normal((4096, 16)).astype(np.float32)
    unit = {"a": a, "b": b}
    got = sequential_matmul(a, b, np.float16).astype(np.float32)
    assert violations(kernel, matmul_ref, unit, {"c": got}, DIMS_MM) > 16 * 16 // 2


def test_scale_off_by_1e_3_fails(matmul_case: tuple[KernelSpec, Arrays]) -> None:
    kernel, inputs = matmul_case
    got = (inputs["a"] @ inputs["b"]) * np.float32(1 + 1e-3)
    assert violations(kernel, matmul_ref, inputs, {"c": got}, DIMS_MM) > 16 * 16 // 2


def rowsum_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    return {"out": np.asarray(inputs["x"], dtype=np.float64).sum(axis=1)}


@pytest.fixture(scope="module")
def rowsum_kernel(tmp_path_factory: pytest.TempPathFactory) -> KernelSpec:
    return make_kernel(tmp_path_factory.mktemp("rs"), {"x": "in f32[m, n]", "out": "out f32[m]"},
                       {"m": [8], "n": [100_000]})


@pytest.mark.parametrize("family", ["large", "positive", "normal"])
def test_correct_long_float32_reductions_pass(rowsum_kernel: KernelSpec, family: str) -> None:
    rng = np.random.default_rng(11)
    shape = (8, 100_000)
    x = {"large": large_mixed(rng, shape),
         # positive terms: the biased case, where errors grow with |ref| rather than cancel
         "positive": (np.abs(rng.standard_normal(shape)) * 1000).astype(np.float32),
         "normal": rng.standard_normal(shape).astype(np.float32)}[family]
    sequential = np.cumsum(x, axis=1, dtype=np.float32)[:, -1]
    pairwise = x.sum(axis=1, dtype=np.float32)
    for got in (sequential, pairwise):
        assert violations(rowsum_kernel, rowsum_ref, {"x": x}, {"out": got},
                          {"m": 8, "n": 100_000}) == 0


def test_float16_accumulated_reduction_fails(rowsum_kernel: KernelSpec) -> None:
    x = np.random.default_rng(5).standard_normal((8, 100_000)).astype(np.float32)
    got = np.cumsum(x.astype(np.float16), axis=1, dtype=np.float16)[:, -1].astype(np.float32)
    assert violations(rowsum_kernel, rowsum_ref, {"x": x}, {"out": got},
                      {"m": 8, "n": 100_000}) >= 6


def test_offset_of_1e_3_fails_on_unit_data(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[n]", "y": "out f32[n]"}, {"n": [1000]})
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)

    def ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        return {"y": np.tanh(np.asarray(inputs["x"], dtype=np.float64))}

    exact = np.tanh(x)
    assert violations(kernel, ref, {"x": x}, {"y": exact}, {"n": 1000}) == 0
    assert violations(kernel, ref, {"x": x}, {"y": exact + np.float32(1e-3)}, {"n": 1000}) == 1000


def test_softmax_on_large_inputs_is_bounded_by_conditioning(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[m, n]", "y": "out f32[m, n]"},
                         {"m": [4], "n": [4097]})
    x = large_mixed(np.random.default_rng(2), (4, 4097)) / np.float32(4)

    def softmax(v: np.ndarray[Any, Any], dtype: type) -> np.ndarray[Any, Any]:
        v = v.astype(dtype)
        e = np.exp(v - v.max(axis=1, keepdims=True))
        result: np.ndarray[Any, Any] = e / e.sum(axis=1, keepdims=True)
        return result

    def ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        return {"y": softmax(np.asarray(inputs["x"]), np.float64)}

    correct = softmax(x, np.float32)
    assert violations(kernel, ref, {"x": x}, {"y": correct}, {"m": 4, "n": 4097}) == 0
    wrong = correct * np.float32(1 + 1e-3)
    assert violations(kernel, ref, {"x": x}, {"y": wrong}, {"m": 4, "n": 4097}) > 0


def test_spec_tolerance_overrides_the_model(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[n]", "y": "out f32[n]"}, {"n": [10]},
                         tolerance={"f32": {"atol": 0.5, "rtol": 0.0}})
    x = np.ones(10, dtype=np.float32)

    def ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        return {"y": np.asarray(inputs["x"], dtype=np.float64)}

    assert violations(kernel, ref, {"x": x}, {"y": x + np.float32(0.4)}, {"n": 10}) == 0
    assert violations(kernel, ref, {"x": x}, {"y": x + np.float32(0.6)}, {"n": 10}) == 10


def test_integer_outputs_are_exact(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in i32[n]", "y": "out i32[n]"}, {"n": [10]})
    x = np.arange(10, dtype=np.int32)

    def ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        return {"y": np.asarray(inputs["x"]) * 2}

    assert violations(kernel, ref, {"x": x}, {"y": x * 2}, {"n": 10}) == 0
    assert violations(kernel, ref, {"x": x}, {"y": x * 2 + 1}, {"n": 10}) == 10


def test_long_reduction_scaled_by_1e_3_fails(rowsum_kernel: KernelSpec) -> None:
    x = np.random.default_rng(9).standard_normal((8, 100_000)).astype(np.float32)
    got = x.sum(axis=1, dtype=np.float32) * np.float32(1 + 1e-3)
    assert violations(rowsum_kernel, rowsum_ref, {"x": x}, {"out": got},
                      {"m": 8, "n": 100_000}) >= 6

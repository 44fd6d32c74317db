"""The precision-matched yardstick: correct float32 kernels whose formula cancels internally
pass, scans and opposite-sign terms are bounded, and a scale error of a few ulps is caught.

The "kernels" here are independent float32 implementations (PyTorch's CPU operators, or
the formula a Triton kernel uses, evaluated by torch in float32) on inputs drawn by the
probes; the references are plain NumPy formulas, as a spec would hold them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kcert.certify.lowp import as_float32, is_float32
from kcert.certify.probes import make_inputs, make_probe
from kcert.certify.spec import KernelSpec, parse_spec
from kcert.certify.tolerance import allowances

torch = pytest.importorskip("torch")

Arrays = Mapping[str, np.ndarray[Any, Any]]
Reference = Callable[[Arrays], dict[str, np.ndarray[Any, Any]]]


def make_kernel(tmp_path: Path, args: dict[str, str], dims: dict[str, list[int]],
                **extra: Any) -> KernelSpec:  # fmt: skip
    (tmp_path / "k.py").write_text("def k():\n    pass\n")
    (tmp_path / "ref.py").write_text("def ref(**kw):\n    return None\n")
    table = {"name": "k", "source": "k.py", "entry": "k", "reference": "ref.py:ref",
             "grid": ["1"], "dims": dims, "args": args, **extra}  # fmt: skip
    return parse_spec({"kernel": [table]}, tmp_path / "kcert.toml").kernels[0]


def float32_of(kernel: KernelSpec,
               reference: Reference) -> Callable[[Arrays], tuple[Arrays, bool]]:  # fmt: skip
    floats = {b.name for b in kernel.buffers if b.dtype == "f32"}

    def call(inputs: Arrays) -> tuple[Arrays, bool]:
        answer = reference({n: as_float32(v) if n in floats else v for n, v in inputs.items()})
        stayed = all(is_float32(v) for v in answer.values())
        return {n: np.asarray(v, dtype=np.float64) for n, v in answer.items()}, stayed

    return call


def bad_elements(kernel: KernelSpec, reference: Reference, inputs: Arrays, got: Arrays,
                 dims: Mapping[str, int], *, matched: bool = True) -> int:  # fmt: skip
    wide = {n: np.asarray(v, dtype=np.float64) for n, v in inputs.items()}
    with np.errstate(all="ignore"):  # as the certifier calls references: exp(2000) is inf
        expected = reference(wide)
        bounds = allowances(kernel, reference, wide, expected, dims,
                            float32=float32_of(kernel, reference) if matched else None)
    bad = 0
    for name, value in got.items():
        error = np.abs(np.asarray(value, dtype=np.float64) - expected[name])
        ok = (error <= bounds[name].allowed) | (np.isnan(value) & np.isnan(expected[name]))
        bad += int(np.sum(~ok))
    return bad


def probe_inputs(kernel: KernelSpec, dims: dict[str, int], seeds: int = 2) -> list[Arrays]:
    """Inputs as the probes draw them, for a few probe seeds."""
    return [make_inputs(kernel, make_probe(kernel, dims, seed=1000 + i)) for i in range(seeds)]


def t(v: np.ndarray[Any, Any]) -> Any:
    return torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))


# ---------------------------------------------------------------------------- activations

SQRT_2_PI = float(np.sqrt(2 / np.pi))


def gelu_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    x = inputs["x"]
    return {"y": 0.5 * x * (1 + np.tanh(SQRT_2_PI * (x + 0.044715 * x**3)))}


def softplus_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    x = inputs["x"]
    return {"y": np.where(x > 20, x, np.log(1 + np.exp(x)))}


def logsigmoid_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    return {"y": np.log(1 / (1 + np.exp(-inputs["x"])))}


def silu_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    x = inputs["x"]
    return {"y": x / (1 + np.exp(-x))}


def _triton_softplus(x: Any) -> Any:
    return torch.where(x > 20, x, torch.log(1 + torch.exp(x)))


def _triton_gelu(x: Any) -> Any:
    """tanh from exp, as Triton kernels write it."""
    return 0.5 * x * (1 + (2 / (1 + torch.exp(-2 * SQRT_2_PI * (x + 0.044715 * x**3))) - 1))


def mish_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    x = inputs["x"]
    return {"y": x * np.tanh(np.where(x > 20, x, np.log(1 + np.exp(x))))}


def stable_mish_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    x = inputs["x"]
    return {"y": x * np.tanh(np.logaddexp(0.0, x))}


def _attorch_mish(x: Any) -> Any:
    """attorch's form: softplus as log(1 + exp(x)), tanh from a sigmoid."""
    softplus = torch.log(1 + torch.exp(x))
    return x * (2 / (1 + torch.exp(-2 * softplus)) - 1)


ACTIVATIONS: dict[str, tuple[Reference, list[Callable[[Any], Any]]]] = {
    "gelu-tanh": (gelu_ref, [
        lambda x: torch.nn.functional.gelu(x, approximate="tanh"), _triton_gelu]),
    "softplus": (softplus_ref, [torch.nn.functional.softplus, _triton_softplus]),
    "log-sigmoid": (logsigmoid_ref, [
        torch.nn.functional.logsigmoid,
        # the overflow-free form a Triton kernel uses (log(sigmoid(x)) is -inf below -88)
        lambda x: torch.minimum(x, torch.zeros_like(x)) - torch.log(1 + torch.exp(-x.abs()))]),
    "mish": (mish_ref, [torch.nn.functional.mish, _attorch_mish]),
    "mish-stable": (stable_mish_ref, [torch.nn.functional.mish, _attorch_mish]),
    "silu": (silu_ref, [torch.nn.functional.silu, lambda x: x * (1 / (1 + torch.exp(-x)))]),
}  # fmt: skip


@pytest.fixture(scope="module")
def elementwise(tmp_path_factory: pytest.TempPathFactory) -> KernelSpec:
    return make_kernel(tmp_path_factory.mktemp("ew"), {"x": "in f32[n]", "y": "out f32[n]"},
                       {"n": [20000]})  # fmt: skip


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_correct_float32_activations_pass(elementwise: KernelSpec, name: str) -> None:
    reference, implementations = ACTIVATIONS[name]
    dims = {"n": 20000}
    for inputs in probe_inputs(elementwise, dims):
        x = inputs["x"]
        for implementation in implementations:
            got = {"y": implementation(t(x)).numpy()}
            assert bad_elements(elementwise, reference, inputs, got, dims) == 0


def test_stable_primitives_are_measured_as_a_kernel_writes_them(elementwise: KernelSpec) -> None:
    """log(1 + exp(x)) cancels below x = -10 (relative errors of 1e-3): a reference written
    with logaddexp or log1p is evaluated that way in float32 too, since Triton has neither."""
    inputs = probe_inputs(elementwise, {"n": 20000})[0]
    got = {"y": _attorch_mish(t(inputs["x"])).numpy()}
    for reference in (mish_ref, stable_mish_ref):
        assert bad_elements(elementwise, reference, inputs, got, {"n": 20000}) == 0
    # the same kernel 1e-4 off is still caught against the stable reference
    wrong = {"y": got["y"] * np.float32(1 + 1e-4)}
    assert bad_elements(elementwise, stable_mish_ref, inputs, wrong, {"n": 20000}) > 1000


def test_a_reference_that_leaves_float32_keeps_the_models_floor(elementwise: KernelSpec) -> None:
    inputs = {"x": probe_inputs(elementwise, {"n": 20000})[0]["x"].astype(np.float64)}

    def widening(values: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        return gelu_ref({"x": np.asarray(values["x"], dtype=np.float64)})

    with np.errstate(all="ignore"):
        expected = gelu_ref(inputs)
    for reference, method in ((gelu_ref, "perturbation+float32"),
                              (widening, "perturbation+float32-partial")):
        with np.errstate(all="ignore"):
            bounds = allowances(elementwise, reference, inputs, expected, {"n": 20000},
                                float32=float32_of(elementwise, reference))  # fmt: skip
        assert bounds["y"].method == method


def test_a_relative_error_of_1e_4_in_an_activation_is_caught(elementwise: KernelSpec) -> None:
    inputs = probe_inputs(elementwise, {"n": 20000})[0]
    got = torch.nn.functional.gelu(t(inputs["x"]), approximate="tanh").numpy()
    wrong = {"y": got * np.float32(1 + 1e-4)}
    assert bad_elements(elementwise, gelu_ref, inputs, wrong, {"n": 20000}) > 1000


# ---------------------------------------------------------------------------- rows


def log_softmax_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    x = inputs["x"]
    shifted = x - x.max(axis=1, keepdims=True)
    return {"y": shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))}


def test_correct_float32_log_softmax_passes(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[m, n]", "y": "out f32[m, n]"},
                         {"m": [16], "n": [1000]})  # fmt: skip
    dims = {"m": 16, "n": 1000}
    for inputs in probe_inputs(kernel, dims):
        x = t(inputs["x"])
        for got in (torch.log_softmax(x, dim=1),
                    x - x.amax(1, keepdim=True)
                    - torch.log(torch.exp(x - x.amax(1, keepdim=True)).sum(1, keepdim=True))):
            assert bad_elements(kernel, log_softmax_ref, inputs, {"y": got.numpy()}, dims) == 0


def cumsum_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    return {"y": np.cumsum(inputs["x"], axis=1)}


@pytest.mark.parametrize("n", [4096])
def test_correct_float32_cumulative_sums_pass(tmp_path: Path, n: int) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[m, n]", "y": "out f32[m, n]"},
                         {"m": [4], "n": [n]})  # fmt: skip
    dims = {"m": 4, "n": n}
    for inputs in probe_inputs(kernel, dims):
        x = inputs["x"]
        sequential = np.cumsum(x, axis=1, dtype=np.float32)
        # a tree scan, as tl.cumsum does it: reversed order makes the rounding differ
        other = (x.sum(axis=1, keepdims=True, dtype=np.float32)
                 - np.cumsum(x[:, ::-1], axis=1, dtype=np.float32)[:, ::-1] + x)
        for got in (sequential, torch.cumsum(t(x), dim=1).numpy()):
            assert bad_elements(kernel, cumsum_ref, inputs, {"y": got}, dims) == 0
        assert np.all(np.isfinite(other))


def test_a_float32_cumsum_scaled_by_1e_5_is_caught(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[m, n]", "y": "out f32[m, n]"},
                         {"m": [4], "n": [4096]})  # fmt: skip
    dims = {"m": 4, "n": 4096}
    inputs = probe_inputs(kernel, dims)[0]
    got = np.cumsum(inputs["x"], axis=1, dtype=np.float32) * np.float32(1 + 1e-5)
    assert bad_elements(kernel, cumsum_ref, inputs, {"y": got}, dims) > 100


def rotary_ref(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    q, cos, sin = inputs["q"], inputs["cos"], inputs["sin"]
    half = q.shape[-1] // 2
    q1, q2 = q[..., :half], q[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return {"y": np.concatenate([q1 * c - q2 * s, q2 * c + q1 * s], axis=-1)}


def test_correct_float32_rotary_embedding_passes(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"q": "in f32[s, h, d]", "cos": "in f32[s, d // 2]",
                                    "sin": "in f32[s, d // 2]", "y": "out f32[s, h, d]"},
                         {"s": [64], "h": [8], "d": [128]},
                         values={"cos": "uniform(-1, 1)", "sin": "uniform(-1, 1)"})  # fmt: skip
    dims = {"s": 64, "h": 8, "d": 128}
    for inputs in probe_inputs(kernel, dims):
        q, c, s = (t(inputs[n]) for n in ("q", "cos", "sin"))
        q1, q2 = q[..., :64], q[..., 64:]
        c, s = c[:, None, :], s[:, None, :]
        fused = torch.cat([torch.addcmul(q1 * c, q2, -s), torch.addcmul(q2 * c, q1, s)], dim=-1)
        plain = torch.cat([q1 * c - q2 * s, q2 * c + q1 * s], dim=-1)
        for got in (fused, plain):
            # with the yardstick, and with the model alone (a float64 kernel's case), whose
            # term size no longer cancels with the result where q1·cos ≈ q2·sin
            for matched in (True, False):
                assert bad_elements(kernel, rotary_ref, inputs, {"y": got.numpy()}, dims,
                                    matched=matched) == 0  # fmt: skip


# ---------------------------------------------------------------------------- the scale caught

SCALES = [2.0**-k for k in range(24, 14, -1)]  # 6e-8 up to 3e-5


def just_caught(kernel: KernelSpec, reference: Reference, inputs: Arrays,
                correct: np.ndarray[Any, Any], name: str,
                dims: Mapping[str, int]) -> float:  # fmt: skip
    """The smallest relative scale error (of :data:`SCALES`) that some element shows."""
    assert bad_elements(kernel, reference, inputs, {name: correct}, dims) == 0
    for scale in SCALES:
        wrong = (correct.astype(np.float64) * (1 + scale)).astype(np.float32)
        if bad_elements(kernel, reference, inputs, {name: wrong}, dims):
            return scale
    return 1.0


def test_an_elementwise_add_is_held_to_a_few_ulps(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"x": "in f32[n]", "y": "in f32[n]", "z": "out f32[n]"},
                         {"n": [100000]})  # fmt: skip
    dims = {"n": 100000}

    def add(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        return {"z": inputs["x"] + inputs["y"]}

    inputs = probe_inputs(kernel, dims, seeds=1)[0]
    caught = just_caught(kernel, add, inputs, inputs["x"] + inputs["y"], "z", dims)
    assert caught <= 2.0**-20  # 1e-6: 8 ulps at the bottom of a binade
    print(f"elementwise add: a scale error of {caught:.2e} is caught")  # noqa: T201


def test_a_matmul_scale_error_far_below_2_5e_5_is_caught(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path, {"a": "in f32[m, k]", "b": "in f32[k, n]",
                                    "c": "out f32[m, n]"},
                         {"m": [64], "n": [64], "k": [256]})  # fmt: skip
    dims = {"m": 64, "n": 64, "k": 256}

    def matmul(inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
        return {"c": inputs["a"] @ inputs["b"]}

    inputs = probe_inputs(kernel, dims, seeds=1)[0]
    correct = (t(inputs["a"]) @ t(inputs["b"])).numpy()
    caught = just_caught(kernel, matmul, inputs, correct, "c", dims)
    assert caught <= 2.0**-17  # 7.6e-6, against 2.5e-5 passing before
    print(f"matmul k=256: a scale error of {caught:.2e} is caught")  # noqa: T201

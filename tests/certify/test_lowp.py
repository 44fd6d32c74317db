"""The reference's float32 evaluation: every operation computes and rounds in float32."""

from __future__ import annotations

import math

import numpy as np

from kcert.certify.lowp import as_float32, is_float32


def test_a_float64_reference_is_evaluated_in_float32() -> None:
    x = as_float32(np.array([1.0, 2.0**-30, 3.0]))
    wide = x.astype(np.float64)  # the reference's own widening keeps the subclass
    result = np.float64(1.0) + wide  # a strong float64 constant is taken down too
    assert is_float32(result) and result.dtype == np.float32
    assert result[1] == 1.0  # 1 + 2**-30 rounds to 1 in float32, not in float64
    total = np.concatenate([result, wide]).sum()
    assert isinstance(total, np.float32 | np.ndarray)


def test_array_functions_and_matmul_stay_in_float32() -> None:
    a = as_float32(np.full((2, 3), 1.0 / 3.0))
    for value in (a @ a.T, np.where(a > 0, a, -np.inf), np.stack([a, a]), np.cumsum(a, axis=1),
                  np.zeros_like(a, dtype=np.float64)):  # fmt: skip
        assert is_float32(value) and value.dtype == np.float32


def test_leaving_for_a_plain_float64_array_is_told() -> None:
    x = as_float32(np.array([0.5, 1.5]))
    assert not is_float32(np.asarray(x, dtype=np.float64) * 2)
    filled = np.zeros(2)
    filled[:] = x * 2
    assert not is_float32(filled + 1)


def test_stable_primitives_are_written_out_as_a_kernel_must() -> None:
    x = as_float32(np.array([1e-9, -20.0]))
    assert np.log1p(x)[0] == 0.0  # log(1 + 1e-9) in float32
    assert np.logaddexp(np.float32(0), x)[1] == 0.0  # log(1 + exp(-20)) in float32
    assert np.expm1(x)[0] == 0.0
    erf = np.vectorize(math.erf, otypes=[np.float64])
    value = 1.0 + erf(as_float32(np.array([-4.0])))
    assert is_float32(value) and value.dtype == np.float32

"""NumPy references and torch baselines for the Triton examples in kcert.toml.

References get every kernel argument by name (buffers as NumPy arrays,
scalars and consts as numbers) and return the expected output array; they
compute in float64 and round once. Baselines get the same arguments as torch
tensors (on the GPU, or on the CPU under the interpreter).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]


def saxpy(*, x_ptr: F32, y_ptr: F32, a: float, n: int, BLOCK: int) -> F32:
    return (np.float64(a) * x_ptr.astype(np.float64) + y_ptr).astype(np.float32)


def saxpy_torch(*, x_ptr: Any, y_ptr: Any, a: float, n: int, BLOCK: int) -> Any:
    return a * x_ptr + y_ptr


def row_sum(*, x_ptr: F32, out_ptr: F32, m: int, n: int, BLOCK: int) -> F32:
    return x_ptr.astype(np.float64).sum(axis=1).astype(np.float32)


def row_sum_torch(*, x_ptr: Any, out_ptr: Any, m: int, n: int, BLOCK: int) -> Any:
    return x_ptr.sum(dim=1)


def softmax(*, x_ptr: F32, out_ptr: F32, m: int, n: int, BLOCK: int) -> F32:
    wide = x_ptr.astype(np.float64)
    e = np.exp(wide - wide.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def softmax_torch(*, x_ptr: Any, out_ptr: Any, m: int, n: int, BLOCK: int) -> Any:
    import torch

    return torch.softmax(x_ptr, dim=1)


def matmul(
    *, a_ptr: F32, b_ptr: F32, c_ptr: F32, m: int, n: int, k: int,
    BLOCK_M: int, BLOCK_N: int, BLOCK_K: int,
) -> F32:  # fmt: skip
    return (a_ptr.astype(np.float64) @ b_ptr.astype(np.float64)).astype(np.float32)


def matmul_torch(
    *, a_ptr: Any, b_ptr: Any, c_ptr: Any, m: int, n: int, k: int,
    BLOCK_M: int, BLOCK_N: int, BLOCK_K: int,
) -> Any:  # fmt: skip
    return a_ptr @ b_ptr


def layernorm(
    *, x_ptr: F32, gamma_ptr: F32, beta_ptr: F32, out_ptr: F32, eps: float, m: int, n: int,
    BLOCK: int,
) -> F32:  # fmt: skip
    wide = x_ptr.astype(np.float64)
    mean = wide.mean(axis=1, keepdims=True)
    var = ((wide - mean) ** 2).mean(axis=1, keepdims=True)
    return ((wide - mean) / np.sqrt(var + eps) * gamma_ptr + beta_ptr).astype(np.float32)


def layernorm_torch(
    *, x_ptr: Any, gamma_ptr: Any, beta_ptr: Any, out_ptr: Any, eps: float, m: int, n: int,
    BLOCK: int,
) -> Any:  # fmt: skip
    import torch

    return torch.nn.functional.layer_norm(x_ptr, (n,), gamma_ptr, beta_ptr, eps)


def row_max(*, x_ptr: F32, out_ptr: F32, m: int, n: int, ROWS: int, BLOCK: int) -> F32:
    return np.asarray(x_ptr.max(axis=1), dtype=np.float32)


def row_max_torch(*, x_ptr: Any, out_ptr: Any, m: int, n: int, ROWS: int, BLOCK: int) -> Any:
    return x_ptr.amax(dim=1)

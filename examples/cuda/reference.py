"""NumPy references and CuPy baselines for the CUDA C examples in kcert.toml.

A reference is called with every kernel argument by name (buffers as NumPy
arrays, scalars as numbers) and returns the expected outputs: one array when
the kernel has one output. References compute in float64 and round once, so
they are the accurate answer the kernels are held to. Baselines take CuPy
arrays; CuPy is imported inside them so this module imports without a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]


def saxpy(*, x: F32, y: F32, a: float, n: int) -> F32:
    return (np.float64(a) * x.astype(np.float64) + y).astype(np.float32)


def saxpy_gpu(*, x: Any, y: Any, a: float, n: int) -> Any:
    import cupy

    return cupy.float32(a) * x + y


def row_sum(*, x: F32, out: F32, m: int, n: int) -> F32:
    return x.astype(np.float64).sum(axis=1).astype(np.float32)


def row_sum_gpu(*, x: Any, out: Any, m: int, n: int) -> Any:
    import cupy

    return cupy.sum(x, axis=1)


def softmax(*, x: F32, out: F32, m: int, n: int) -> F32:
    wide = x.astype(np.float64)
    e = np.exp(wide - wide.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def softmax_gpu(*, x: Any, out: Any, m: int, n: int) -> Any:
    import cupy

    e = cupy.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def matmul(*, a: F32, b: F32, c: F32, m: int, n: int, k: int) -> F32:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def matmul_gpu(*, a: Any, b: Any, c: Any, m: int, n: int, k: int) -> Any:
    import cupy

    return cupy.matmul(a, b)


def layernorm(*, x: F32, gamma: F32, beta: F32, out: F32, eps: float, m: int, n: int) -> F32:
    wide = x.astype(np.float64)
    mean = wide.mean(axis=1, keepdims=True)
    var = ((wide - mean) ** 2).mean(axis=1, keepdims=True)
    return ((wide - mean) / np.sqrt(var + eps) * gamma + beta).astype(np.float32)


def layernorm_gpu(*, x: Any, gamma: Any, beta: Any, out: Any, eps: float, m: int, n: int) -> Any:
    import cupy

    mean = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return (x - mean) * cupy.reciprocal(cupy.sqrt(var + eps)) * gamma + beta


def row_max(*, x: F32, out: F32, m: int, n: int) -> F32:
    return np.asarray(x.max(axis=1), dtype=np.float32)


def row_max_gpu(*, x: Any, out: Any, m: int, n: int) -> Any:
    return x.max(axis=1)

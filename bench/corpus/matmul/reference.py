"""float64 reference for C = A @ B, then the activation the spec names."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def matmul(*, a_ptr: F64, b_ptr: F64, ACTIVATION: str, **_: object) -> F64:
    result: F64 = a_ptr @ b_ptr
    if ACTIVATION == "leaky_relu":
        result = np.where(result >= 0, result, 0.01 * result)
    return result

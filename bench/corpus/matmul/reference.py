"""float64 reference for C = A @ B."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def matmul(*, a_ptr: F64, b_ptr: F64, **_: object) -> F64:
    result: F64 = a_ptr @ b_ptr
    return result

"""float64 reference for mish: x * tanh(softplus(x)), softplus computed without overflow."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def mish(*, input_pointer: F64, **_: object) -> F64:
    x = input_pointer
    result: F64 = x * np.tanh(np.logaddexp(0.0, x))
    return result

"""float64 reference for swiglu: silu(e) rounded to float16 (as the model does), times g."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def swiglu(*, e: F64, g: F64, **_: object) -> F64:
    f = (e / (1.0 + np.exp(-e))).astype(np.float16).astype(np.float64)
    return f * g

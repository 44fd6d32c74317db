"""float64 reference for the exact GEGLU (erf GELU times the up projection)."""

from __future__ import annotations

from math import erf, sqrt

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
_erf = np.vectorize(erf, otypes=[np.float64])


def geglu(*, e: F64, g: F64, **_: object) -> F64:
    result: F64 = 0.5 * e * (1.0 + _erf(e / sqrt(2.0))) * g
    return result

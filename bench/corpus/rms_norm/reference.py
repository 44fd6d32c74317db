"""float64 reference for RMSNorm; the normalized row is rounded to bfloat16 as the model does."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def _to_bf16(x: F64) -> F64:
    """Round to nearest even bfloat16, back in float64."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def rms_norm(*, X: F64, W: F64, eps: float, **_: object) -> dict[str, F64]:
    inv = 1.0 / np.sqrt((X * X).mean(axis=1) + eps)
    normed = _to_bf16(X * inv[:, None])
    return {"Y": normed * W, "r": inv}

"""float64 reference for Mamba-2's chunked dt scan: dt_out and dA_cumsum, both [b, h, chunks, c]."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def chunk_cumsum(*, dt_ptr: F64, A_ptr: F64, dt_bias_ptr: F64, chunk_size: int,
                 dt_min: float, dt_max: float, **_: object) -> dict[str, F64]:  # fmt: skip
    b, length, h = dt_ptr.shape
    chunks = -(-length // chunk_size)
    dt = dt_ptr + dt_bias_ptr
    dt = np.where(dt <= 20.0, np.logaddexp(0.0, dt), dt)
    dt = np.minimum(np.maximum(dt, dt_min), dt_max)
    padded = np.zeros((b, chunks * chunk_size, h))
    padded[:, :length] = dt
    dt_out = padded.reshape(b, chunks, chunk_size, h).transpose(0, 3, 1, 2)
    da_cs = np.cumsum(dt_out * A_ptr[None, :, None, None], axis=-1)
    return {"dt_out_ptr": dt_out, "dA_cumsum_ptr": da_cs}

"""float64 reference for rotary embeddings on Q[batch * seqlen, heads * head_dim]."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def rope(*, Q: F64, cos: F64, sin: F64, seqlen: int, head_dim: int, n_heads: int,
         **_: object) -> F64:  # fmt: skip
    half = head_dim // 2
    q = Q.reshape(Q.shape[0], n_heads, head_dim)
    pos = np.arange(Q.shape[0]) % seqlen
    c = cos[pos, :half][:, None, :]
    s = sin[pos, :half][:, None, :]
    q1, q2 = q[..., :half], q[..., half:]
    out = np.concatenate([q1 * c - q2 * s, q2 * c + q1 * s], axis=-1)
    result: F64 = out.reshape(Q.shape)
    return result

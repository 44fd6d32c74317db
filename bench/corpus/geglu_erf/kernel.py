"""GEGLU forward with the exact (erf) GELU: h = 0.5 * e * (1 + erf(e / sqrt(2))) * g.

Ported from unslothai/unsloth, unsloth/kernels/geglu.py (``_exact_forward_kernel``),
commit 015bdef0d94a241bcd94eec7a405b1700632180d, Apache-2.0 licence.
The tanh form (``_approx_forward_kernel``) calls libdevice.tanh, which the
Triton interpreter does not implement; the erf form has the same far-tail
cancellation in ``1 + erf(...)``.
"""

import triton
import triton.language as tl


@triton.jit
def geglu_exact(e, g, h, n_elements, BLOCK_SIZE: tl.constexpr, LONG_INDEXING: tl.constexpr):
    block_idx = tl.program_id(0)
    if LONG_INDEXING:
        offsets = block_idx.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(tl.int64)
        n_elements = tl.cast(n_elements, tl.int64)
    else:
        offsets = block_idx * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements

    e_row = tl.load(e + offsets, mask=mask, other=0).to(tl.float32)
    g_row = tl.load(g + offsets, mask=mask, other=0)

    f_row = 0.5 * e_row * (tl.math.erf(tl.math.rsqrt(2.0) * e_row) + 1.0)
    f_row = f_row.to(g_row.dtype)
    h_row = f_row * g_row

    tl.store(h + offsets, h_row, mask=mask)

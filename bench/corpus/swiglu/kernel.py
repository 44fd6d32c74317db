"""SwiGLU forward, h = silu(e) * g, on float16 halves of an MLP.

Ported from unslothai/unsloth, unsloth/kernels/swiglu.py (``_fg_kernel``),
commit 015bdef0d94a241bcd94eec7a405b1700632180d, Apache-2.0 licence.
Kept: the flat tiling, the float32 silu, the rounding of silu(e) to g's dtype
before the product (as Hugging Face does). LONG_INDEXING stays a constexpr.
"""

import triton
import triton.language as tl


@triton.jit
def swiglu_fg(e, g, h, n_elements, BLOCK_SIZE: tl.constexpr, LONG_INDEXING: tl.constexpr):
    block_idx = tl.program_id(0)
    if LONG_INDEXING:
        offsets = block_idx.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(tl.int64)
        n_elements = tl.cast(n_elements, tl.int64)
    else:
        offsets = block_idx * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements

    e_row = tl.load(e + offsets, mask=mask, other=0).to(tl.float32)
    g_row = tl.load(g + offsets, mask=mask, other=0)

    # f = e * sigmoid(e), rounded to g's dtype before the product
    f_row = e_row * tl.sigmoid(e_row)
    f_row = f_row.to(g_row.dtype)
    h_row = f_row * g_row

    tl.store(h + offsets, h_row, mask=mask)

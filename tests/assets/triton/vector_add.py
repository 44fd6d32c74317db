"""Correct: out = x + y with a masked tail."""

import triton
import triton.language as tl


@triton.jit
def vector_add(x, y, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x + offsets, mask=mask)
    y = tl.load(y + offsets, mask=mask)
    tl.store(out + offsets, x + y, mask=mask)

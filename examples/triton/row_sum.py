"""out[r] <- sum of row r of x[m, n]; one program per row, walking the row in BLOCK chunks."""

import triton
import triton.language as tl


@triton.jit
def row_sum(x_ptr, out_ptr, m, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        acc += tl.load(x_ptr + row * n + start + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))

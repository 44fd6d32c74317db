"""out[r] <- max of row r of x[m, n], ROWS rows per program.

The Triton counterpart of the CUDA warp-shuffle kernel: ``tl.max`` along a
row of a [ROWS, BLOCK] tile is lowered to warp shuffles (``shfl.sync`` in the PTX).
"""

import triton
import triton.language as tl


@triton.jit
def row_max(x_ptr, out_ptr, m, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    best = tl.full((ROWS, BLOCK), float("-inf"), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = (rows[:, None] < m) & (start + cols[None, :] < n)
        x = tl.load(
            x_ptr + rows[:, None] * n + start + cols[None, :], mask=mask, other=float("-inf")
        )
        best = tl.maximum(best, x)
    tl.store(out_ptr + rows, tl.max(best, axis=1), mask=rows < m)

"""Row softmax of x[m, n], max-subtracted; one program per row, three passes of BLOCK chunks."""

import triton
import triton.language as tl


@triton.jit
def softmax(x_ptr, out_ptr, m, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    base = x_ptr + row * n
    row_max = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(base + start + cols, mask=mask, other=float("-inf"))
        row_max = tl.maximum(row_max, x)
    top = tl.max(row_max, axis=0)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(base + start + cols, mask=mask, other=float("-inf"))
        total += tl.where(mask, tl.exp(x - top), 0.0)
    inv = 1.0 / tl.sum(total, axis=0)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(base + start + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * n + start + cols, tl.exp(x - top) * inv, mask=mask)

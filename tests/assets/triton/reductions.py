"""Row reductions and softmax: correct kernels and their precision bugs."""

import triton
import triton.language as tl


@triton.jit
def row_sum(x, out, m, n, BLOCK: tl.constexpr):
    """Correct: out[r] = sum of row r, accumulated in float32."""
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x + row * n + cols, mask=cols < n, other=0.0)
    tl.store(out + row, tl.sum(acc, axis=0))


@triton.jit
def row_sum_f16_acc(x, out, m, n, BLOCK: tl.constexpr):
    """correctness: a float32 result accumulated in float16."""
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float16)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x + row * n + cols, mask=cols < n, other=0.0).to(tl.float16)
    tl.store(out + row, tl.sum(acc, axis=0).to(tl.float32))


@triton.jit
def softmax(x, out, m, n, BLOCK: tl.constexpr):
    """Correct: a row softmax that subtracts the row's max before exp."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    v = tl.load(x + row * n + cols, mask=mask, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(out + row * n + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def softmax_no_max(x, out, m, n, BLOCK: tl.constexpr):
    """special-values: exp(x) without subtracting the max overflows on large inputs (inf/inf)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    v = tl.load(x + row * n + cols, mask=mask, other=-float("inf"))
    e = tl.exp(v)
    tl.store(out + row * n + cols, e / tl.sum(e, axis=0), mask=mask)

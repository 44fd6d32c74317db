"""c[m, n] <- a[m, k] @ b[k, n] in BLOCK_M x BLOCK_N tiles, masked at every edge and the K tail.

The dot is asked for in IEEE fp32: on a GPU Triton would otherwise use TF32,
which is far outside an fp32 tolerance.
"""

import triton
import triton.language as tl


@triton.jit
def matmul(
    a_ptr,
    b_ptr,
    c_ptr,
    m,
    n,
    k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        ks = k0 + inner
        a = tl.load(
            a_ptr + rows[:, None] * k + ks[None, :],
            mask=(rows[:, None] < m) & (ks[None, :] < k),
            other=0.0,
        )
        b = tl.load(
            b_ptr + ks[:, None] * n + cols[None, :],
            mask=(ks[:, None] < k) & (cols[None, :] < n),
            other=0.0,
        )
        acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(
        c_ptr + rows[:, None] * n + cols[None, :],
        acc,
        mask=(rows[:, None] < m) & (cols[None, :] < n),
    )

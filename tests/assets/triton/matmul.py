"""Tiled matmul: correct, and one that drops the K tail."""

import triton
import triton.language as tl


@triton.jit
def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Correct: c = a @ b with every tile edge masked, K included."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        ta = tl.load(a + rows[:, None] * K + ks[None, :],
                     mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        tb = tl.load(b + ks[:, None] * N + cols[None, :],
                     mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(ta, tb, input_precision="ieee")
    tl.store(c + rows[:, None] * N + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def matmul_drops_k_tail(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr):
    """correctness: the K loop runs K // BK whole tiles and drops the K % BK tail."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for t in range(0, K // BK):
        ks = t * BK + tl.arange(0, BK)
        ta = tl.load(a + rows[:, None] * K + ks[None, :], mask=rows[:, None] < M, other=0.0)
        tb = tl.load(b + ks[:, None] * N + cols[None, :], mask=cols[None, :] < N, other=0.0)
        acc += tl.dot(ta, tb, input_precision="ieee")
    tl.store(c + rows[:, None] * N + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))

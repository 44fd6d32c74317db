"""Rotary position embedding applied in place to Q, a group of heads per program.

Ported from unslothai/unsloth, unsloth/kernels/rope_embedding.py (``_rope_embedding``),
commit 015bdef0d94a241bcd94eec7a405b1700632180d, Apache-2.0 licence. Kept:
grid (rows, head groups of ROPE_GROUP_SIZE = 4), rotate-half with the first
half of each cos/sin row, position = row % seqlen, BACKWARD_PASS as a
constexpr, the in-place update. float32 here (unsloth's Gemma path).
"""

import triton
import triton.language as tl


@triton.jit
def rope_embedding(
    Q, Q_row_stride: tl.constexpr,
    cos, cos_row_stride: tl.constexpr,
    sin, sin_row_stride: tl.constexpr,
    seqlen,
    head_dim: tl.constexpr,
    n_heads: tl.constexpr,
    BACKWARD_PASS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    ROPE_GROUP_SIZE = 4
    row_position = tl.program_id(0)
    group_head_position = tl.program_id(1)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    half_head_dim = head_dim // 2
    mask = col_offsets < half_head_dim

    sin1 = tl.load(sin + (row_position % seqlen) * sin_row_stride + half_head_dim * 0 + col_offsets,
                   mask=mask, other=0)
    cos1 = tl.load(cos + (row_position % seqlen) * cos_row_stride + half_head_dim * 0 + col_offsets,
                   mask=mask, other=0)

    if BACKWARD_PASS:
        sin1 = -sin1

    head_start = group_head_position * ROPE_GROUP_SIZE
    head_end = min((head_start + ROPE_GROUP_SIZE), n_heads)

    for k in range(head_start, head_end):
        offs_q1 = row_position * Q_row_stride + k * head_dim + col_offsets
        offs_q2 = row_position * Q_row_stride + k * head_dim + col_offsets + half_head_dim

        Q1 = tl.load(Q + offs_q1, mask=mask, other=0).to(sin1.dtype)
        Q2 = tl.load(Q + offs_q2, mask=mask, other=0).to(sin1.dtype)

        tl.store(Q + offs_q1, Q1 * cos1 - Q2 * sin1, mask=mask)
        tl.store(Q + offs_q2, Q2 * cos1 + Q1 * sin1, mask=mask)

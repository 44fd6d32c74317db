"""RMSNorm forward on bfloat16 rows: y = x / sqrt(mean(x^2) + eps) * w, and r = 1/rms per row.

Ported from unslothai/unsloth, unsloth/kernels/rms_layernorm.py
(``_rms_layernorm_forward``), commit 015bdef0d94a241bcd94eec7a405b1700632180d,
Apache-2.0 licence. Kept: one program per row, the strides and ``eps`` as
tl.constexpr (eps is a float constexpr), the float32 statistics and the
rounding of the normalized row to w's dtype before the product.
"""

import triton
import triton.language as tl


@triton.jit
def rms_layernorm_forward(
    Y, Y_row_stride: tl.constexpr,
    X, X_row_stride: tl.constexpr,
    W, W_row_stride: tl.constexpr,
    r, r_row_stride: tl.constexpr,
    n_cols: tl.constexpr,
    eps: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row_idx = tl.program_id(0)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    Y += row_idx * Y_row_stride
    X += row_idx * X_row_stride
    r += row_idx * r_row_stride

    X_row = tl.load(X + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W + col_offsets, mask=mask, other=0)

    row_var = tl.sum(X_row * X_row, axis=0) / n_cols
    eps_f32 = tl.full((), eps, tl.float32)
    inv_var = tl.math.rsqrt(row_var + eps_f32)
    tl.store(r, inv_var)
    normed = X_row * inv_var
    normed = normed.to(W_row.dtype)
    output = normed * W_row
    tl.store(Y + col_offsets, output, mask=mask)

"""Online-softmax cross entropy that also returns each row's argmax (the predicted token).

Ported from linkedin/Liger-Kernel, src/liger_kernel/ops/cross_entropy.py
(``liger_cross_entropy_kernel``), commit ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c,
BSD-2-Clause licence. Kept: the ignore_index early exit, the blockwise
online max/sum in base 2 (exp2 with LOG2_E), the first-index argmax per block
carried across blocks, and loss = lse - x[y], with RETURN_PREDICTED_TOKENS.
Left out: the branches for class weights, softcapping, label smoothing,
z-loss, reductions and gradients (HAS_WEIGHT, HAS_SOFTCAPPING,
label_smoothing = 0, RETURN_Z_LOSS, reduction = "none", HAS_GRADIENTS all off).
"""

import triton
import triton.language as tl

LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def cross_entropy_argmax(
    X_ptr,
    X_stride,
    Y_ptr,
    Y_stride,
    loss_ptr,
    loss_stride,
    predicted_tokens_ptr,
    predicted_tokens_stride,
    n_cols,
    ignore_index,
    RETURN_PREDICTED_TOKENS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    program_id = tl.program_id(0).to(tl.int64)

    Y_ptr += program_id * Y_stride
    y = tl.load(Y_ptr)

    X_ptr += program_id * X_stride

    if y == ignore_index:
        if RETURN_PREDICTED_TOKENS:
            predicted_tokens_ptr += program_id * predicted_tokens_stride
            tl.store(predicted_tokens_ptr, -1)
        return

    loss_ptr += program_id * loss_stride
    if RETURN_PREDICTED_TOKENS:
        predicted_tokens_ptr += program_id * predicted_tokens_stride

    m = float("-inf")
    d = 0.0
    argmax_idx = 0
    ori_X_y = tl.load(X_ptr + y).cast(tl.float32)

    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols,
                          other=float("-inf")).cast(tl.float32)
        block_max = tl.max(X_block)

        if RETURN_PREDICTED_TOKENS:
            is_max_mask = X_block == block_max
            masked_offsets = tl.where(is_max_mask, X_offsets, n_cols)
            current_block_argmax_idx = tl.min(masked_offsets)

            is_new_max = block_max > m
            argmax_idx = tl.where(is_new_max, current_block_argmax_idx, argmax_idx)

        m_new = tl.maximum(m, block_max)
        d = d * tl.exp2((m - m_new) * LOG2_E) + tl.sum(tl.exp2((X_block - m_new) * LOG2_E))
        m = m_new

    lse = m + tl.log(d)
    loss = lse - ori_X_y
    tl.store(loss_ptr, loss)
    if RETURN_PREDICTED_TOKENS:
        tl.store(predicted_tokens_ptr, argmax_idx)

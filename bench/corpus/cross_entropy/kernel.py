"""Cross-entropy forward: per-row logsumexp and loss = logsumexp - logits[label].

Ported from unslothai/unsloth, unsloth/kernels/cross_entropy_loss.py
(``_cross_entropy_forward``), commit 015bdef0d94a241bcd94eec7a405b1700632180d,
Apache-2.0 licence. Kept: one program per row holding the whole vocabulary
in one block, -inf padding, the max-shifted logsumexp, the -100 ignore label,
and the softcapping / logit-scaling constexpr flags (off here; softcapping
calls libdevice.tanh, which the Triton interpreter does not implement, so the
flag's branch is left out).
"""

import triton
import triton.language as tl


@triton.jit
def cross_entropy_forward(
    logits_ptr,
    logits_row_stride,
    loss_ptr,
    logsumexp_ptr,
    labels_ptr,
    VOCAB_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DO_LOGIT_SCALING: tl.constexpr,
    LOGIT_SCALE: tl.constexpr,
):
    row_idx = tl.program_id(0)
    logits_ptr += row_idx * tl.cast(logits_row_stride, tl.int64)
    loss_ptr += row_idx
    logsumexp_ptr += row_idx
    labels_ptr += row_idx

    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < VOCAB_SIZE

    label_idx = tl.load(labels_ptr).to(tl.int32)
    logits = tl.load(logits_ptr + col_offsets, mask=mask, other=-float("inf")).to(tl.float32)

    # logit scaling (Cohere): t * x
    if DO_LOGIT_SCALING:
        logits = LOGIT_SCALE * logits

    c = tl.max(logits, 0)
    logsumexp = c + tl.log(tl.sum(tl.exp(logits - c), 0))

    if label_idx != -100:
        x = tl.load(logits_ptr + label_idx).to(tl.float32)
        if DO_LOGIT_SCALING:
            x = LOGIT_SCALE * x
        loss = logsumexp - x
    else:
        loss = 0.0
    tl.store(logsumexp_ptr, logsumexp)
    tl.store(loss_ptr, loss)

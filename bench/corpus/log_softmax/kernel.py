"""Row (log-)softmax over 2-D tiles of BLOCK_SIZE_BATCH rows by the whole feature width.

Ported from BobMcDear/attorch, attorch/softmax_kernels.py (``softmax_forward_kernel``),
commit 67c2772baf33913ef51c2d1064f746ca17b63749, MIT licence. Kept: the
``neg`` (softmin) and ``log`` flags as constexprs, explicit batch and feature
strides, a 2-D mask, float32 math. The autotuner and the block-size
heuristics become const expressions in the spec.
"""

import triton
import triton.language as tl


@triton.jit
def softmax_forward_kernel(
    input_pointer, output_pointer,
    batch_dim, feat_dim,
    input_batch_stride, input_feat_stride,
    output_batch_stride, output_feat_stride,
    neg: tl.constexpr, log: tl.constexpr,
    BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_FEAT: tl.constexpr,
):
    # This program processes BLOCK_SIZE_BATCH rows and BLOCK_SIZE_FEAT columns.
    batch_pid = tl.program_id(axis=0)

    batch_offset = batch_pid * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
    feat_offset = tl.arange(0, BLOCK_SIZE_FEAT)

    batch_mask = batch_offset < batch_dim
    feat_mask = feat_offset < feat_dim

    input_pointer += (input_batch_stride * batch_offset[:, None] +
                      input_feat_stride * feat_offset[None, :])
    output_pointer += (output_batch_stride * batch_offset[:, None] +
                       output_feat_stride * feat_offset[None, :])

    input = tl.load(input_pointer, mask=batch_mask[:, None] & feat_mask[None, :],
                    other=float('inf') if neg else -float('inf')).to(tl.float32)
    if neg:
        input = -input

    input -= tl.max(input, axis=1)[:, None]
    numerator = tl.exp(input)
    denominator = tl.sum(numerator, axis=1)[:, None]

    if log:
        output = input - tl.log(denominator)

    else:
        output = numerator / denominator

    tl.store(output_pointer, output, mask=batch_mask[:, None] & feat_mask[None, :])

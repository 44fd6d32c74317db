"""Elementwise activation kernel with the activation chosen by a string constexpr (here mish).

Ported from BobMcDear/attorch, attorch/act_kernels.py (``act_func_forward_kernel``,
``apply_act_func`` and the activation helpers it calls), commit
67c2772baf33913ef51c2d1064f746ca17b63749, MIT licence.
Kept: the dispatch on ``act_func`` (a string tl.constexpr) for the
transcendental activations sigmoid, logsigmoid, tanh, softplus and mish, and
the unused ``drop_p``/``seed``/``param`` parameters. The fused dropout branch
is left out (``dropout`` stays a constexpr that the spec sets to 0).
"""

import triton
import triton.language as tl


@triton.jit
def sigmoid(input):
    return 1 / (1 + tl.exp(-input))


@triton.jit
def logsigmoid(input):
    return tl.log(sigmoid(input))


@triton.jit
def tanh(input):
    return 2 * sigmoid(2 * input) - 1


@triton.jit
def softplus(input):
    return tl.log(1 + tl.exp(input))


@triton.jit
def mish(input):
    return input * tanh(tl.log(1 + tl.exp(input)))


@triton.jit
def apply_act_func(input, drop_p, seed, offset, param, act_func: tl.constexpr,
                   dropout: tl.constexpr):
    if act_func == "sigmoid":
        input = input.to(tl.float32)
        output = sigmoid(input)
    elif act_func == "logsigmoid":
        input = input.to(tl.float32)
        output = logsigmoid(input)
    elif act_func == "tanh":
        input = input.to(tl.float32)
        output = tanh(input)
    elif act_func == "softplus":
        input = input.to(tl.float32)
        output = softplus(input)
    elif act_func == "mish":
        input = input.to(tl.float32)
        output = mish(input)
    return output


@triton.jit
def act_func_forward_kernel(input_pointer, output_pointer, size, drop_p, seed, param,
                            act_func: tl.constexpr, dropout: tl.constexpr,
                            BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offset = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offset < size

    input = tl.load(input_pointer + offset, mask=mask)
    tl.store(output_pointer + offset,
             apply_act_func(input, drop_p, seed, offset, param, act_func, dropout),
             mask=mask)

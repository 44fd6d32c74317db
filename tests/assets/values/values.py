"""Kernels wrong only on values that probes once never drew, and their correct twins.

Each wrong kernel's docstring says which check must catch it and which value
family (kcert.certify.probes) exposes it. They run in the interpreter (CI).
"""

import triton
import triton.language as tl


@triton.jit
def double(x, out, n, BLOCK: tl.constexpr):
    """Correct: out = 2 x."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    v = tl.load(x + offsets, mask=mask)
    tl.store(out + offsets, v * 2.0, mask=mask)


@triton.jit
def double_mid_range(x, out, n, BLOCK: tl.constexpr):
    """correctness: off by 1e-3 where 8 < |x| < 200, a range only the binade family draws."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    v = tl.load(x + offsets, mask=mask)
    a = tl.abs(v)
    tl.store(out + offsets, tl.where((a > 8.0) & (a < 200.0), v * 2.002, v * 2.0), mask=mask)


@triton.jit
def double_integers(x, out, n, BLOCK: tl.constexpr):
    """correctness: adds 1 where x is a nonzero integer, which only the integer family draws."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    v = tl.load(x + offsets, mask=mask)
    integral = (v == tl.floor(v)) & (v != 0.0)
    tl.store(out + offsets, tl.where(integral, v * 2.0 + 1.0, v * 2.0), mask=mask)


@triton.jit
def double_nonfinite_to_zero(x, out, n, BLOCK: tl.constexpr):
    """special-values: returns 0 for NaN and +-Inf inputs, where 2 x is NaN or +-Inf.

    Its spec opts x into the non-finite family ([kernel.nonfinite]).
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    v = tl.load(x + offsets, mask=mask)
    finite = (v - v) == 0.0
    tl.store(out + offsets, tl.where(finite, v * 2.0, 0.0), mask=mask)


@triton.jit
def masked_softmax(x, out, m, n, BLOCK: tl.constexpr):
    """Correct, with -inf (an attention mask) among the inputs: masked entries give 0."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    v = tl.load(x + row * n + cols, mask=mask, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(out + row * n + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def row_max(x, out, m, n, BLOCK: tl.constexpr):
    """Correct: the masked-off lanes are filled with -inf, the identity of max."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x + row * n + cols, mask=cols < n, other=-float("inf"))
    tl.store(out + row, tl.max(v, axis=0))


@triton.jit
def row_max_zero_fill(x, out, m, n, BLOCK: tl.constexpr):
    """correctness: masked-off lanes are filled with 0, which wins only in a row whose
    real values are all negative (the sign-rows family)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x + row * n + cols, mask=cols < n, other=0.0)
    tl.store(out + row, tl.max(v, axis=0))


@triton.jit
def row_sum(x, out, m, n, BLOCK: tl.constexpr):
    """Correct: row sums, block by block."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        c = start + cols
        acc += tl.load(x + row * n + c, mask=c < n, other=0.0)
    tl.store(out + row, tl.sum(acc, axis=0))


@triton.jit
def row_sum_half_finite_tail(x, out, m, n, BLOCK: tl.constexpr):
    """correctness: past the first BLOCK columns, a finite tail counts at half weight;
    a NaN/Inf tail passes through. When every long row held a NaN or Inf, the finite
    tails were never compared."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    head = tl.sum(tl.load(x + row * n + cols, mask=cols < n, other=0.0), axis=0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(BLOCK, n, BLOCK):
        c = start + cols
        acc += tl.load(x + row * n + c, mask=c < n, other=0.0)
    tail = tl.sum(acc, axis=0)
    finite = (tail == tail) & (tl.abs(tail) != float("inf"))
    tl.store(out + row, head + tl.where(finite, 0.5 * tail, tail))


@triton.jit
def reciprocal_wrong_outside(x, out, n, BLOCK: tl.constexpr):
    """Passes, and the certificate says why it may: 1/x, but 0 where 0 < |x| < 2**-21 or
    |x| > 2**13, magnitudes the `auto` f32 domain (2**-20 to 2**12) never draws."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    v = tl.load(x + offsets, mask=mask, other=1.0)
    a = tl.abs(v)
    off = ((a > 0) & (a < 4.76837158203125e-07)) | (a > 8192.0)
    tl.store(out + offsets, tl.where(off, 0.0, 1.0 / v), mask=mask)

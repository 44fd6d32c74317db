"""Kernels whose meaning differs between the Triton interpreter and its compiler
(tests/certify/test_interpreter.py)."""

import triton
import triton.language as tl


@triton.jit
def add_only_interpreted(x, y, out, n, BLOCK: tl.constexpr):
    # build: `low and high` is `high` (all true) under the interpreter, `low & high`
    # (all false) compiled: right on the interpreter, halves y on a GPU
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    low = offsets < 0
    high = offsets >= 0
    interpreted = low and high
    tl.store(out + offsets, tl.where(interpreted, a + b, a + b * 0.5), mask=mask)


@triton.jit
def add_either(x, y, out, n, BLOCK: tl.constexpr):
    # the twin: `|` means the same on both
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    low = offsets < 0
    high = offsets >= 0
    either = low | high
    tl.store(out + offsets, tl.where(either, a + b, a + b * 0.5), mask=mask)

"""y <- a * x + y, right on every size its spec probes and wrong from element 16384 on."""

import triton
import triton.language as tl


@triton.jit
def saxpy(x_ptr, y_ptr, a, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    # The bug: past 16384 elements (more than any probe) the result is off by one.
    tl.store(y_ptr + offsets, tl.where(offsets < 16384, a * x + y, a * x + y + 1.0), mask=mask)

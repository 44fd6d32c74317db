"""Layer norm over the rows of x[m, n]: (x - mean) / sqrt(var + eps) * gamma + beta.

One program per row; the variance is a second pass over (x - mean)^2.
"""

import triton
import triton.language as tl


@triton.jit
def layernorm(x_ptr, gamma_ptr, beta_ptr, out_ptr, eps, m, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    base = x_ptr + row * n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        acc += tl.load(base + start + cols, mask=start + cols < n, other=0.0)
    mean = tl.sum(acc, axis=0) / n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        d = tl.where(mask, tl.load(base + start + cols, mask=mask, other=0.0) - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        mask = start + cols < n
        x = tl.load(base + start + cols, mask=mask, other=0.0)
        g = tl.load(gamma_ptr + start + cols, mask=mask, other=0.0)
        b = tl.load(beta_ptr + start + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * n + start + cols, (x - mean) * rstd * g + b, mask=mask)

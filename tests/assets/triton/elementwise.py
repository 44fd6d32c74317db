"""Elementwise Triton kernels: one correct, the others each broken in one way.

Each kernel's docstring says which certification check must catch it and why.
They run on the GPU (executor ``triton``) and in the interpreter (CI).
"""

import triton
import triton.language as tl


@triton.jit
def vector_add(x, y, out, n, BLOCK: tl.constexpr):
    """Correct: out = x + y, the tail masked."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    tl.store(out + offsets, a + b, mask=mask)


@triton.jit
def add_unmasked_tail(x, y, out, n, BLOCK: tl.constexpr):
    """bounds: the loads are masked but the store is not, so the last block writes past n."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask, other=0.0)
    b = tl.load(y + offsets, mask=mask, other=0.0)
    tl.store(out + offsets, a + b)


@triton.jit
def add_early_exit(x, y, out, n, BLOCK: tl.constexpr):
    """coverage: small sizes are skipped ("the caller handles them"), so out stays unwritten."""
    if n >= 64:
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        a = tl.load(x + offsets, mask=mask)
        b = tl.load(y + offsets, mask=mask)
        tl.store(out + offsets, a + b, mask=mask)


@triton.jit
def relu_sparse_store(x, out, n, BLOCK: tl.constexpr):
    """coverage: stores only the positive results, assuming out was zeroed before the launch.

    Its spec draws x from negative values only, so the reference is all zeros
    and the kernel never writes its output at all: it would pass if the
    certifier handed it zero-filled outputs instead of poisoned ones.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    r = tl.maximum(tl.load(x + offsets, mask=mask), 0.0)
    tl.store(out + offsets, r, mask=mask & (r > 0.0))


@triton.jit
def relu(x, out, n, BLOCK: tl.constexpr):
    """Correct counterpart of relu_sparse_store."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.maximum(tl.load(x + offsets, mask=mask), 0.0), mask=mask)


@triton.jit
def add_writes_input(x, y, out, n, BLOCK: tl.constexpr):
    """input-integrity: uses its input x as scratch space (the answer is right)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    tl.store(x + offsets, a + b, mask=mask)
    tl.store(out + offsets, tl.load(x + offsets, mask=mask), mask=mask)


@triton.jit
def neighbor_sum(x, out, n, BLOCK: tl.constexpr):
    """Correct: out[i] = x[i] + x[i + 1], with x[n] taken as 0."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    here = tl.load(x + offsets, mask=mask)
    after = tl.load(x + offsets + 1, mask=offsets + 1 < n, other=0.0)
    tl.store(out + offsets, here + after, mask=mask)


@triton.jit
def neighbor_sum_oob_read(x, out, n, BLOCK: tl.constexpr):
    """determinism (and correctness): the x[i + 1] load is masked with i < n, so it reads x[n].

    x[n] is the first element of x's guard band: drawn contents that differ
    between the certifier's two runs (a NaN or an infinity in one of them, for
    two probes in three), and it leaks into out[n - 1]. No byte outside a
    buffer is written, so the bounds check (which watches writes) stays clean.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    here = tl.load(x + offsets, mask=mask)
    after = tl.load(x + offsets + 1, mask=mask)
    after = tl.where(offsets + 1 < n, after, after * 0.0)  # "zero the boundary" (NaN * 0 is NaN)
    tl.store(out + offsets, here + after, mask=mask)


@triton.jit
def add_alignment_path(x, y, out, n, BLOCK: tl.constexpr):
    """correctness and determinism: a "fast path" for 512-byte aligned inputs, a wrong slow path.

    The certifier's run A places buffers at an odd multiple of 16 bytes (the slow
    path: wrong), and run B at a multiple of 256, 512-aligned for about half the
    probes, so the two runs' outputs differ there too.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    aligned = (x.to(tl.int64, bitcast=True) % 512) == 0
    tl.store(out + offsets, tl.where(aligned, a + b, a + b * 0.5), mask=mask)


@triton.jit
def add_wild_store(x, y, out, n, BLOCK: tl.constexpr):
    """launch (crash): a store far outside any allocation."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    tl.store(out + offsets + (1 << 40), a + b, mask=mask)


@triton.jit
def add_spin(x, y, out, n, BLOCK: tl.constexpr):
    """launch (timeout): waits for its input to change, which nothing ever does.

    The load is volatile, so the compiler keeps it in the loop; a loop on a plain
    value (``i = i * 1``) is compiled away and the kernel returns at once.
    """
    first = tl.load(x, volatile=True).to(tl.int32, bitcast=True)
    now = first
    while now == first:
        now = tl.load(x, volatile=True).to(tl.int32, bitcast=True)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask), mask=mask)


@triton.jit
def add_tuned_to_probes(x, y, out, n, BLOCK: tl.constexpr):
    """fresh-probes: exact only for the sizes it was tested on, approximate elsewhere.

    Its spec caps the fixed probes at two (the smallest and the largest n);
    the fresh probes draw n from every listed value and find the others.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    tested = (n == 1) | (n == 4096)
    tl.store(out + offsets, tl.where(tested, a + b, (a + b) * 0.99), mask=mask)


@triton.jit
def add_debug_print(x, y, out, n, BLOCK: tl.constexpr):
    """artifact: a debug print left in; the spec forbids vprintf in the PTX."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    if tl.program_id(0) == 1 << 30:  # never true on the probes: only the artifact shows it
        tl.device_print("sum", a + b)
    tl.store(out + offsets, a + b, mask=mask)


@triton.jit
def add_bad_block(x, y, out, n, BLOCK: tl.constexpr):
    """build: tl.arange needs a power-of-two extent, and the spec gives BLOCK = 100."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    tl.store(out + offsets, a + b, mask=mask)

"""Triton kernels that could tell kcert's test conditions apart, and their correct twin.

Each one passed certification while kcert's conditions were fixed (two poisons,
two alignments, only the listed sizes); each docstring says which check must
catch it now. tests/certify/test_conditions.py certifies them in the interpreter.
"""

import triton
import triton.language as tl


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    """Correct: out = x + y, the tail masked (the twin of every kernel below)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    tl.store(out + offsets, a + b, mask=mask)


@triton.jit
def add_keeps_found(x, y, out, n, BLOCK: tl.constexpr):
    """coverage: reads out first and keeps any plausible value it finds there.

    A NaN or a huge poison is never plausible, so it computes under test; in
    production a reused allocation holds the previous call's output, which it
    keeps. Run B's prefilled stale values show it.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    old = tl.load(out + offsets, mask=mask, other=0.0)
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    plausible = (old == old) & (tl.abs(old) < 1e30)
    tl.store(out + offsets, tl.where(plausible, old, a + b), mask=mask)


@triton.jit
def add_reads_guard(x, y, out, n, BLOCK: tl.constexpr):
    """correctness or determinism: x[-1] (a guard) NaN or hugely negative means "under test".

    Only then does it compute the right sum; elsewhere it halves y. Guards that
    hold plausible values in one of the two runs make it misbehave there.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    before = tl.load(x - 1 + offsets * 0)
    under_test = (before != before) | (before < -1e30)
    tl.store(out + offsets, tl.where(under_test, a + b, a + b * 0.5), mask=mask)


@triton.jit
def add_reads_alignment(x, y, out, n, BLOCK: tl.constexpr):
    """correctness: right only when x's address modulo 4096 is 0 or 256 (the old two layouts)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    where = x.to(tl.int64, bitcast=True) % 4096
    known = (where == 0) | (where == 256)
    tl.store(out + offsets, tl.where(known, a + b, a + b * 0.5), mask=mask)


@triton.jit
def add_wrong_unlisted_sizes(x, y, out, n, BLOCK: tl.constexpr):
    """fresh-probes: wrong when n % 4 == 2 or n > 65536, sizes that no listed dim takes."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    size = offsets * 0 + n
    bad = (size % 4 == 2) | (size > 65536)
    tl.store(out + offsets, tl.where(bad, a + b * 0.5, a + b), mask=mask)


@triton.jit
def add_rounds_into_guard(x, y, out, n, BLOCK: tl.constexpr):
    """bounds: also writes out[n] = out[n] + 1e-3, one past the end.

    The value written is the guard plus a small number: with a huge poison there
    (or a NaN, whose payload survives the addition on a CPU) it rounds back to
    the very bytes that were there, and the write went unseen.
    """
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    tl.store(out + offsets, a + b, mask=mask)
    past = out + n + offsets * 0
    first = offsets == 0
    tl.store(past, tl.load(past, mask=first) + 1e-3, mask=first)


@triton.jit
def add_wrong_past_65536(x, y, out, n, BLOCK: tl.constexpr):
    """fresh-probes: wrong when n > 65536, past every listed size."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    size = offsets * 0 + n
    tl.store(out + offsets, tl.where(size > 65536, a + b * 0.5, a + b), mask=mask)


@triton.jit
def add_wrong_below_the_cap(x, y, out, n, BLOCK: tl.constexpr):
    # wrong for 4096 < n < 7168: past the listed sizes, below the top eighth of the stretch
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    size = offsets * 0 + n
    bad = (size > 4096) & (size < 7168)
    tl.store(out + offsets, tl.where(bad, a + b * 0.5, a + b), mask=mask)


@triton.jit
def row_scale(x, w, out, m, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    for start in range(0, n, BLOCK):
        c = start + cols
        mask = c < n
        v = tl.load(x + row * n + c, mask=mask)
        s = tl.load(w + c, mask=mask)
        tl.store(out + row * n + c, v * s, mask=mask)


@triton.jit
def row_scale_wrong_large_product(x, w, out, m, n, BLOCK: tl.constexpr):
    # drops the scale once m * n > 66,000 (an index overflow at large m * n stands for it);
    # no listed combination reaches it, and each dim's large size goes to a different probe
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    total = m * n
    for start in range(0, n, BLOCK):
        c = start + cols
        mask = c < n
        v = tl.load(x + row * n + c, mask=mask)
        s = tl.load(w + c, mask=mask)
        tl.store(out + row * n + c, tl.where(total + c * 0 > 66000, v, v * s), mask=mask)


@triton.jit
def add_knows_its_stale_answer(x, y, out, n, BLOCK: tl.constexpr):
    # right only where `out` holds kcert's fills: run A's NaN markers, or (run B) values
    # found among this call's answers; in production (an earlier call's output, fresh
    # memory) it halves y for n >= 256. Reads only inside its own buffers.
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    old = tl.load(out + offsets, mask=mask, other=0.0)
    nans = tl.sum(((old != old) & mask).to(tl.int32), axis=0)
    s_off = tl.program_id(0) * BLOCK + tl.arange(0, 16)
    s_mask = s_off < n
    sample = tl.load(out + s_off, mask=s_mask, other=0.0)
    found = tl.zeros((16,), dtype=tl.int32)
    for start in range(0, n, 256):
        o = start + tl.arange(0, 256)
        m = o < n
        new = tl.load(x + o, mask=m, other=0.0) + tl.load(y + o, mask=m, other=0.0)
        hit = (sample[:, None] == new[None, :]) & m[None, :]
        found = tl.maximum(found, tl.max(hit.to(tl.int32), axis=1))
    matched = tl.sum(tl.where(s_mask, found, 0), axis=0)
    valid = tl.sum(s_mask.to(tl.int32), axis=0)
    under_test = (nans > 0) | (2 * matched > valid) | (n < 256)
    tl.store(out + offsets, tl.where(under_test, a + b, a + b * 0.5), mask=mask)


@triton.jit
def add_needs_shared_alignment(x, y, out, n, BLOCK: tl.constexpr):
    # right only when x, y and out sit at the same offset modulo 4096 bytes, as they
    # did when every buffer of a run got the same shift; a caching allocator packs
    # tensors 512 bytes apart, and there it halves y
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    px = x.to(tl.int64, bitcast=True) % 4096
    py = y.to(tl.int64, bitcast=True) % 4096
    po = out.to(tl.int64, bitcast=True) % 4096
    same = (px == py) & (py == po)
    tl.store(out + offsets, tl.where(same, a + b, a + b * 0.5), mask=mask)


@triton.jit
def add_counts_odd_guards(x, y, out, n, BLOCK: tl.constexpr):
    # right only when 8 or more of the 64 floats before x are NaN, Inf or tiny, as a
    # guard band of states drawn per element is; production memory before a tensor (a
    # neighbouring tensor) is not, and there it halves y
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(x + offsets, mask=mask)
    b = tl.load(y + offsets, mask=mask)
    g = tl.load(x - 64 + tl.arange(0, 64))
    odd = (g != g) | (tl.abs(g) == float("inf")) | ((g != 0) & (tl.abs(g) < 2.5e-4))
    under_test = tl.sum(odd.to(tl.int32), axis=0) >= 8
    tl.store(out + offsets, tl.where(under_test, a + b, a + b * 0.5), mask=mask)

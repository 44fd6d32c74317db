"""The test conditions around a kernel: what its buffers hold besides the inputs, and where.

Nothing here is fixed. For every probe, each of its two launches gets its own
conditions, drawn from the certification's fresh seed and the probe's id (so a
re-run with the recorded seed reproduces them exactly; the certificate records
each probe's seeds, shifts and roll):

* ``out`` data regions. Run A, the marker run: quiet NaNs with drawn payloads
  and signs (integers: drawn bits; bools: bytes that are no bool). Run B, the
  prefilled run: plausible stale values, the reference answer of a *different*
  input draw of the same shape (from run B's seed), rotated by a drawn number
  of elements: what a caching allocator hands back after an earlier call, and
  never this probe's own answer shifted, which a kernel could recognise by
  finding its old ``out`` values among the answers it computes.
  The two fills differ in every element, byte for byte, so an element that
  holds its run's fill after both runs was never written.
* Guard bands (floats). Each region of 64 to 512 elements draws a pair of
  distinct states for runs A and B out of three (the regions next to the data:
  plausible in one run, small in the other two times in three): *small* (drawn
  sign, mantissa and binade, below 2**-12: its ulp is below 2**-20 in every
  float dtype, so a write of "the guard plus anything above about 1e-6"
  changes its bits, where a huge poison such as -FLT_MAX/3, or a NaN whose
  payload survives arithmetic on a CPU, would round the write back to itself);
  *non-finite* (a NaN of drawn payload or an infinity, so that a read a kernel
  multiplies by zero still shows); and *plausible* (normal values across a few
  binades, like production memory, so that a kernel that tells the test apart
  by what lies past its buffers misbehaves in a run). Integer guards hold
  drawn bits in run A and small integers in run B; bool guards hold non-bool
  bytes in A and 0/1 in B.
* Addresses. Each padded buffer starts at its own drawn offset past a
  4096-byte boundary (:func:`buffer_shifts`): in run A an odd multiple of 16
  bytes (never a multiple of 256), drawn per buffer; in run B the run's
  multiple of 256 plus a different multiple of 512 per buffer (a caching
  allocator packs tensors at 512-byte granularity), so a kernel that depends on
  its pointers' alignment, or on two buffers sharing it, sees both kinds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kcert.certify.executors.base import host_dtype
from kcert.certify.probes import _name_word, _Stream, derive_seed
from kcert.certify.spec import FLOAT_DTYPES

#: Names the scheme below; recorded in the certificate so that a reader knows how
#: each probe's recorded seeds, shifts and roll were turned into buffer contents.
SCHEME = "kcert-conditions-v3"
RUNS = ("A", "B")
#: Run A's guard values are below this in magnitude (see the module docstring).
SMALL_GUARD_EXP = -12
#: Smallest binade of run A's guard values, per dtype (f16: its smallest subnormal).
_SMALL_GUARD_LOW = {"f16": -24, "bf16": -40, "f32": -40, "f64": -80}
_EXP_BITS = {2: 5, 4: 8, 8: 11}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True, slots=True)
class RunConditions:
    """The drawn conditions of one launch of one probe."""

    run: str  # "A" (marker) or "B" (prefilled)
    #: Every element-wise fill (guards, ``out`` data) comes from this seed and the buffer name.
    seed: int
    #: Run A: an odd multiple of 16 bytes; run B: the multiple of 256 that every buffer's
    #: offset past a 4096-byte boundary starts from (see :func:`buffer_shifts`).
    shift: int
    #: Both runs' guards draw each element's pair of states from this seed.
    pair_seed: int
    #: Run B: elements the stale ``out`` contents are rotated by (0 in run A).
    roll: int = 0

    def to_json(self, buffers: Sequence[str] = ()) -> dict[str, Any]:
        """The recorded form; with ``buffers`` named, each one's offset too."""
        return {"seed": self.seed, "pair_seed": self.pair_seed, "shift": self.shift,
                "roll": self.roll,
                **({"offsets": buffer_shifts(self, buffers)} if buffers else {})}  # fmt: skip


def buffer_shifts(cond: RunConditions, names: Sequence[str]) -> dict[str, int]:
    """Per buffer, the bytes between a 4096-byte boundary and its padded array's start.

    Drawn per buffer, so that buffers of one run never all share an alignment: in
    run A odd multiples of 16 (never of 256), the first buffer at ``cond.shift``; in
    run B ``cond.shift`` plus distinct multiples of 512 (eight slots; the first
    buffer at 0), as a caching allocator packs tensors of a few kilobytes.
    """
    stream = _Stream([cond.seed, 0x6F666673])
    if cond.run == "A":
        odd = stream.integers(0, 239, len(names))
        shifts = [cond.shift, *(int(16 * (1 + k + k // 15)) for k in odd[1:])]
    else:
        slots = [0, *(int(v) for v in np.argsort(stream.uniform(7)) + 1)]
        shifts = [(cond.shift + 512 * slots[i % 8]) % 4096 for i in range(len(names))]
    return dict(zip(names, shifts, strict=False))


def draw_conditions(fresh_seed: int, probe_id: str) -> dict[str, RunConditions]:
    """Runs A and B of the probe ``probe_id``, from the certification's fresh seed."""
    seeds = {run: derive_seed(fresh_seed, "conditions", probe_id, run) for run in RUNS}
    stream = _Stream([seeds["A"], seeds["B"]])
    odd = int(stream.integers(0, 239, 1)[0])
    # 1..255 without the multiples of 16: an offset that is never a multiple of 256 bytes
    k = 1 + odd + odd // 15
    shift_a = 16 * k
    shift_b = 256 * int(stream.integers(0, 15, 1)[0])
    roll = int(stream.integers(1, 1 << 30, 1)[0])
    pairs = derive_seed(fresh_seed, "conditions", probe_id, "guard states")
    return {"A": RunConditions("A", seeds["A"], shift_a, pairs),
            "B": RunConditions("B", seeds["B"], shift_b, pairs, roll)}  # fmt: skip


def stale_seed(cond: RunConditions) -> int:
    """The seed of the input draw whose reference answer run ``cond``'s ``out`` holds."""
    return derive_seed(cond.seed, "stale inputs")


def default_conditions(run: str) -> RunConditions:
    """Conditions for a launch outside a certification (tests, tools): seed 0."""
    return draw_conditions(0, "")[run]


# ---------------------------------------------------------------------------- fills


#: What a guard element may hold in one run: a small value (whose ulp is tiny, so a write
#: of "itself plus a little" changes its bits), a NaN or an infinity (so that a read that
#: a kernel multiplies by zero still shows), or a plausible value (as production memory).
GUARD_STATES = ("small", "nonfinite", "plausible")
#: The ordered pairs of distinct states (run A, run B): each guard element draws one.
_STATE_PAIRS = tuple((a, b) for a in GUARD_STATES for b in GUARD_STATES if a != b)
#: The pairs that regions next to a buffer's data draw from: plausible in one of the runs,
#: and small in the other twice as often as non-finite. A one-element write of "the guard
#: plus a little" past the end shows only against a small guard; split evenly, it escaped
#: a probe one time in two (per-element pairs had given two in three). The price: a read
#: one past the end that a kernel multiplies by zero shows only against a non-finite
#: guard, which the element next to the data now holds in one probe in three, not two:
#: one element cannot be small and non-finite at once while the other run is plausible.
_EDGE_PAIRS = np.array([i for i, p in enumerate(_STATE_PAIRS) if "plausible" in p
                        for _ in range(2 if "small" in p else 1)])  # fmt: skip
#: Guard states are drawn per region of this many elements (lowest, highest), not per
#: element: production memory next to a tensor is another tensor, not a mix of kinds.
GUARD_REGION = (64, 512)
#: Per run, each pair's state as an index into GUARD_STATES.
_STATE_OF_RUN = tuple(np.array([GUARD_STATES.index(p[run]) for p in _STATE_PAIRS])
                      for run in (0, 1))  # fmt: skip


#: Guard contents repeat with this period (elements): drawing millions of elements per
#: buffer and run would cost more than the kernel's run in the interpreter.
GUARD_PERIOD = 1 << 12


def guard_fill(dtype: str, count: int, cond: RunConditions, name: str,
               *, before: bool = False) -> np.ndarray[Any, Any]:  # fmt: skip
    """``count`` guard elements of buffer ``name`` in the run ``cond``, ``GUARD_PERIOD`` apart.

    The cycle's first and last regions are plausible in one of the two runs; the
    guard ``before`` a buffer's data ends with the cycle's end, so that the region
    next to the data is always one of them.
    """
    period = min(count, GUARD_PERIOD)
    cycle = _guard_cycle(dtype, period, cond, name)
    if cycle.size == count:
        return cycle
    return np.resize(np.roll(cycle, count % period) if before else cycle, count)


def _guard_cycle(dtype: str, count: int, cond: RunConditions, name: str) -> np.ndarray[Any, Any]:
    """``count`` guard elements of buffer ``name`` in the run ``cond``.

    Float guards: each region of :data:`GUARD_REGION` elements draws a pair of
    distinct states for runs A and B (:data:`GUARD_STATES`), from a stream both runs
    share, so that every element holds two different kinds of value in the two runs;
    the first and last regions (next to the data) are plausible in one of the runs,
    so that a kernel reading its neighbourhood for the test's statistics sees
    production-like memory in one run and test memory in the other. The values
    themselves come from the run's own stream.
    """
    np_dtype = host_dtype(dtype)
    own = _Stream([cond.seed, _name_word(name), 0x6775617264])
    if dtype == "bool":
        if cond.run == "A":
            return _bytes_above_one(own, count).view(np_dtype)
        return (own.uniform(count) < 0.5).astype(np_dtype)
    if dtype not in FLOAT_DTYPES:
        if cond.run == "A":
            return _random_bits(own, np_dtype, count)
        info = np.iinfo(np_dtype)
        lo = -100 if info.min < 0 else 0
        return own.integers(lo, lo + 200, count).astype(np_dtype)
    shared = _Stream([cond.pair_seed, _name_word(name), 0x7061697273])
    pair = _region_pairs(shared, count)
    state = _STATE_OF_RUN[0 if cond.run == "A" else 1][pair]
    # one draw of 64 bits per element makes any state's value (no transcendental functions:
    # guards run to millions of elements per buffer)
    raw = own.raw(count)
    low = _SMALL_GUARD_LOW[dtype]
    # binades low to -14: even rounded up to the next binade, a value stays below 2**-12
    small = ((raw >> np.uint64(32)) % np.uint64(SMALL_GUARD_EXP - 1 - low)).astype(np.int64) + low
    exponent = np.where(state == 0, small, _plausible_exponent(raw))
    with np.errstate(all="ignore"):
        result: np.ndarray[Any, Any] = _signed_values(raw, exponent).astype(np_dtype)
    nonfinite = state == 1
    result[nonfinite] = _nonfinite(raw[nonfinite], dtype)
    return result


def _region_pairs(shared: _Stream, count: int) -> np.ndarray[Any, Any]:
    """Per element, the index of its region's pair in :data:`_STATE_PAIRS`."""
    lo, hi = GUARD_REGION
    lengths = shared.integers(lo, hi, count // lo + 2)
    ends = np.cumsum(lengths)
    regions = int(np.searchsorted(ends, count)) + 1  # regions covering [0, count)
    pairs = shared.integers(0, len(_STATE_PAIRS) - 1, regions)
    region = np.searchsorted(ends, np.arange(count), side="right")
    result: np.ndarray[Any, Any] = pairs[region]
    # the regions at either end, whole (at least ``lo`` elements), plausible in one run
    edge = _EDGE_PAIRS[shared.integers(0, len(_EDGE_PAIRS) - 1, 2)]
    first, last = (int(v) for v in shared.integers(lo, hi, 2))
    if first + last >= count:  # the two would overlap: one region, whole
        result[:] = edge[0]
    else:
        result[:first] = edge[0]
        result[count - last :] = edge[1]
    return result


def _signed_values(raw: np.ndarray[Any, Any],
                   exponent: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """``±(1 + m) * 2**exponent``: the sign from the top bit of ``raw``, ``m`` from its low 32."""
    sign = np.where((raw >> np.uint64(63)) != 0, -1.0, 1.0)
    mantissa = 1.0 + (raw & np.uint64(0xFFFFFFFF)).astype(np.float64) * 2.0**-32
    values: np.ndarray[Any, Any] = sign * np.ldexp(mantissa, exponent)
    return values


def _plausible_exponent(raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Binades -3 to 3: magnitudes from 1/8 to 16, what a neighbouring tensor might hold."""
    exponent: np.ndarray[Any, Any] = ((raw >> np.uint64(40)) % np.uint64(7)).astype(np.int64) - 3
    return exponent


def _nonfinite(raw: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """NaNs with payloads from ``raw``, and infinities of either sign (a third of them)."""
    values = _nan_from_raw(raw, dtype)
    inf = (raw >> np.uint64(8)) % np.uint64(3) == 0
    sign = np.where((raw >> np.uint64(63)) != 0, -np.inf, np.inf)
    values[inf] = sign[inf].astype(values.dtype)
    return values


def out_fill(dtype: str, shape: tuple[int, ...], cond: RunConditions, name: str,
             stale: np.ndarray[Any, Any] | None = None,
             answer: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:  # fmt: skip
    """What the ``out`` buffer ``name`` holds before the launch of run ``cond``.

    ``stale`` is an earlier call's answer in the output dtype (run B: the reference
    answer of another input draw, :func:`stale_seed`); without it, run B's fill is
    plausible values like its guards'. Where the stale value equals this probe's
    ``answer`` (``stale`` itself when not given), keeping it would be right: those
    elements get plausible values instead.
    """
    count = math.prod(shape)
    np_dtype = host_dtype(dtype)
    stream = _Stream([cond.seed, _name_word(name), 0x6F7574])
    if cond.run == "A":
        return _markers(stream, dtype, count).reshape(shape)
    plausible = _stale_fallback(dtype, count, stream)
    if stale is None or count == 0:
        return plausible.reshape(shape)
    previous = np.ascontiguousarray(np.asarray(stale, dtype=np_dtype)).reshape(-1)
    right = previous if answer is None else np.ascontiguousarray(
        np.asarray(answer, dtype=np_dtype)).reshape(-1)  # fmt: skip
    rotated = np.roll(previous, cond.roll % count)
    # where the stale value is this probe's right answer, keeping it would be right
    same = _same(rotated, right)
    rotated[same] = plausible[same]
    return rotated.reshape(shape)


def out_fills(
    dtype: str, shape: tuple[int, ...], runs: Mapping[str, RunConditions], name: str,
    stale: np.ndarray[Any, Any] | None = None, answer: np.ndarray[Any, Any] | None = None,
) -> dict[str, np.ndarray[Any, Any]]:  # fmt: skip
    """Both runs' ``out`` fills, made to differ in every element (the coverage check's premise)."""
    a = out_fill(dtype, shape, runs["A"], name)
    b = out_fill(dtype, shape, runs["B"], name, stale, answer)
    clash = _same(a.reshape(-1), b.reshape(-1))
    if clash.any():
        # a stale NaN or drawn integer that happens to equal run A's marker: flip a low bit
        bits = a.reshape(-1).view(_UINT[a.itemsize])
        bits[clash] ^= 1
    return {"A": a, "B": b}


def _stale_fallback(dtype: str, count: int, stream: _Stream) -> np.ndarray[Any, Any]:
    """Plausible values for run B's ``out`` where no stale answer fits."""
    np_dtype = host_dtype(dtype)
    if dtype == "bool":
        return (stream.uniform(count) < 0.5).astype(np_dtype)
    if dtype in FLOAT_DTYPES:
        raw = stream.raw(count)
        with np.errstate(all="ignore"):
            values = _signed_values(raw, _plausible_exponent(raw))
            result: np.ndarray[Any, Any] = values.astype(np_dtype)
        return result
    info = np.iinfo(np_dtype)
    lo = -100 if info.min < 0 else 0
    return stream.integers(lo, lo + 200, count).astype(np_dtype)


def _markers(stream: _Stream, dtype: str, count: int) -> np.ndarray[Any, Any]:
    """Run A's ``out`` fill: NaNs with drawn payloads and signs, drawn bits, non-bool bytes."""
    np_dtype = host_dtype(dtype)
    if dtype == "bool":
        return _bytes_above_one(stream, count).view(np_dtype)
    if dtype not in FLOAT_DTYPES:
        return _random_bits(stream, np_dtype, count)
    return _nan_from_raw(stream.raw(count), dtype)


def _nan_from_raw(raw: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """Quiet NaNs whose sign and payload come from ``raw``."""
    np_dtype = host_dtype(dtype)
    size = np_dtype.itemsize
    width = 8 * size
    fraction = width - 1 - _EXP_BITS[size] if dtype != "bf16" else 7
    exponent_bits = width - 1 - fraction
    sign = (raw >> np.uint64(63)) << np.uint64(width - 1)
    payload = raw & np.uint64((1 << (fraction - 1)) - 1)
    quiet = np.uint64(1 << (fraction - 1))
    exponent = np.uint64(((1 << exponent_bits) - 1) << fraction)
    bits = (sign | exponent | quiet | payload).astype(_UINT[size])
    result: np.ndarray[Any, Any] = bits.view(np_dtype)
    return result


def _random_bits(stream: _Stream, np_dtype: np.dtype[Any], count: int) -> np.ndarray[Any, Any]:
    raw = stream.raw(count).astype(_UINT[np_dtype.itemsize])
    result: np.ndarray[Any, Any] = raw.view(np_dtype)
    return result


def _bytes_above_one(stream: _Stream, count: int) -> np.ndarray[Any, Any]:
    """Bytes in [2, 255]: a bool store (0 or 1) can never leave one unchanged."""
    return stream.integers(2, 255, count).astype(np.uint8)


def _same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Element-wise byte equality of two 1-D arrays of one dtype."""
    rows_a = a.view(np.uint8).reshape(a.size, a.itemsize)
    rows_b = b.view(np.uint8).reshape(b.size, b.itemsize)
    same: np.ndarray[Any, Any] = np.all(rows_a == rows_b, axis=1)
    return same

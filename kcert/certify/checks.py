"""The host-side checks: what two launches on filled, guarded buffers reveal.

Every buffer is laid out as ``[guard | data | guard]`` (see
:mod:`kcert.certify.execution`). Each probe is launched twice, under
conditions drawn per probe from the certification's fresh seed
(:mod:`kcert.certify.conditions`):

* run A, the marker run: ``out`` data filled with NaNs of drawn payloads,
  guards with small values of drawn binades, each buffer at its own drawn
  offset that is not a multiple of 256 bytes;
* run B, the prefilled run: ``out`` data filled with plausible stale values
  (the reference answer of another input draw, in the wrong places), guards with plausible values,
  buffers at drawn multiples of 256 bytes that differ by multiples of 512.

From those, per probe:

* ``coverage``: an ``out`` element that holds run A's fill after run A *and*
  run B's fill after run B was never written (the two fills differ in every
  element, so no value a kernel computes looks unwritten in both); an element
  that keeps run B's stale value where run A's output differs kept what it
  found instead of computing it;
* ``bounds``: any guard element whose bytes are not what its run put there was
  written; the farthest such element says how far the overrun went;
* ``input-integrity``: ``in`` data regions must come back byte for byte;
* ``determinism``: the written output bytes of runs A and B must be equal,
  so races, reads of uninitialised memory, of the guards or of the alignment
  show up;
* ``special-values``: NaN or Inf in run A's output where the reference,
  rounded to the output dtype, has none (an Inf where the exact answer is
  within tolerance of the dtype's overflow threshold is a correct rounding),
  and the other way round: where the reference is NaN or ±Inf (non-finite
  inputs, ``[kernel.nonfinite]``), the kernel must give the same;
* ``correctness``: run A's output against the reference, element by element,
  with the bounds of :mod:`kcert.certify.tolerance`.

Unwritten and stale elements are coverage's finding alone: they are left out
of the other output checks, so that each failure names its own cause.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kcert.certify.conditions import (
    RunConditions,
    buffer_shifts,
    draw_conditions,
    guard_fill,
    out_fills,
)
from kcert.certify.execution import PaddedBuffer, RunJob
from kcert.certify.executors.base import host_dtype
from kcert.certify.profile import PROBE_BINS, element_levels, profile
from kcert.certify.report import ErrorMetrics, ErrorProfile
from kcert.certify.spec import FLOAT_DTYPES, BufferArg, Intent, KernelSpec, Launch
from kcert.certify.tolerance import Allowance, float_info

#: Guards are at least this many elements, and at least this many rows of the
#: buffer's innermost extents, so that a whole tile that overruns lands in them.
MIN_GUARD = 16384
GUARD_ROWS = 256
MAX_GUARD = 1 << 22


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's failure on one probe."""

    check: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


def guard_elements(shape: tuple[int, ...]) -> int:
    """Guard width in elements, a multiple of 256 so every data region stays aligned."""
    inner = math.prod(shape[1:]) if len(shape) > 1 else 1
    width = min(max(MIN_GUARD, GUARD_ROWS * inner), MAX_GUARD)
    return -(-width // 256) * 256


def padded_buffer(buf: BufferArg, shape: tuple[int, ...], data: np.ndarray[Any, Any] | None,
                  cond: RunConditions) -> PaddedBuffer:  # fmt: skip
    """``[guard | data | guard]`` for one buffer: ``data`` is the input or the ``out`` fill."""
    guard = guard_elements(shape)
    size = math.prod(shape)
    padded = np.empty(guard + size + guard, dtype=host_dtype(buf.dtype))
    padded[:guard] = guard_fill(buf.dtype, guard, cond, buf.name + "\0before", before=True)
    padded[guard + size :] = guard_fill(buf.dtype, guard, cond, buf.name + "\0after")
    if data is not None:
        padded[guard : guard + size] = np.asarray(data, dtype=padded.dtype).reshape(-1)
    return PaddedBuffer(buf.name, buf.dtype, tuple(shape), guard, padded)


def make_job(kernel: KernelSpec, launch: Launch, inputs: Mapping[str, np.ndarray[Any, Any]],
             variant: str, *, runs: Mapping[str, RunConditions] | None = None,
             stale: Mapping[str, np.ndarray[Any, Any]] | None = None,
             answer: Mapping[str, np.ndarray[Any, Any]] | None = None) -> RunJob:  # fmt: skip
    """The job of run ``variant`` ("A" or "B") of one probe under ``runs`` (both runs' conditions).

    ``stale`` holds an earlier call's answers (the reference answers of another input
    draw of the same shape), which run B's ``out`` buffers hold in the wrong places;
    ``answer`` the probe's own reference answers, which the stale fill never keeps;
    ``runs`` defaults to the conditions of seed 0 (tests and tools).
    """
    runs = runs if runs is not None else draw_conditions(0, "")
    cond = runs[variant]
    contents: dict[str, np.ndarray[Any, Any] | None] = {}
    for b in kernel.buffers:
        if b.intent is Intent.OUT:
            fills = out_fills(b.dtype, launch.shapes[b.name], runs, b.name,
                              None if stale is None else stale.get(b.name),
                              None if answer is None else answer.get(b.name))  # fmt: skip
            contents[b.name] = fills[variant]
        else:
            contents[b.name] = inputs.get(b.name)
    buffers = tuple(padded_buffer(b, launch.shapes[b.name], contents[b.name], cond)
                    for b in kernel.buffers)  # fmt: skip
    shifts = buffer_shifts(cond, [b.name for b in kernel.buffers])
    return RunJob(launch, buffers, address_shift=cond.shift, buffer_shifts=shifts)

# ---------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class ProbeEvidence:
    """Everything the checks look at for one probe."""

    kernel: KernelSpec
    job_a: RunJob
    job_b: RunJob
    out_a: Mapping[str, np.ndarray[Any, Any]]
    out_b: Mapping[str, np.ndarray[Any, Any]]
    #: Reference outputs rounded to each output's dtype.
    reference: Mapping[str, np.ndarray[Any, Any]]
    allowances: Mapping[str, Allowance]


@dataclass
class ProbeResult:
    findings: dict[str, Finding] = field(default_factory=dict)
    metrics: dict[str, ErrorMetrics] = field(default_factory=dict)
    #: Output anchors are taken from these (run A's data regions).
    outputs: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)


def evaluate(ev: ProbeEvidence) -> ProbeResult:
    """Run every host-side check on one probe's two launches."""
    result = ProbeResult()
    by_name_a = {b.name: b for b in ev.job_a.buffers}
    by_name_b = {b.name: b for b in ev.job_b.buffers}
    bounds: list[str] = []
    integrity: list[str] = []
    coverage: list[str] = []
    determinism: list[str] = []
    special: list[str] = []
    correctness: list[str] = []
    details: dict[str, dict[str, Any]] = {k: {} for k in (
        "bounds", "input-integrity", "coverage", "determinism", "special-values", "correctness")}
    for buf in ev.kernel.buffers:
        pa, pb = by_name_a[buf.name], by_name_b[buf.name]
        got_a, got_b = ev.out_a[buf.name], ev.out_b[buf.name]
        for run, job_buf, got in (("A", pa, got_a), ("B", pb, got_b)):
            overrun = _guard_damage(job_buf, got)
            if overrun:
                bounds.append(f"'{buf.name}' {overrun['text']} (run {run})")
                details["bounds"].setdefault(buf.name, overrun)
        data_a, data_b = _data(pa, got_a), _data(pb, got_b)
        if buf.intent is Intent.IN:
            for run, job_buf, data in (("A", pa, data_a), ("B", pb, data_b)):
                changed = _changed(job_buf.data(), data)
                if changed is not None:
                    count, index = changed
                    integrity.append(f"'{buf.name}' has {count} element(s) changed, first at "
                                     f"{index} (run {run})")  # fmt: skip
                    details["input-integrity"].setdefault(buf.name, {"changed": count,
                                                                     "first_index": list(index)})
            continue
        unwritten = np.zeros(data_a.shape, dtype=bool)
        stale = np.zeros(data_a.shape, dtype=bool)
        if buf.intent is Intent.OUT:
            fill_a, fill_b = pa.data(), pb.data()
            unwritten = _same_bytes(data_a, fill_a) & _same_bytes(data_b, fill_b)
            if unwritten.any():
                count = int(unwritten.sum())
                index = _first(unwritten)
                coverage.append(f"'{buf.name}' has {count} of {unwritten.size} element(s) never "
                                f"written, first at {index}")  # fmt: skip
                details["coverage"][buf.name] = {"unwritten": count, "first_index": list(index)}
            # run B's buffer held plausible stale values: keeping one is not computing it
            stale = ~unwritten & _same_bytes(data_b, fill_b) & ~_same_bytes(data_a, data_b)
            if stale.any():
                count, index = int(stale.sum()), _first(stale)
                coverage.append(f"'{buf.name}' kept {count} of {stale.size} stale element(s) "
                                f"that its buffer held before the launch, first at {index} "
                                "(run B prefilled it with plausible values, as a reused "
                                "allocation holds an earlier call's output)")  # fmt: skip
                details["coverage"].setdefault(buf.name, {}).update(
                    {"kept_stale": count, "first_stale_index": list(index)})
        written = ~unwritten
        differ = written & ~stale & ~_same_bytes(data_a, data_b)
        if differ.any():
            count, index = int(differ.sum()), _first(differ)
            determinism.append(f"'{buf.name}' differs between two launches in {count} element(s), "
                               f"first at {index}")  # fmt: skip
            details["determinism"][buf.name] = {"differing": count, "first_index": list(index)}
        result.outputs[buf.name] = data_a
        ref = ev.reference[buf.name]
        allowance = ev.allowances[buf.name]
        bad_special = _special(buf.dtype, data_a, ref, allowance.allowed) & written
        if bad_special.any():
            count, index = int(bad_special.sum()), _first(bad_special)
            value = data_a[index] if index else data_a.reshape(())
            special.append(f"'{buf.name}' has {count} NaN/Inf value(s) where the reference has "
                           f"none, first at {index} (got {value}, expected {ref[index]})")
            details["special-values"][buf.name] = {"count": count, "first_index": list(index)}
        lost = lost_specials(buf.dtype, data_a, ref) & written
        if lost.any():
            count, index = int(lost.sum()), _first(lost)
            value = data_a[index] if index else data_a.reshape(())
            special.append(f"'{buf.name}' has {count} element(s) where the reference is NaN/Inf "
                           f"and the kernel is not, first at {index} (got {value}, expected "
                           f"{ref[index]})")  # fmt: skip
            details["special-values"].setdefault(buf.name, {}).update(
                {"lost": count, "first_lost_index": list(index)})
        metrics = compare(buf.dtype, data_a, ref, allowance, mask=written)
        where = error_profile(buf.dtype, data_a, ref, allowance, unwritten=unwritten,
                              budget=PROBE_BINS // max(1, len(ev.kernel.outputs)))  # fmt: skip
        result.metrics[buf.name] = dataclasses.replace(metrics, profile=where)
        if metrics.bad_count:
            index = metrics.first_bad_index or ()
            correctness.append(
                f"'{buf.name}': {metrics.bad_count} element(s) outside tolerance, first at "
                f"{index} (got {data_a[index]}, expected {ref[index]}, allowed error "
                f"{float(allowance.allowed[index]):.3g}); max abs error {metrics.max_abs:.3g}, "
                f"max rel {metrics.max_rel:.3g}, max {metrics.max_ulp:.3g} ulp")
            details["correctness"][buf.name] = metrics.to_json() | {
                "tolerance": allowance.summary()}
    for name, messages in (("bounds", bounds), ("input-integrity", integrity),
                           ("coverage", coverage), ("determinism", determinism),
                           ("special-values", special), ("correctness", correctness)):  # fmt: skip
        if messages:
            result.findings[name] = Finding(name, "; ".join(messages), details[name])
    return result


def timed_output_error(kernel: KernelSpec, job: RunJob, got: Mapping[str, np.ndarray[Any, Any]],
                       reference: Mapping[str, np.ndarray[Any, Any]],
                       allowances: Mapping[str, Allowance]) -> str | None:  # fmt: skip
    """What is wrong with the output of the last timed run of ``job``.

    Before every timed run the ``out`` buffers hold the job's fill again and the
    ``inout`` buffers their pristine contents, so a launch that skips its work
    leaves the fill (or stale input) behind, never an earlier run's right answer.
    """
    by_name = {b.name: b for b in job.buffers}
    problems: list[str] = []
    for buf in kernel.outputs:
        data = _data(by_name[buf.name], got[buf.name])
        ref = reference[buf.name]
        unwritten = np.zeros(data.shape, dtype=bool)
        if buf.intent is Intent.OUT:
            fill = by_name[buf.name].data()
            # where the right answer happens to be the fill, an unwritten element is right
            unwritten = _same_bytes(data, fill) & ~_same_bytes(np.asarray(ref, data.dtype), fill)
            if unwritten.any():
                problems.append(f"'{buf.name}' has {int(unwritten.sum())} of {unwritten.size} "
                                f"element(s) never written, first at {_first(unwritten)}")
        metrics = compare(buf.dtype, data, ref, allowances[buf.name], mask=~unwritten)
        if metrics.bad_count:
            index = metrics.first_bad_index or ()
            problems.append(f"'{buf.name}' has {metrics.bad_count} element(s) outside tolerance, "
                            f"first at {index} (got {data[index]}, expected {ref[index]})")
    return "; ".join(problems) or None


def compare(dtype: str, got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any],
            allowance: Allowance, *, mask: np.ndarray[Any, Any] | None = None) -> ErrorMetrics:
    """Error metrics of ``got`` against ``ref`` (both in the output dtype) under ``allowance``."""
    mask = np.ones(got.shape, dtype=bool) if mask is None else mask
    g, r, error, ok = _judge(dtype, got, ref, allowance)
    with np.errstate(all="ignore"):
        both_finite = np.isfinite(g) & np.isfinite(r)
        bad = mask & ~ok
        finite = mask & both_finite
        max_abs = float(error[finite].max()) if finite.any() else 0.0
        nonzero = finite & (r != 0)
        max_rel = float((error[nonzero] / np.abs(r[nonzero])).max()) if nonzero.any() else 0.0
        if bad.any() and not (bad & finite).any():
            max_abs = max_rel = math.inf
        max_ulp = float((error[finite] / ulp(dtype, r[finite])).max()) if finite.any() else 0.0
    count = int(bad.sum())
    return ErrorMetrics(max_abs=max_abs, max_rel=max_rel, max_ulp=max_ulp, bad_count=count,
                        first_bad_index=_first(bad) if count else None,
                        atol=allowance.atol, rtol=allowance.rtol)  # fmt: skip


def error_profile(dtype: str, got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any],
                  allowance: Allowance, *, unwritten: np.ndarray[Any, Any],
                  budget: int = PROBE_BINS) -> ErrorProfile:  # fmt: skip
    """Where ``got`` is off, as its error/allowed ratio binned over the output.

    Judged exactly as :func:`compare` judges it; an element never written (it
    holds the poison) is a failure, as coverage says.
    """
    _, _, error, ok = _judge(dtype, got, ref, allowance)
    allowed = np.broadcast_to(allowance.allowed, error.shape)
    with np.errstate(all="ignore"):
        ratio = np.where(error == 0, 0.0, error / allowed)
    levels = element_levels(ratio, ~ok | unwritten)
    return profile(levels, got.shape, budget=budget)


def _judge(dtype: str, got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any],
           allowance: Allowance) -> tuple[np.ndarray[Any, Any], ...]:  # fmt: skip
    """``got`` and ``ref`` in float64, the absolute error, and which elements are within bounds."""
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    allowed = np.broadcast_to(allowance.allowed, g.shape)
    with np.errstate(all="ignore"):
        error = np.abs(g - r)
        ok = np.isfinite(g) & np.isfinite(r) & (error <= allowed)
        ok |= (np.isnan(g) & np.isnan(r)) | (np.isinf(g) & (g == r))
        if dtype in FLOAT_DTYPES:
            ok |= _overflow_excused(dtype, g, r, allowed)
    return g, r, error, ok


def ulp(dtype: str, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The spacing of ``dtype`` at each value (integers: 1)."""
    if dtype not in FLOAT_DTYPES:
        return np.ones(np.shape(values))
    info = float_info(dtype)
    with np.errstate(all="ignore"):
        _, exponent = np.frexp(np.abs(values))
    # frexp(0) gives exponent 0; zero's spacing is that of the subnormals
    exponent = np.where(values == 0, int(info.minexp), np.maximum(exponent - 1, int(info.minexp)))
    spacing: np.ndarray[Any, Any] = np.ldexp(1.0, exponent - int(info.nmant))
    return spacing


def _overflow_excused(dtype: str, g: np.ndarray[Any, Any], r: np.ndarray[Any, Any],
                      allowed: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """An Inf is a correct rounding when the exact answer may lie past the overflow threshold."""
    top = float(float_info(dtype).max)
    threshold = top + float(ulp(dtype, np.array([top]))[0]) / 2
    with np.errstate(all="ignore"):
        reach = np.abs(r) + allowed
        excused: np.ndarray[Any, Any] = (np.isinf(g) & np.isfinite(r) & (np.sign(g) == np.sign(r))
                                         & (reach >= threshold))
        return excused


def _special(dtype: str, got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any],
             allowed: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    if dtype not in FLOAT_DTYPES:
        return np.zeros(got.shape, dtype=bool)
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    allowed = np.broadcast_to(allowed, g.shape)
    nonfinite = ~np.isfinite(g)
    excused = _overflow_excused(dtype, g, r, allowed) | (np.isinf(g) & np.isinf(r))
    bad: np.ndarray[Any, Any] = (nonfinite & np.isfinite(r) & ~excused) | (np.isnan(g)
                                                                          & ~np.isnan(r))
    return bad


def lost_specials(dtype: str, got: np.ndarray[Any, Any],
                  ref: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # fmt: skip
    """Where the reference is NaN or ±Inf and the kernel's element is not the same."""
    if dtype not in FLOAT_DTYPES:
        return np.zeros(got.shape, dtype=bool)
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    lost: np.ndarray[Any, Any] = (np.isnan(r) & ~np.isnan(g)) | (np.isinf(r) & (g != r))
    return lost


def _data(buf: PaddedBuffer, padded: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return padded[buf.guard : buf.guard + buf.size].reshape(buf.shape)


def _rows(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Each element's bytes as one row of a uint8 matrix."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.view(np.uint8).reshape(flat.size, flat.dtype.itemsize)


def _same_bytes(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    same: np.ndarray[Any, Any] = np.all(_rows(a) == _rows(b), axis=1)
    return same.reshape(a.shape)


def _changed(before: np.ndarray[Any, Any],
             after: np.ndarray[Any, Any]) -> tuple[int, tuple[int, ...]] | None:  # fmt: skip
    differ = ~_same_bytes(before, after)
    if not differ.any():
        return None
    return int(differ.sum()), _first(differ)


def _first(mask: np.ndarray[Any, Any]) -> tuple[int, ...]:
    flat = int(np.flatnonzero(mask.reshape(-1))[0])
    return tuple(int(i) for i in np.unravel_index(flat, mask.shape))


def _guard_damage(buf: PaddedBuffer, got: np.ndarray[Any, Any]) -> dict[str, Any] | None:
    """Where a guard band was written: element counts and the farthest distance on each side."""
    end = buf.guard + buf.size
    before = ~_same_bytes(got[: buf.guard], buf.padded[: buf.guard])
    after = ~_same_bytes(got[end:], buf.padded[end:])
    if not before.any() and not after.any():
        return None
    parts: list[str] = []
    info: dict[str, Any] = {"guard_elements": buf.guard}
    if after.any():
        far = int(np.flatnonzero(after)[-1]) + 1
        info["after"] = {"written": int(after.sum()), "farthest": far}
        parts.append(f"written up to {far} element(s) past its end ({int(after.sum())} written)")
    if before.any():
        far = buf.guard - int(np.flatnonzero(before)[0])
        info["before"] = {"written": int(before.sum()), "farthest": far}
        parts.append(f"written up to {far} element(s) before its start ({int(before.sum())} "
                     "written)")  # fmt: skip
    info["text"] = " and ".join(parts)
    return info

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

From those, :func:`evaluate` runs every check of the registry in
:mod:`kcert.certify.probe_checks` (each class there says what it looks
for), and keeps run A's outputs and their error metrics for the probe's
record. This module also lays the buffers out, builds the two jobs, and
compares outputs with the reference (:func:`compare`, used by the guard too).
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
from kcert.certify.elementwise import (
    as_float64,
    data_region,
    first_index,
    overflow_excused,
    same_bytes,
    ulp,
)  # fmt: skip
from kcert.certify.execution import PaddedBuffer, RunJob
from kcert.certify.executors.base import host_dtype
from kcert.certify.probe_checks import (
    PROBE_CHECKS,
    BufferRuns,
    Evidence,
    Finding,
    OutputEvidence,
)  # fmt: skip
from kcert.certify.profile import PROBE_BINS, element_levels, profile
from kcert.certify.report import ErrorMetrics, ErrorProfile
from kcert.certify.spec import FLOAT_DTYPES, BufferArg, Intent, KernelSpec, Launch
from kcert.certify.tolerance import Allowance

__all__ = [
    "Finding", "ProbeEvidence", "ProbeResult", "compare", "error_profile", "evaluate", "gather",
    "guard_elements", "make_job", "padded_buffer", "timed_output_error", "ulp",
]  # fmt: skip

#: Guards are at least this many elements, and at least this many rows of the
#: buffer's innermost extents, so that a whole tile that overruns lands in them.
MIN_GUARD = 16384
GUARD_ROWS = 256
MAX_GUARD = 1 << 22


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
    """One probe's two launches as the pipeline hands them over."""

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
    #: By check name, in the order of their ranks (the most basic cause first).
    findings: dict[str, Finding] = field(default_factory=dict)
    metrics: dict[str, ErrorMetrics] = field(default_factory=dict)
    #: Output anchors are taken from these (run A's data regions).
    outputs: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)


def evaluate(ev: ProbeEvidence) -> ProbeResult:
    """Run every registered probe check on one probe's two launches."""
    evidence = gather(ev)
    result = ProbeResult()
    for check in sorted(PROBE_CHECKS, key=lambda c: c.rank):
        finding = check.find(evidence)
        if finding is not None:
            result.findings[check.name] = finding
    budget = PROBE_BINS // max(1, len(ev.kernel.outputs))
    for out in evidence.outputs:
        data_a = out.runs.data("A")
        result.outputs[out.name] = data_a
        where = error_profile(out.dtype, data_a, out.reference, out.allowance,
                              unwritten=out.unwritten, budget=budget)  # fmt: skip
        result.metrics[out.name] = dataclasses.replace(out.metrics, profile=where)
    return result


def gather(ev: ProbeEvidence) -> Evidence:
    """The checks' view of one probe: each buffer's runs; for outputs, what was written."""
    sent_a = {b.name: b for b in ev.job_a.buffers}
    sent_b = {b.name: b for b in ev.job_b.buffers}
    buffers = tuple(BufferRuns(arg, {"A": sent_a[arg.name], "B": sent_b[arg.name]},
                               {"A": ev.out_a[arg.name], "B": ev.out_b[arg.name]})
                    for arg in ev.kernel.buffers)  # fmt: skip
    outputs: list[OutputEvidence] = []
    for runs in buffers:
        if runs.arg.intent is Intent.IN:
            continue
        data_a, data_b = runs.data("A"), runs.data("B")
        unwritten = np.zeros(data_a.shape, dtype=bool)
        stale = np.zeros(data_a.shape, dtype=bool)
        if runs.arg.intent is Intent.OUT:
            fill_a, fill_b = runs.sent["A"].data(), runs.sent["B"].data()
            # the two fills differ in every element: no computed value looks unwritten in both
            unwritten = same_bytes(data_a, fill_a) & same_bytes(data_b, fill_b)
            # run B's buffer held plausible stale values: keeping one is not computing it
            stale = ~unwritten & same_bytes(data_b, fill_b) & ~same_bytes(data_a, data_b)
        ref, allowance = ev.reference[runs.name], ev.allowances[runs.name]
        metrics = compare(runs.arg.dtype, data_a, ref, allowance, mask=~unwritten)
        outputs.append(OutputEvidence(runs, ref, allowance, unwritten, stale, metrics))
    return Evidence(buffers, tuple(outputs))


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
        data = data_region(by_name[buf.name], got[buf.name])
        ref = reference[buf.name]
        unwritten = np.zeros(data.shape, dtype=bool)
        if buf.intent is Intent.OUT:
            fill = by_name[buf.name].data()
            # where the right answer happens to be the fill, an unwritten element is right
            unwritten = same_bytes(data, fill) & ~same_bytes(np.asarray(ref, data.dtype), fill)
            if unwritten.any():
                problems.append(f"'{buf.name}' has {int(unwritten.sum())} of {unwritten.size} "
                                f"element(s) never written, first at {first_index(unwritten)}")
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
                        first_bad_index=first_index(bad) if count else None,
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
    g, r = as_float64(got), as_float64(ref)
    allowed = np.broadcast_to(allowance.allowed, g.shape)
    with np.errstate(all="ignore"):
        error = np.abs(g - r)
        ok = np.isfinite(g) & np.isfinite(r) & (error <= allowed)
        ok |= (np.isnan(g) & np.isnan(r)) | (np.isinf(g) & (g == r))
        if dtype in FLOAT_DTYPES:
            ok |= overflow_excused(dtype, g, r, allowed)
    return g, r, error, ok

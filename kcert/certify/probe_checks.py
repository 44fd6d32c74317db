"""The probe checks: one class each, kept in one ordered registry, :data:`PROBE_CHECKS`.

Every probe is launched twice (run A and run B, see :mod:`kcert.certify.checks`);
what the two launches left behind is the probe's :class:`Evidence`. A
:class:`ProbeCheck` looks at the evidence and returns a :class:`Finding` when
the kernel did something wrong, or None. The pipeline runs every registered
check on every probe, the report lists them in the certificate in registry
order (``CHECK_NAMES``), and a check that no probe fails passes with its
``passes`` text. Adding a check is one class here and one line in
:data:`PROBE_CHECKS`.

Coverage's two findings (elements never written, and elements that kept run
B's plausible stale value) are one check, ``coverage``, as certificates name it:
both say the kernel did not compute an element. What coverage finds is left
out of the other output checks (``unwritten`` and ``stale`` in
:class:`OutputEvidence`), so that each failure names its own cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kcert.certify.elementwise import (
    changed,
    first_index,
    guard_damage,
    lost_specials,
    same_bytes,
    unexpected_specials,
)  # fmt: skip
from kcert.certify.execution import PaddedBuffer
from kcert.certify.spec import BufferArg, Intent
from kcert.certify.tolerance import Allowance

if TYPE_CHECKING:
    # report.py lists the checks by the names registered here, so this module may
    # not import it at run time; ErrorMetrics is only named in annotations
    from kcert.certify.report import ErrorMetrics


@dataclass(frozen=True, slots=True)
class Finding:
    """What one check found wrong on one probe."""

    #: One sentence per buffer at fault, joined by "; ".
    message: str
    #: The buffer of the first element at fault and that element's index; None when
    #: the fault is no element of a buffer (a write outside it).
    buffer: str | None = None
    first_index: tuple[int, ...] | None = None
    #: Per buffer, the figures behind the message (they go into the certificate).
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BufferRuns:
    """One buffer as runs A and B laid it out (guards, fill or input) and as it came back."""

    arg: BufferArg
    #: What each run sent: the ``[guard | data | guard]`` layout before the launch.
    sent: Mapping[str, PaddedBuffer]
    #: What each run got back: the padded array after the launch, same layout.
    got: Mapping[str, np.ndarray[Any, Any]]

    @property
    def name(self) -> str:
        return self.arg.name

    def data(self, run: str) -> np.ndarray[Any, Any]:
        """Run ``run``'s data region after the launch, with the buffer's shape."""
        buf = self.sent[run]
        return self.got[run][buf.guard : buf.guard + buf.size].reshape(buf.shape)


@dataclass(frozen=True, slots=True)
class OutputEvidence:
    """An ``out`` or ``inout`` buffer: its runs, the expected answer, and what was written."""

    runs: BufferRuns
    #: The reference's answer rounded to the output's dtype, and its tolerance.
    reference: np.ndarray[Any, Any]
    allowance: Allowance
    #: Elements that held their run's fill after both runs (``out`` buffers only).
    unwritten: np.ndarray[Any, Any]
    #: Elements that kept run B's plausible stale value where run A computed another.
    stale: np.ndarray[Any, Any]
    #: Run A's output against the reference over the written elements.
    metrics: ErrorMetrics

    @property
    def name(self) -> str:
        return self.runs.name

    @property
    def dtype(self) -> str:
        return self.runs.arg.dtype

    @property
    def written(self) -> np.ndarray[Any, Any]:
        written: np.ndarray[Any, Any] = ~self.unwritten
        return written


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one probe's two launches produced, buffer by buffer, in the kernel's order."""

    #: Every buffer (``in``, ``out`` and ``inout``).
    buffers: tuple[BufferRuns, ...]
    #: The ``out`` and ``inout`` buffers, with what they are judged against.
    outputs: tuple[OutputEvidence, ...]

    @property
    def inputs(self) -> tuple[BufferRuns, ...]:
        return tuple(b for b in self.buffers if b.arg.intent is Intent.IN)


class ProbeCheck(Protocol):
    """One check made on every probe's two launches."""

    @property
    def name(self) -> str:
        """The check's name in the certificate."""

    @property
    def passes(self) -> str:
        """What a pass says, before "on N probe(s)"."""

    @property
    def summary(self) -> str:
        """One sentence on what a pass means, for tools that list the checks (SARIF rules)."""

    @property
    def rank(self) -> int:
        """Where its finding comes when one line names a probe's first failure
        (``fresh-probes``): the lower, the more basic the cause."""

    def find(self, ev: Evidence) -> Finding | None:
        """What is wrong on this probe; None when nothing is."""


def _finding(messages: list[str], details: dict[str, Any],
             first: tuple[str, tuple[int, ...]] | None) -> Finding | None:  # fmt: skip
    if not messages:
        return None
    buffer, index = first if first is not None else (None, None)
    return Finding("; ".join(messages), buffer, index, details)


# A write out of place explains a wrong value, not the other way round: the ranks put
# where the kernel wrote (bounds, inputs, coverage) before what it wrote.


class Bounds:
    """Any guard element whose bytes are not what its run put there was written; the
    farthest such element says how far the overrun went."""

    name = "bounds"
    passes = "no write outside any buffer"
    summary = "Nothing is written outside a buffer (guard bands around every buffer)."
    rank = 0

    def find(self, ev: Evidence) -> Finding | None:
        messages: list[str] = []
        details: dict[str, Any] = {}
        for b in ev.buffers:
            for run in ("A", "B"):
                overrun = guard_damage(b.sent[run], b.got[run])
                if overrun:
                    messages.append(f"'{b.name}' {overrun['text']} (run {run})")
                    details.setdefault(b.name, overrun)
        return _finding(messages, details, None)


class InputIntegrity:
    """``in`` data regions must come back byte for byte, in both runs."""

    name = "input-integrity"
    passes = "inputs unchanged"
    summary = "Input buffers are left unchanged."
    rank = 1

    def find(self, ev: Evidence) -> Finding | None:
        messages: list[str] = []
        details: dict[str, Any] = {}
        first: tuple[str, tuple[int, ...]] | None = None
        for b in ev.inputs:
            for run in ("A", "B"):
                found = changed(b.sent[run].data(), b.data(run))
                if found is None:
                    continue
                count, index = found
                messages.append(f"'{b.name}' has {count} element(s) changed, first at {index} "
                                f"(run {run})")  # fmt: skip
                details.setdefault(b.name, {"changed": count, "first_index": list(index)})
                first = first or (b.name, index)
        return _finding(messages, details, first)


class Coverage:
    """An ``out`` element that holds run A's fill after run A *and* run B's fill after
    run B was never written (the two fills differ in every element, so no value a
    kernel computes looks unwritten in both); an element that keeps run B's stale
    value where run A's output differs kept what it found instead of computing it."""

    name = "coverage"
    passes = "every output element written"
    summary = "Every output element is written (outputs are poisoned before launch)."
    rank = 2

    def find(self, ev: Evidence) -> Finding | None:
        messages: list[str] = []
        details: dict[str, Any] = {}
        first: tuple[str, tuple[int, ...]] | None = None
        for out in ev.outputs:
            if out.unwritten.any():
                count, index = int(out.unwritten.sum()), first_index(out.unwritten)
                messages.append(f"'{out.name}' has {count} of {out.unwritten.size} element(s) "
                                f"never written, first at {index}")  # fmt: skip
                details[out.name] = {"unwritten": count, "first_index": list(index)}
                first = first or (out.name, index)
            if out.stale.any():
                count, index = int(out.stale.sum()), first_index(out.stale)
                messages.append(f"'{out.name}' kept {count} of {out.stale.size} stale element(s) "
                                f"that its buffer held before the launch, first at {index} "
                                "(run B prefilled it with plausible values, as a reused "
                                "allocation holds an earlier call's output)")  # fmt: skip
                details.setdefault(out.name, {}).update(
                    {"kept_stale": count, "first_stale_index": list(index)})
                first = first or (out.name, index)
        return _finding(messages, details, first)


class Determinism:
    """The written output bytes of runs A and B must be equal, so races, reads of
    uninitialised memory, of the guards or of the alignment show up."""

    name = "determinism"
    passes = "identical output bytes across fills, guards and addresses"
    summary = "Outputs are identical across launches with other poison and addresses."
    rank = 3

    def find(self, ev: Evidence) -> Finding | None:
        messages: list[str] = []
        details: dict[str, Any] = {}
        first: tuple[str, tuple[int, ...]] | None = None
        for out in ev.outputs:
            data_a, data_b = out.runs.data("A"), out.runs.data("B")
            differ = out.written & ~out.stale & ~same_bytes(data_a, data_b)
            if differ.any():
                count, index = int(differ.sum()), first_index(differ)
                messages.append(f"'{out.name}' differs between two launches in {count} "
                                f"element(s), first at {index}")  # fmt: skip
                details[out.name] = {"differing": count, "first_index": list(index)}
                first = first or (out.name, index)
        return _finding(messages, details, first)


class SpecialValues:
    """NaN or Inf in run A's output where the reference, rounded to the output dtype,
    has none (an Inf where the exact answer is within tolerance of the dtype's overflow
    threshold is a correct rounding), and the other way round: where the reference is
    NaN or ±Inf (non-finite inputs, ``[kernel.nonfinite]``), the kernel must give the
    same."""

    name = "special-values"
    passes = "NaN and Inf exactly where the reference has them"
    summary = "No NaN or Inf in outputs where the reference has none."
    rank = 4

    def find(self, ev: Evidence) -> Finding | None:
        messages: list[str] = []
        details: dict[str, Any] = {}
        first: tuple[str, tuple[int, ...]] | None = None
        for out in ev.outputs:
            got, ref = out.runs.data("A"), out.reference
            bad = unexpected_specials(out.dtype, got, ref, out.allowance.allowed) & out.written
            if bad.any():
                count, index = int(bad.sum()), first_index(bad)
                value = got[index] if index else got.reshape(())
                messages.append(f"'{out.name}' has {count} NaN/Inf value(s) where the reference "
                                f"has none, first at {index} (got {value}, expected "
                                f"{ref[index]})")  # fmt: skip
                details[out.name] = {"count": count, "first_index": list(index)}
                first = first or (out.name, index)
            lost = lost_specials(out.dtype, got, ref) & out.written
            if lost.any():
                count, index = int(lost.sum()), first_index(lost)
                value = got[index] if index else got.reshape(())
                messages.append(f"'{out.name}' has {count} element(s) where the reference is "
                                f"NaN/Inf and the kernel is not, first at {index} (got {value}, "
                                f"expected {ref[index]})")  # fmt: skip
                details.setdefault(out.name, {}).update(
                    {"lost": count, "first_lost_index": list(index)})
                first = first or (out.name, index)
        return _finding(messages, details, first)


class Correctness:
    """Run A's output against the reference, element by element, with the bounds of
    :mod:`kcert.certify.tolerance`."""

    name = "correctness"
    passes = "every element within tolerance"
    summary = "Every output element is within atol + rtol * |reference| on every probe."
    rank = 5

    def find(self, ev: Evidence) -> Finding | None:
        messages: list[str] = []
        details: dict[str, Any] = {}
        first: tuple[str, tuple[int, ...]] | None = None
        for out in ev.outputs:
            metrics = out.metrics
            if not metrics.bad_count:
                continue
            got, ref, allowance = out.runs.data("A"), out.reference, out.allowance
            index = metrics.first_bad_index or ()
            messages.append(
                f"'{out.name}': {metrics.bad_count} element(s) outside tolerance, first at "
                f"{index} (got {got[index]}, expected {ref[index]}, allowed error "
                f"{float(allowance.allowed[index]):.3g}); max abs error {metrics.max_abs:.3g}, "
                f"max rel {metrics.max_rel:.3g}, max {metrics.max_ulp:.3g} ulp")
            details[out.name] = metrics.to_json() | {"tolerance": allowance.summary()}
            first = first or (out.name, index)
        return _finding(messages, details, first)


#: Every probe check, in the order the certificate lists them.
PROBE_CHECKS: tuple[ProbeCheck, ...] = (
    Correctness(),
    Coverage(),
    Bounds(),
    InputIntegrity(),
    Determinism(),
    SpecialValues(),
)
PROBE_CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in PROBE_CHECKS)

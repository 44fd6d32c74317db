"""The check of one sampled call, on the guard's worker thread.

It is the certification's own correctness check applied to production's
inputs: the spec's reference evaluated on the copies of the inputs taken
before the call (:class:`kcert.certify.reference.Reference`), the tolerance of
:mod:`kcert.certify.tolerance` (a ``[kernel.tolerance]`` entry, or the error
model the certificate was judged by), and :func:`kcert.certify.checks.compare`
element by element. Nothing here re-implements them, so a call the guard
flags is one the certifier would have failed.

A mismatch keeps the anchors (:mod:`kcert.certify.anchors`) of the inputs, of
the kernel's outputs and of the reference's outputs in the output dtype, the
largest error and the largest ratio of error to the allowed error, and the
inputs themselves while they fit the evidence cap, so that the registry can
recompute the anchors and anyone can replay the call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kcert.certify.anchors import anchor, canonical_array
from kcert.certify.checks import compare
from kcert.certify.executors.base import host_dtype
from kcert.certify.reference import Reference
from kcert.certify.spec import Launch
from kcert.certify.tolerance import allowances
from kcert.guard import arrays
from kcert.guard.binding import CertifiedKernel


@dataclass(frozen=True, slots=True)
class Sample:
    """What the caller's thread hands over: the call's copies and what it already knows."""

    at: str  # RFC 3339, UTC
    dims: Mapping[str, int]
    launch: Launch
    inputs: Mapping[str, Any]  # snapshots taken before the call
    outputs: Mapping[str, Any]  # snapshots taken after it
    reasons: tuple[str, ...]  # why the call's shapes or scalars are outside the scope


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A checked call whose outputs are outside the tolerance."""

    at: str
    dims: Mapping[str, int]
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    reference: Mapping[str, str]
    max_error: float
    max_ratio: float
    in_scope: bool
    reasons: tuple[str, ...]
    #: The inputs (as the kernel got them), or None when they exceed the evidence cap.
    evidence: Mapping[str, np.ndarray[Any, Any]] | None


@dataclass(frozen=True, slots=True)
class Outcome:
    in_scope: bool
    reasons: tuple[str, ...]
    mismatch: Mismatch | None


class Checker:
    """Checks samples of one certified kernel; ``evidence_cap`` bounds the inputs kept."""

    def __init__(self, kernel: CertifiedKernel, *, evidence_cap: int) -> None:
        self.kernel = kernel
        self.reference = Reference(kernel.kernel)
        self.evidence_cap = evidence_cap

    def check(self, sample: Sample) -> Outcome:
        spec, launch = self.kernel.kernel, sample.launch
        inputs = {name: arrays.to_host(v) for name, v in sample.inputs.items()}
        got = {name: arrays.to_host(v) for name, v in sample.outputs.items()}
        reasons = list(sample.reasons)
        reasons += self.kernel.value_reasons(launch, inputs)
        for buf in spec.buffers:
            if buf.name in inputs and inputs[buf.name].dtype != host_dtype(buf.dtype):
                reasons.append(f"'{buf.name}' is {inputs[buf.name].dtype}, the spec says "
                               f"{buf.dtype}")  # fmt: skip

        expected = self.reference(inputs, launch, probe=f"guarded call {dict(sample.dims)}")

        def call(values: Mapping[str, np.ndarray[Any, Any]]) -> Mapping[str, np.ndarray[Any, Any]]:
            return self.reference(values, launch, probe="guarded call")

        def call_float32(values: Mapping[str, np.ndarray[Any, Any]],
                         ) -> tuple[Mapping[str, np.ndarray[Any, Any]], bool]:  # fmt: skip
            return self.reference.call_float32(values, launch, probe="guarded call")

        bounds = allowances(spec, call, inputs, expected, sample.dims, float32=call_float32)
        worst_error, worst_ratio, bad = 0.0, 0.0, False
        rounded: dict[str, np.ndarray[Any, Any]] = {}
        for out in spec.outputs:
            with np.errstate(all="ignore"):
                ref = np.asarray(expected[out.name]).astype(host_dtype(out.dtype))
            rounded[out.name] = ref
            mine = got.get(out.name)
            if mine is None or mine.size != ref.size:
                reasons.append(f"output '{out.name}' is missing or has the wrong size")
                worst_error = worst_ratio = math.inf
                bad = True
                continue
            mine = mine.reshape(ref.shape)
            metrics = compare(out.dtype, mine, ref, bounds[out.name])
            if metrics.bad_count:
                bad = True
                worst_error = max(worst_error, metrics.max_abs)
                worst_ratio = max(worst_ratio, _ratio(mine, ref, bounds[out.name].allowed))
        in_scope = not reasons
        if not bad:
            return Outcome(in_scope, tuple(reasons), None)
        size = sum(v.nbytes for v in inputs.values())
        evidence = {n: canonical_array(v) for n, v in inputs.items()} \
            if size <= self.evidence_cap else None
        mismatch = Mismatch(
            at=sample.at, dims=dict(sample.dims),
            inputs={n: str(anchor(v)) for n, v in inputs.items()},
            outputs={n: str(anchor(v)) for n, v in got.items()},
            reference={n: str(anchor(v)) for n, v in rounded.items()},
            max_error=worst_error, max_ratio=worst_ratio, in_scope=in_scope,
            reasons=tuple(reasons), evidence=evidence)  # fmt: skip
        return Outcome(in_scope, tuple(reasons), mismatch)


def _ratio(got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any],
           allowed: np.ndarray[Any, Any]) -> float:  # fmt: skip
    """The largest ``|got - ref| / allowed``; inf where a non-finite value differs."""
    with np.errstate(all="ignore"):
        g, r = got.astype(np.float64), ref.astype(np.float64)
        error = np.abs(g - r)
        same_special = (np.isnan(g) & np.isnan(r)) | (np.isinf(g) & (g == r))
        ratio = error / np.broadcast_to(allowed, g.shape)
        ratio = np.where(same_special | (error == 0), 0.0, ratio)
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
    return float(ratio.max()) if ratio.size else 0.0

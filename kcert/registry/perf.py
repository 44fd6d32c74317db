"""Latency per (target, kernel): the store, percentiles with bootstrap intervals, comparisons.

Two sources feed one store: samples ingested from traces (``kcert perf
ingest``, ``POST /v1/perf``; one row per kernel event) and the histograms of
``kcert.guard`` reports (``POST /v1/observations``). A histogram's count is
taken at its bucket's upper bound (the overflow bucket at the last bound), so
percentiles from histograms are upper estimates to bucket resolution.

Percentiles are NumPy's (``linear``); their confidence intervals come from a
seeded bootstrap (resampling with replacement), so the same data and seed give
the same interval. :func:`latency_inputs` records what the promotion policy's
latency half needs (:mod:`kcert.registry.runtime_policy`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel
from sqlalchemy import insert
from sqlmodel import Session, col, select

from kcert.digest import Digest
from kcert.registry.errors import InvalidInput, NotFound
from kcert.registry.models import Certificate, Promotion, PromotionStatus, Target, utcnow
from kcert.registry.observation_models import (
    LatencyHistogramRow,
    LatencySample,
    PerfIngest,
    PerfIngested,
    TargetPolicy,
)
from kcert.registry.runtime_policy import LatencyInputs

PERCENTILES = (50.0, 95.0, 99.0)
#: Values resampled per bootstrap round at most (larger sets are subsampled once, seeded).
MAX_BOOTSTRAP_VALUES = 200_000
#: The quantiles a comparison carries of each distribution: every half percent.
CDF_LEVELS = tuple(i / 2 for i in range(201))
#: Samples read for one (target, kernel) at most.
MAX_VALUES = 2_000_000

_sample = LatencySample.__table__  # type: ignore[attr-defined]


def ingest_samples(*, session: Session, ingest: PerfIngest) -> PerfIngested:
    """Store a batch of samples for (target, kernel); the same batch twice is stored once."""
    kernel = str(Digest.parse(ingest.kernel))
    if session.get(Target, ingest.target) is None:
        raise NotFound(f"no target {ingest.target!r}")
    batch = str(Digest.of_json({"kernel": kernel, "target": ingest.target,
                                "samples": [s.model_dump() for s in ingest.samples]}))  # fmt: skip
    known = session.exec(select(LatencySample.id).where(LatencySample.batch == batch)).first()
    if known is not None:
        return PerfIngested(kernel=kernel, target=ingest.target, stored=0, duplicate=True,
                            batch=batch)  # fmt: skip

    now = utcnow()
    session.connection().execute(insert(_sample), [
        {"kernel": kernel, "target_name": ingest.target, "name": s.name[:256],
         "dur_us": s.dur_us, "batch": batch, "recorded_at": now}
        for s in ingest.samples
    ])  # fmt: skip
    session.commit()
    return PerfIngested(kernel=kernel, target=ingest.target, stored=len(ingest.samples),
                        duplicate=False, batch=batch)  # fmt: skip


def latency_values(session: Session, *, target: str, kernel: str) -> np.ndarray[Any, Any]:
    """Every latency (microseconds) known for ``kernel`` on ``target``."""
    durations = session.exec(
        select(LatencySample.dur_us)
        .where(LatencySample.target_name == target, LatencySample.kernel == kernel)
        .limit(MAX_VALUES)
    ).all()
    parts = [np.asarray(durations, dtype=np.float64)]
    histograms = session.exec(
        select(LatencyHistogramRow)
        .where(LatencyHistogramRow.target_name == target, LatencyHistogramRow.kernel == kernel)
        .order_by(col(LatencyHistogramRow.id))
    ).all()
    budget = MAX_VALUES - parts[0].size
    for h in histograms:
        at = np.asarray([*h.bounds, h.bounds[-1]], dtype=np.float64)
        counts = np.asarray(h.counts, dtype=np.float64)
        total = float(counts.sum())
        if total > budget:
            # A report may claim 2**53 calls: keep its shape, never its size, in memory.
            counts = np.floor(counts * (budget / total))
        expanded = np.repeat(at, counts.astype(np.int64))
        budget -= expanded.size
        parts.append(expanded)
        if budget <= 0:
            break
    return np.concatenate(parts)


class Percentile(BaseModel):
    q: float
    value_us: float
    low_us: float
    high_us: float


class LatencySummary(BaseModel):
    kernel: str
    samples: int
    percentiles: list[Percentile]
    #: The distribution: quantiles at 0, 0.5, ..., 100% (what the HTML page's CDF draws).
    quantiles_us: list[float] = []


class PercentileChange(BaseModel):
    q: float
    change_pct: float
    low_pct: float
    high_pct: float


class PerfComparison(BaseModel):
    target: str
    before: LatencySummary
    after: LatencySummary
    changes: list[PercentileChange]
    confidence: float
    resamples: int
    seed: int


def _boot(
    values: np.ndarray[Any, Any], rng: np.random.Generator, resamples: int
) -> np.ndarray[Any, Any]:
    """Bootstrap percentiles: shape (resamples, len(PERCENTILES))."""
    if values.size > MAX_BOOTSTRAP_VALUES:
        values = rng.choice(values, MAX_BOOTSTRAP_VALUES, replace=False)
    out = np.empty((resamples, len(PERCENTILES)))
    for i in range(resamples):
        out[i] = np.percentile(rng.choice(values, values.size, replace=True), PERCENTILES)
    return out


def _summary(kernel: str, values: np.ndarray[Any, Any], boot: np.ndarray[Any, Any],
             alpha: float) -> LatencySummary:  # fmt: skip
    point = np.percentile(values, PERCENTILES)
    low = np.percentile(boot, 100 * alpha / 2, axis=0)
    high = np.percentile(boot, 100 * (1 - alpha / 2), axis=0)
    return LatencySummary(kernel=kernel, samples=int(values.size), percentiles=[
        Percentile(q=q, value_us=float(p), low_us=float(lo), high_us=float(hi))
        for q, p, lo, hi in zip(PERCENTILES, point, low, high, strict=True)
    ], quantiles_us=[float(v) for v in np.percentile(values, CDF_LEVELS)])  # fmt: skip


def compare(*, session: Session, target: str, before: str, after: str, seed: int = 0,
            resamples: int = 1000, confidence: float = 0.95) -> PerfComparison:  # fmt: skip
    """p50/p95/p99 of two kernels on one target, with intervals, and the change of each."""
    if session.get(Target, target) is None:
        raise NotFound(f"no target {target!r}")
    if not 0 < confidence < 1 or not 10 <= resamples <= 100_000:
        raise InvalidInput("confidence is in (0, 1) and resamples in 10..100000")
    kernels = [str(Digest.parse(before)), str(Digest.parse(after))]
    values = [latency_values(session, target=target, kernel=k) for k in kernels]
    for k, v in zip(kernels, values, strict=True):
        if v.size == 0:
            raise InvalidInput(f"no latency samples of {k} on target {target!r}; ingest a "
                               "trace (kcert perf ingest) or send guard reports")  # fmt: skip
    return compare_values(target, (kernels[0], values[0]), (kernels[1], values[1]), seed=seed,
                          resamples=resamples, confidence=confidence)  # fmt: skip


def compare_values(target: str, before: tuple[str, np.ndarray[Any, Any]],
                   after: tuple[str, np.ndarray[Any, Any]], *, seed: int = 0,
                   resamples: int = 1000, confidence: float = 0.95) -> PerfComparison:  # fmt: skip
    """The comparison of two sets of latencies (µs), each named by its kernel; pure."""
    kernels, values = [before[0], after[0]], [before[1], after[1]]
    rng = np.random.default_rng(seed)
    boots = [_boot(v, rng, resamples) for v in values]
    alpha = 1 - confidence
    point = [np.percentile(v, PERCENTILES) for v in values]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (boots[1] - boots[0]) / boots[0] * 100
        change = (point[1] - point[0]) / point[0] * 100
    changes = [
        PercentileChange(q=q, change_pct=float(c),
                         low_pct=float(np.nanpercentile(r, 100 * alpha / 2)),
                         high_pct=float(np.nanpercentile(r, 100 * (1 - alpha / 2))))
        for q, c, r in zip(PERCENTILES, change, ratio.T, strict=True)
    ]  # fmt: skip
    return PerfComparison(
        target=target, before=_summary(kernels[0], values[0], boots[0], alpha),
        after=_summary(kernels[1], values[1], boots[1], alpha), changes=changes,
        confidence=confidence, resamples=resamples, seed=seed,
    )  # fmt: skip


def implied_replaces(session: Session, *, target: str, kernel: str) -> str | None:
    """The kernel a promotion that names none replaces: the target's active promotion of a
    kernel of the same name (the certificates' ``kernel_name``), the latest granted.

    By name, because one target runs many kernels: without it a saxpy would be held to a
    matmul's p99. None when the target runs no other kernel of that name.
    """
    names = select(Certificate.kernel_name).where(Certificate.source_digest == kernel)
    row = session.exec(
        select(Promotion.kernel)
        .join(Certificate, col(Certificate.id) == col(Promotion.certificate_id))
        .where(Promotion.target_name == target, Promotion.status == PromotionStatus.ACTIVE,
               Promotion.kernel != kernel, col(Certificate.kernel_name).in_(names))
        .order_by(col(Promotion.granted_at).desc(), col(Promotion.id).desc())
    ).first()  # fmt: skip
    return str(row) if row is not None else None


def latency_inputs(
    session: Session, *, target: str, kernel: str, replaces: str, implied: bool = False
) -> LatencyInputs | None:
    """The latency half of a promotion's inputs, when the target's policy sets a limit."""
    policy = session.get(TargetPolicy, target)
    if policy is None or policy.max_p99_regression_pct is None:
        return None
    before = latency_values(session, target=target, kernel=replaces)
    after = latency_values(session, target=target, kernel=kernel)

    def p99(v: np.ndarray[Any, Any]) -> float | None:
        return float(np.percentile(v, 99.0)) if v.size else None

    return LatencyInputs(
        replaces=replaces, replaces_from="active promotion" if implied else "request",
        max_p99_regression_pct=policy.max_p99_regression_pct,
        min_samples=policy.min_samples, before_p99_us=p99(before),
        before_samples=int(before.size), after_p99_us=p99(after), after_samples=int(after.size),
    )  # fmt: skip

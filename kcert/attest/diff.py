"""What changed between two certificates of a kernel, and whether it got worse.

The comparison reads only the signed predicates: numerical error per probe
(matched by probe id and input anchors: the same inputs, byte for byte; a
fresh probe of the same size drawn from another seed is another probe, whose
error says nothing about this one's), compiled-artifact resources, timing, environment,
verdict and check statuses. "B regressed from A" is a fixed list of rules,
each with a stated threshold, so that a CI job failing on it can say why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kcert.attest.certificate import CertificateContents

ERROR_METRICS: tuple[str, ...] = ("max_abs", "max_rel", "max_ulp")
#: Resource counters where more is worse.
ARTIFACT_FIELDS: tuple[str, ...] = (
    "registers", "spill_stores", "spill_loads", "local_bytes", "stack_bytes", "shared_bytes",
)  # fmt: skip
_ARTIFACT_REGRESSIONS = frozenset({"registers", "spill_stores", "spill_loads", "local_bytes"})
DEFAULT_ERROR_GROWTH = 0.10
DEFAULT_SLOWDOWN = 0.10
#: Error growth smaller than this fraction of the output's atol is noise, not a regression.
ERROR_NOISE_FRACTION_OF_ATOL = 0.01


@dataclass(frozen=True, slots=True)
class Thresholds:
    """How much worse B may be than A before it counts as a regression."""

    #: Max abs error may grow by this fraction (0.1 = 10%) ...
    error_growth: float = DEFAULT_ERROR_GROWTH
    #: ... and the kernel's median time by this fraction.
    slowdown: float = DEFAULT_SLOWDOWN


@dataclass(frozen=True, slots=True)
class Change:
    """One value that differs; ``None`` on a side means absent there."""

    field: str
    a: Any
    b: Any

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "a": self.a, "b": self.b}


@dataclass(frozen=True, slots=True)
class NumberDelta:
    field: str
    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        if self.a is None or self.b is None or not _finite(self.a) or not _finite(self.b):
            return None
        return self.b - self.a

    @property
    def ratio(self) -> float | None:
        if self.delta is None or not self.a:
            return None
        return self.b / self.a if self.b is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "field": self.field, "a": _json_number(self.a), "b": _json_number(self.b),
            "delta": self.delta, "ratio": self.ratio,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class ErrorDelta:
    probe: str
    output: str
    metric: str
    a: float
    b: float

    @property
    def delta(self) -> float | None:
        return self.b - self.a if _finite(self.a) and _finite(self.b) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": self.probe, "output": self.output, "metric": self.metric,
            "a": _json_number(self.a), "b": _json_number(self.b), "delta": self.delta,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Regression:
    kind: str  # verdict | check | error | artifact | timing
    message: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True, slots=True)
class CertificateDiff:
    a_id: str
    b_id: str
    thresholds: Thresholds
    kernel: tuple[Change, ...]
    verdict: Change | None
    checks: tuple[Change, ...]
    errors: tuple[ErrorDelta, ...]
    probes_only_in_a: tuple[str, ...]
    probes_only_in_b: tuple[str, ...]
    artifact: tuple[NumberDelta, ...]
    timing: tuple[NumberDelta, ...]
    environment: tuple[Change, ...]
    regressions: tuple[Regression, ...] = field(default=())

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a_id,
            "b": self.b_id,
            "thresholds": {
                "error_growth": self.thresholds.error_growth,
                "slowdown": self.thresholds.slowdown,
            },
            "kernel": [c.to_json() for c in self.kernel],
            "verdict": self.verdict.to_json() if self.verdict else None,
            "checks": [c.to_json() for c in self.checks],
            "errors": [e.to_json() for e in self.errors],
            "probes_only_in_a": list(self.probes_only_in_a),
            "probes_only_in_b": list(self.probes_only_in_b),
            "artifact": [d.to_json() for d in self.artifact],
            "timing": [d.to_json() for d in self.timing],
            "environment": [c.to_json() for c in self.environment],
            "regressed": self.regressed,
            "regressions": [r.to_json() for r in self.regressions],
        }


def diff_certificates(
    a: CertificateContents, b: CertificateContents, thresholds: Thresholds | None = None
) -> CertificateDiff:
    limits = thresholds or Thresholds()
    pa, pb = a.predicate, b.predicate
    errors, only_a, only_b = _error_deltas(pa["probes"]["items"], pb["probes"]["items"])
    verdict = Change("verdict", pa["verdict"], pb["verdict"]) if a.verdict != b.verdict else None
    result = CertificateDiff(
        a_id=str(a.id),
        b_id=str(b.id),
        thresholds=limits,
        kernel=tuple(_kernel_changes(pa["kernel"], pb["kernel"])),
        verdict=verdict,
        checks=tuple(_check_changes(pa["checks"], pb["checks"])),
        errors=tuple(errors),
        probes_only_in_a=tuple(only_a),
        probes_only_in_b=tuple(only_b),
        artifact=tuple(_artifact_deltas(pa["kernel"], pb["kernel"])),
        timing=tuple(_timing_deltas(pa["timing"], pb["timing"])),
        environment=tuple(_environment_changes(pa, pb)),
    )
    regressions = _regressions(result, pa, pb, same_hw=a.hw_class == b.hw_class)
    return CertificateDiff(**{**_fields(result), "regressions": tuple(regressions)})


def _fields(value: CertificateDiff) -> dict[str, Any]:
    return {name: getattr(value, name) for name in CertificateDiff.__dataclass_fields__}


def _kernel_changes(ka: Mapping[str, Any], kb: Mapping[str, Any]) -> list[Change]:
    out = [
        Change(f"kernel.{key}", ka.get(key), kb.get(key))
        for key in ("name", "entry", "language", "source", "source_digest", "spec_digest",
                    "reference_digest")  # fmt: skip
        if ka.get(key) != kb.get(key)
    ]
    ba, bb = ka.get("build") or {}, kb.get("build") or {}
    for key in ("compiler", "arch", "options", "cubin_digest"):
        if ba.get(key) != bb.get(key):
            out.append(Change(f"kernel.build.{key}", ba.get(key), bb.get(key)))
    return out


def _check_changes(ca: list[Any], cb: list[Any]) -> list[Change]:
    sa = {c["name"]: c["status"] for c in ca}
    sb = {c["name"]: c["status"] for c in cb}
    names = [*sa, *(n for n in sb if n not in sa)]
    return [Change(n, sa.get(n), sb.get(n)) for n in names if sa.get(n) != sb.get(n)]


def _error_deltas(
    items_a: list[Any], items_b: list[Any]
) -> tuple[list[ErrorDelta], list[str], list[str]]:
    """Error deltas of the probes both certificates ran on the same inputs, and the others."""
    by_key_b = {_probe_key(p): p for p in items_b}
    keys_a = {_probe_key(p) for p in items_a}
    out: list[ErrorDelta] = []
    for probe in items_a:
        other = by_key_b.get(_probe_key(probe))
        if other is None:
            continue
        for output, ma in probe["metrics"].items():
            mb = other["metrics"].get(output)
            if mb is None:
                continue
            out.extend(
                ErrorDelta(probe["id"], output, m, _number(ma[m]), _number(mb[m]))
                for m in ERROR_METRICS
            )
    only_a = [p["id"] for p in items_a if _probe_key(p) not in by_key_b]
    only_b = [p["id"] for p in items_b if _probe_key(p) not in keys_a]
    return out, only_a, only_b


def _probe_key(probe: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A probe's id and its inputs' anchors: two probes compare only on the same bytes."""
    return str(probe["id"]), tuple(sorted((probe.get("inputs") or {}).items()))


def _artifact_deltas(ka: Mapping[str, Any], kb: Mapping[str, Any]) -> list[NumberDelta]:
    ra = (ka.get("build") or {}).get("resources") or {}
    rb = (kb.get("build") or {}).get("resources") or {}
    if not ra and not rb:
        return []
    return [NumberDelta(f, ra.get(f), rb.get(f)) for f in ARTIFACT_FIELDS]


def _timing_deltas(ta: Mapping[str, Any], tb: Mapping[str, Any]) -> list[NumberDelta]:
    out: list[NumberDelta] = []
    for side in ("kernel", "baseline"):
        sa, sb = ta.get(side) or {}, tb.get(side) or {}
        if sa or sb:
            out.extend(
                NumberDelta(f"{side}.{f}", sa.get(f), sb.get(f)) for f in ("median_ms", "p99_ms")
            )
    if ta.get("speedup") is not None or tb.get("speedup") is not None:
        out.append(NumberDelta("speedup", ta.get("speedup"), tb.get("speedup")))
    return out


def _environment_changes(pa: Mapping[str, Any], pb: Mapping[str, Any]) -> list[Change]:
    out = [
        Change(f"hardware.{k}", pa["hardware"][k], pb["hardware"][k])
        for k in ("class", "executor")
        if pa["hardware"][k] != pb["hardware"][k]
    ]
    ea, eb = pa["environment"], pb["environment"]
    if ea["fingerprint"] != eb["fingerprint"]:
        out.append(Change("fingerprint", ea["fingerprint"], eb["fingerprint"]))
    fa, fb = ea["fields"], eb["fields"]
    keys = [*fa, *(k for k in fb if k not in fa)]
    out.extend(Change(f"environment.{k}", fa.get(k), fb.get(k)) for k in keys
               if fa.get(k) != fb.get(k))  # fmt: skip
    return out


def _regressions(
    diff: CertificateDiff, pa: Mapping[str, Any], pb: Mapping[str, Any], *, same_hw: bool
) -> list[Regression]:
    limits = diff.thresholds
    out: list[Regression] = []
    if diff.verdict is not None and diff.verdict.b == "fail":
        out.append(Regression("verdict", "the verdict went from pass to fail"))
    out.extend(
        Regression("check", f"check {c.field} passed in A and fails in B")
        for c in diff.checks
        if c.a == "pass" and c.b == "fail"
    )
    atol_b = _atols(pb["probes"]["items"])
    for e in diff.errors:
        if e.metric != "max_abs":
            continue
        noise = ERROR_NOISE_FRACTION_OF_ATOL * atol_b.get((e.probe, e.output), 0.0)
        grew_to_nan = math.isnan(e.b) and not math.isnan(e.a)
        grew = e.b > e.a * (1 + limits.error_growth) and e.b - e.a > noise
        if grew_to_nan or grew:
            out.append(Regression(
                "error",
                f"probe {e.probe} output {e.output}: max abs error grew from {e.a:.3g} to "
                f"{e.b:.3g} (more than {limits.error_growth:.0%})",
            ))  # fmt: skip
    for d in diff.artifact:
        if d.field in _ARTIFACT_REGRESSIONS and d.delta is not None and d.delta > 0:
            out.append(Regression("artifact", f"{d.field} grew from {d.a:g} to {d.b:g}"))
    median = next((d for d in diff.timing if d.field == "kernel.median_ms"), None)
    # Times from different hardware classes say nothing about the kernel.
    if same_hw and median is not None and median.ratio is not None:
        if median.ratio > 1 + limits.slowdown:
            out.append(Regression(
                "timing",
                f"kernel median time grew from {median.a:.4g} ms to {median.b:.4g} ms "
                f"({median.ratio - 1:.0%} slower; threshold {limits.slowdown:.0%})",
            ))  # fmt: skip
    return out


def _atols(items: list[Any]) -> dict[tuple[str, str], float]:
    return {
        (p["id"], output): float(m["atol"]) for p in items for output, m in p["metrics"].items()
    }


def _number(value: Any) -> float:
    # The predicate writes nan and infinities as strings; float() reads both forms.
    return float(value)


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _json_number(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")

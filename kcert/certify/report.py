"""Typed results of a certification: what the checks found and what gets signed.

These frozen values are the contract between the certifier (which fills them)
and the attestation layer (which turns :meth:`CertificationReport.predicate`
into a signed in-toto statement). No untyped dicts, no sentinel numbers: a
figure that was not measured is ``None`` with a reason beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

PREDICATE_TYPE = "https://kcert.dev/kernel-certificate/v1"

if TYPE_CHECKING:
    #: Every check (docs/checks.md), in the order they are reported.
    CHECK_NAMES: tuple[str, ...]


def __getattr__(name: str) -> tuple[str, ...]:
    """``CHECK_NAMES``, built on first use from the probe checks' registry.

    Lazy because the probe checks import NumPy, and ``kcert verify`` and ``gate``
    read reports and certificates without it (``tests/cli/test_startup.py``).
    """
    if name != "CHECK_NAMES":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from kcert.certify.probe_checks import PROBE_CHECK_NAMES  # lazy: see above

    names = ("build", "artifact", "launch", *PROBE_CHECK_NAMES, "fresh-probes", "timing",
             "sanitizer")  # fmt: skip
    globals()["CHECK_NAMES"] = names
    return names


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    status: Status
    message: str
    #: Probe id (e.g. ``"n=33"``) of the first failing probe, when there is one.
    probe: str | None = None
    required: bool = True
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": str(self.status),
            "probe": self.probe,
            "message": self.message,
            "required": self.required,
            "details": dict(self.details),
        }


@dataclass(frozen=True, slots=True)
class ScopeNote:
    """Something this certification could not show, and why (:mod:`kcert.certify.scope`)."""

    kind: str  # "values" or "executor"
    message: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


#: Profile levels, one character per bin (``ErrorProfile.levels``), in base64url order.
PROFILE_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
#: Level of a bin whose largest error/allowed ratio is exactly 1 (the last passing level).
PROFILE_BOUND_LEVEL = 48
#: Levels per decade of the ratio.
PROFILE_STEPS_PER_DECADE = 4
#: Level of a bin holding a failure with no finite ratio: NaN, Inf, or never written.
PROFILE_NONFINITE_LEVEL = 63


@dataclass(frozen=True, slots=True)
class ErrorProfile:
    """Where one output's error falls, as its error/allowed ratio over a coarse grid of bins.

    The output is viewed as ``extent`` elements: ``(n,)`` when it has one axis longer
    than 1, else ``(rows, cols)`` with every axis but the last folded into rows. Bin
    ``i`` of an axis of ``e`` elements in ``b`` bins covers ``[i*e//b, (i+1)*e//b)``.
    ``levels`` holds one character per bin, row-major, each a level of
    :data:`PROFILE_ALPHABET` for the bin's largest ``|got - ref| / allowed``:
    0 every element exact; ``k`` in 1..62 a ratio in
    ``(10**((k-49)/4), 10**((k-48)/4)]`` (1 and 62 also hold everything beyond them);
    63 a failure with no finite ratio. Levels above 48 are failures, and every
    failing element puts its bin above 48.
    """

    extent: tuple[int, ...]
    bins: tuple[int, ...]
    levels: str

    def to_json(self) -> dict[str, Any]:
        return {"extent": list(self.extent), "shape": list(self.bins), "levels": self.levels}


@dataclass(frozen=True, slots=True)
class ErrorMetrics:
    """How far one output of one probe is from the reference."""

    max_abs: float
    max_rel: float
    max_ulp: float
    bad_count: int
    first_bad_index: tuple[int, ...] | None
    atol: float
    rtol: float
    #: Where the error falls; None where it was not recorded (older certificates).
    profile: ErrorProfile | None = None

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.profile is None else {"profile": self.profile.to_json()}
        return extra | {
            "max_abs": _finite(self.max_abs),
            "max_rel": _finite(self.max_rel),
            "max_ulp": _finite(self.max_ulp),
            "bad_count": self.bad_count,
            "first_bad_index": list(self.first_bad_index) if self.first_bad_index else None,
            "atol": self.atol,
            "rtol": self.rtol,
        }


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """One probe: its shape, seed and the anchors of everything that went in and came out."""

    id: str
    kind: str  # "fixed" or "fresh"
    seed: int
    dims: Mapping[str, int]
    inputs: Mapping[str, str]
    reference: Mapping[str, str]
    outputs: Mapping[str, str]
    metrics: Mapping[str, ErrorMetrics]
    #: The drawn conditions of its two launches (``RunConditions.to_json`` by run).
    conditions: Mapping[str, Mapping[str, int]] | None = None

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.conditions is None else {
            "conditions": {k: dict(v) for k, v in self.conditions.items()}}
        return extra | {
            "id": self.id,
            "kind": self.kind,
            "seed": self.seed,
            "dims": dict(self.dims),
            "inputs": dict(self.inputs),
            "reference": dict(self.reference),
            "outputs": dict(self.outputs),
            "metrics": {k: m.to_json() for k, m in self.metrics.items()},
        }


@dataclass(frozen=True, slots=True)
class Resources:
    """What ptxas reported for the compiled kernel."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int
    const_bytes: int
    local_bytes: int
    barriers: int

    def to_json(self) -> dict[str, int]:
        return {
            "registers": self.registers,
            "spill_stores": self.spill_stores,
            "spill_loads": self.spill_loads,
            "stack_bytes": self.stack_bytes,
            "shared_bytes": self.shared_bytes,
            "const_bytes": self.const_bytes,
            "local_bytes": self.local_bytes,
            "barriers": self.barriers,
        }


@dataclass(frozen=True, slots=True)
class BuildRecord:
    compiler: str  # e.g. "nvrtc 13.5"
    arch: str
    options: tuple[str, ...]
    ptx_digest: str
    cubin_digest: str
    resources: Resources | None

    def to_json(self) -> dict[str, Any]:
        return {
            "compiler": self.compiler,
            "arch": self.arch,
            "options": list(self.options),
            "ptx_digest": self.ptx_digest,
            "cubin_digest": self.cubin_digest,
            "resources": self.resources.to_json() if self.resources else None,
        }


@dataclass(frozen=True, slots=True)
class TimingResult:
    """One timed callable: unit-suffixed fields, never a sentinel that could pass for a time."""

    median_ms: float
    p99_ms: float
    min_ms: float
    cv: float
    runs: int

    def to_json(self) -> dict[str, Any]:
        return {
            "median_ms": self.median_ms,
            "p99_ms": self.p99_ms,
            "min_ms": self.min_ms,
            "cv": self.cv,
            "runs": self.runs,
        }


@dataclass(frozen=True, slots=True)
class TimingReport:
    method: str
    kernel: TimingResult | None
    baseline: TimingResult | None
    speedup: float | None
    lower_bound_ms: float | None
    skipped_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "kernel": self.kernel.to_json() if self.kernel else None,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "speedup": self.speedup,
            "lower_bound_ms": self.lower_bound_ms,
            "skipped_reason": self.skipped_reason,
        }


@dataclass(frozen=True, slots=True)
class KernelIdentity:
    name: str
    entry: str
    language: str  # "cuda" | "triton"
    source_name: str
    source_digest: str
    spec_digest: str
    reference_digest: str
    build: BuildRecord | None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "entry": self.entry,
            "language": self.language,
            "source": self.source_name,
            "source_digest": self.source_digest,
            "spec_digest": self.spec_digest,
            "reference_digest": self.reference_digest,
            "build": self.build.to_json() if self.build else None,
        }


@dataclass(frozen=True, slots=True)
class CertificationReport:
    kernel: KernelIdentity
    executor: str
    hw_class: str
    environment: Mapping[str, Any]
    fingerprint: str
    fresh_seed: int
    probes: tuple[ProbeRecord, ...]
    checks: tuple[CheckResult, ...]
    timing: TimingReport
    #: Smallest failing shape per failing check, after minimization.
    minimized: Mapping[str, Mapping[str, int]]
    certifier_version: str
    issued_at: str  # RFC 3339, UTC
    #: How the kernel was confined (``kcert.certify.jail.Confinement.to_json``); None only in
    #: reports made before kcert recorded it.
    confinement: Mapping[str, Any] | None = None
    #: Why minimization of a check stopped before it finished (check -> reason); the
    #: shape in ``minimized`` is then the smallest failing one found until then.
    minimize_stopped: Mapping[str, str] = field(default_factory=dict)
    #: What the probes could not exercise (value domains, the executor): notes, not checks.
    scope_notes: tuple[ScopeNote, ...] = ()
    #: Value families of each input buffer's probes (``kcert.certify.probes.value_families``).
    value_families: Mapping[str, Sequence[str]] | None = None
    #: Per dim, the sizes certified (``kcert.certify.sizes.shape_scope``); None only in
    #: reports made before kcert drew sizes.
    shape_scope: Mapping[str, Mapping[str, Any]] | None = None
    #: The most elements one buffer held in any probe (``kcert.certify.sizes.largest_elements``).
    largest_elements: int | None = None
    #: How each probe's buffer contents and addresses were drawn (``kcert.certify.conditions``).
    conditions: str | None = None

    @property
    def verdict(self) -> Verdict:
        failed = any(c.required and c.status is Status.FAIL for c in self.checks)
        return Verdict.FAIL if failed else Verdict.PASS

    def first_failure(self) -> CheckResult | None:
        return next((c for c in self.checks if c.status is Status.FAIL), None)

    def feedback(self) -> str:
        """What failed, on which smallest shape and by how much, as text for a model or a
        person to act on (:mod:`kcert.certify.feedback`); one line when it passed."""
        # lazy: kcert.certify.feedback imports this module back (a cycle inside the package)
        from kcert.certify.feedback import report_feedback

        return report_feedback(self)

    def predicate(self) -> dict[str, Any]:
        """The in-toto predicate (``PREDICATE_TYPE``) this report is signed as."""
        return {
            "kernel": self.kernel.to_json(),
            "hardware": {"class": self.hw_class, "executor": self.executor},
            "environment": {"fields": dict(self.environment), "fingerprint": self.fingerprint},
            "probes": {
                "fresh_seed": self.fresh_seed,
                "items": [p.to_json() for p in self.probes],
                **({"value_families": {k: list(v) for k, v in self.value_families.items()}}
                   if self.value_families is not None else {}),
                **({"conditions": self.conditions} if self.conditions else {}),
                **({"scope": {k: dict(v) for k, v in self.shape_scope.items()}}
                   if self.shape_scope is not None else {}),
                **({"largest_elements": self.largest_elements}
                   if self.largest_elements is not None else {}),
            },
            "checks": [c.to_json() for c in self.checks],
            "minimized": {k: dict(v) for k, v in self.minimized.items()},
            **({"minimize_stopped": dict(self.minimize_stopped)} if self.minimize_stopped else {}),
            **({"scope_notes": [n.to_json() for n in self.scope_notes]}
               if self.scope_notes else {}),
            "timing": self.timing.to_json(),
            "verdict": str(self.verdict),
            "certifier": {"name": "kcert", "version": self.certifier_version,
                          **({"confinement": dict(self.confinement)} if self.confinement else {})},
            "issued_at": self.issued_at,
        }


def _finite(value: float) -> float | str:
    """JSON (and RFC 8785) has no NaN or Inf: write them as strings."""
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value

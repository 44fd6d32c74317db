"""What production evidence does to a promotion: pure functions of recorded inputs.

Two decisions come from what a target sees after a kernel is promoted there,
and each is a pure function of inputs the audit log records beside it, so
``kcert audit replay`` can decide it again from the leaf alone:

- :func:`decide_mismatch`: a runtime mismatch reported by ``kcert.guard``
  (``POST /v1/observations``) is recorded, and, when the target's policy says
  ``suspend`` and the mismatch is *confirmed*, the kernel's active promotion on
  that target is suspended with the reason :data:`RUNTIME_MISMATCH`. A
  mismatch is confirmed when its evidence holds every input array the guard
  checked and the registry recomputed their anchors from those bytes: then
  anyone can re-run the reference on the very inputs (``kcert audit replay N
  --spec``). A mismatch without evidence (over the size cap), or naming no input
  or no output, is recorded only.
- :func:`latency_reasons`: a promotion that says which kernel it *replaces*
  on a target whose policy sets ``max_p99_regression_pct`` is denied when the
  new kernel's p99 on that target exceeds the old one's by more than that
  percentage, or when either has fewer than ``min_samples`` samples (the
  registry cannot then tell, and fails closed). The percentiles themselves
  are computed by :mod:`kcert.registry.perf` and recorded in the decision's
  inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kcert.registry.errors import PolicyError

MISMATCH_POLICY_VERSION = "kcert-mismatch/1"
#: The reason that leads a suspension by runtime evidence (the gate's reasons start with it).
RUNTIME_MISMATCH = "runtime-mismatch"
#: The reason that leads a denial by the latency policy.
P99_REGRESSION = "p99-regression"

OnMismatch = Literal["record", "suspend"]
ON_MISMATCH: tuple[OnMismatch, ...] = ("record", "suspend")


@dataclass(frozen=True, slots=True)
class MismatchInputs:
    """Everything the action on one reported mismatch depends on."""

    kernel: str
    target: str
    #: The target's policy when the mismatch arrived.
    on_mismatch: str
    #: The (kernel, target) promotion's status then: "active", "suspended" or None.
    promotion: str | None
    #: Evidence holds every checked input, anchors recomputed by the registry.
    confirmed: bool
    policy_version: str = MISMATCH_POLICY_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "policy_version": self.policy_version, "kernel": self.kernel, "target": self.target,
            "on_mismatch": self.on_mismatch, "promotion": self.promotion,
            "confirmed": self.confirmed,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MismatchInputs:
        promotion = data.get("promotion")
        confirmed = data["confirmed"]
        if not isinstance(confirmed, bool):
            raise ValueError(f"confirmed is {confirmed!r}, not true or false")
        return cls(
            kernel=str(data["kernel"]), target=str(data["target"]),
            on_mismatch=str(data["on_mismatch"]),
            promotion=None if promotion is None else str(promotion), confirmed=confirmed,
            policy_version=str(data.get("policy_version", MISMATCH_POLICY_VERSION)),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class MismatchDecision:
    suspend: bool
    reasons: tuple[str, ...]
    policy_version: str = MISMATCH_POLICY_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"suspend": self.suspend, "reasons": list(self.reasons),
                "policy_version": self.policy_version}  # fmt: skip


def decide_mismatch(inputs: MismatchInputs) -> MismatchDecision:
    """Suspend, or only record, one reported mismatch."""
    if inputs.policy_version != MISMATCH_POLICY_VERSION:
        raise PolicyError(
            f"inputs were recorded under policy {inputs.policy_version!r}; this kcert decides "
            f"mismatches with {MISMATCH_POLICY_VERSION!r}"
        )
    if inputs.on_mismatch not in ON_MISMATCH:
        raise PolicyError(f"on_mismatch is {inputs.on_mismatch!r}, not one of {ON_MISMATCH}")
    where = f"kernel {inputs.kernel} on target {inputs.target!r}"
    if inputs.on_mismatch == "record":
        return MismatchDecision(False, (f"recorded: the target's policy is 'record' ({where})",))
    if not inputs.confirmed:
        return MismatchDecision(False, (
            f"recorded: the mismatch has no evidence of its inputs to re-check, so it does "
            f"not suspend ({where})",
        ))  # fmt: skip
    if inputs.promotion != "active":
        state = "not promoted" if inputs.promotion is None else inputs.promotion
        return MismatchDecision(False, (f"recorded: the promotion is {state} ({where})",))
    return MismatchDecision(True, (
        f"{RUNTIME_MISMATCH}: confirmed wrong results in production; the target's policy "
        f"suspends ({where})",
    ))  # fmt: skip


@dataclass(frozen=True, slots=True)
class LatencyInputs:
    """The latency half of a promotion decision (policy ``kcert-promotion/3``)."""

    #: The kernel the promoted one replaces on the target.
    replaces: str
    max_p99_regression_pct: float
    min_samples: int
    before_p99_us: float | None
    before_samples: int
    after_p99_us: float | None
    after_samples: int
    #: Who named ``replaces``: the request (``--replaces``) or, when it named none, the
    #: target's active promotion of a kernel of the same name.
    replaces_from: str = "request"

    def to_json(self) -> dict[str, Any]:
        return {
            "replaces": self.replaces, "max_p99_regression_pct": self.max_p99_regression_pct,
            "min_samples": self.min_samples, "before_p99_us": self.before_p99_us,
            "before_samples": self.before_samples, "after_p99_us": self.after_p99_us,
            "after_samples": self.after_samples, "replaces_from": self.replaces_from,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LatencyInputs:
        def number(key: str) -> float | None:
            value = data.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} is {value!r}, not a number")
            return float(value)

        limit = number("max_p99_regression_pct")
        if limit is None:
            raise ValueError("max_p99_regression_pct is missing")
        return cls(
            replaces=str(data["replaces"]), max_p99_regression_pct=limit,
            min_samples=int(data["min_samples"]), before_p99_us=number("before_p99_us"),
            before_samples=int(data["before_samples"]), after_p99_us=number("after_p99_us"),
            after_samples=int(data["after_samples"]),
            replaces_from=str(data.get("replaces_from", "request")),
        )  # fmt: skip


def _implied(latency: LatencyInputs) -> str:
    if latency.replaces_from == "request":
        return ""
    return f", the target's {latency.replaces_from} of that name"


def latency_reasons(latency: LatencyInputs) -> tuple[str, ...]:
    """Why the canary's latency denies the promotion; empty when it does not."""
    short = [
        f"{which} has {count} sample(s)"
        for which, count in (("the new kernel", latency.after_samples),
                             (f"the replaced kernel {latency.replaces}", latency.before_samples))
        if count < latency.min_samples
    ]  # fmt: skip
    if short or latency.before_p99_us is None or latency.after_p99_us is None:
        return (
            f"{P99_REGRESSION}: too few latency samples on the target to compare p99 "
            f"({'; '.join(short) or 'none'}; the policy needs {latency.min_samples} each)",
        )
    if latency.before_p99_us <= 0:
        return ()
    change = (latency.after_p99_us - latency.before_p99_us) / latency.before_p99_us * 100.0
    if change > latency.max_p99_regression_pct:
        return (
            f"{P99_REGRESSION}: p99 {latency.after_p99_us:.6g} us vs {latency.before_p99_us:.6g} "
            f"us of {latency.replaces}{_implied(latency)} (+{change:.1f}%, the policy allows "
            f"{latency.max_p99_regression_pct:g}%)",
        )
    return ()

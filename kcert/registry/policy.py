"""The promotion policy: a pure function of recorded inputs.

A promotion of kernel K to target T is granted when at least one certificate
of K is valid for T. "Valid" is a conjunction of small checks, each of which
returns quietly or raises :class:`Unsatisfied` with a reason; ``all_of`` and
``any_of`` combine them and collect every reason. Nothing here touches a
database or a clock: :func:`decide_promotion` sees only :class:`PromotionInputs`,
which the registry records in the audit log next to the decision. That is what
lets ``kcert audit replay N`` rebuild the inputs from a leaf and decide again.

An empty combination is an error, never an allow: a policy that forgot its
checks must deny, not grant everything.

Every policy version this kcert has ever decided with stays in :data:`POLICIES`,
unchanged: inputs carry the version they were recorded under, and are decided
again under exactly that version's checks, so a leaf logged before a check was
added still replays to the decision it recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kcert.digest import Digest
from kcert.registry.errors import PolicyError
from kcert.registry.runtime_policy import LatencyInputs, latency_reasons

#: Bumped whenever a check is added, removed or changes meaning (and the old version kept
#: in :data:`POLICIES`). /2 added ``made_in_sandbox``; /3 the latency half
#: (:mod:`kcert.registry.runtime_policy`), decided when the inputs carry one.
POLICY_VERSION = "kcert-promotion/3"
#: The verdict a certificate must carry to count.
PASSING_VERDICT = "pass"


class Unsatisfied(Exception):
    """A check did not hold; ``reasons`` say why."""

    def __init__(self, *reasons: str) -> None:
        super().__init__("; ".join(reasons))
        self.reasons: tuple[str, ...] = reasons


@dataclass(frozen=True, slots=True)
class Candidate:
    """One certificate of the kernel, as the registry saw it when deciding.

    ``fingerprint`` is the certificate's environment fingerprint taken over the
    target's drift fields, so that it can be compared with the target's.
    ``sandboxed`` is :func:`records_sandbox` of its predicate; ``None``
    only in inputs recorded before the registry kept it (policy ``kcert-promotion/1``,
    which does not look at it), and then it is left out of :meth:`to_json` too.
    """

    id: str
    keyid: str
    verdict: str
    hw_class: str
    fingerprint: str
    sandboxed: bool | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "keyid": self.keyid,
            "verdict": self.verdict,
            "hw_class": self.hw_class,
            "fingerprint": self.fingerprint,
        }
        if self.sandboxed is not None:
            data["sandboxed"] = self.sandboxed
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Candidate:
        sandboxed = data.get("sandboxed")
        if sandboxed is not None and not isinstance(sandboxed, bool):
            raise ValueError(f"candidate's sandboxed is {sandboxed!r}, not true, false or absent")
        return cls(
            id=str(data["id"]),
            keyid=str(data["keyid"]),
            verdict=str(data["verdict"]),
            hw_class=str(data["hw_class"]),
            fingerprint=str(data["fingerprint"]),
            sandboxed=sandboxed,
        )


def records_sandbox(predicate: Mapping[str, Any]) -> bool:
    """Whether a certificate's predicate records that its kernel ran in the sandbox.

    True only for ``certifier.confinement.sandbox`` exactly ``true``. A certificate
    made with ``--no-sandbox`` records ``false``; one from a certifier that predates
    the record has none, and is not known to be sandboxed either.
    """
    certifier = predicate.get("certifier")
    confinement = certifier.get("confinement") if isinstance(certifier, Mapping) else None
    return isinstance(confinement, Mapping) and confinement.get("sandbox") is True


@dataclass(frozen=True, slots=True)
class PromotionInputs:
    """Everything a promotion decision depends on, and nothing else."""

    kernel: str
    target: str
    #: ``None`` when the target has never reported: nothing can be valid for it.
    target_hw_class: str | None
    target_fingerprint: str | None
    #: Ids of the trusted keys that are not revoked, sorted.
    trusted_keys: tuple[str, ...]
    #: Revoked key ids that signed one of the candidates, sorted.
    revoked_keys: tuple[str, ...]
    #: Revoked certificate ids among the candidates, sorted.
    revoked_certificates: tuple[str, ...]
    #: The kernel's certificates, in the order they are considered.
    candidates: tuple[Candidate, ...]
    policy_version: str = POLICY_VERSION
    #: The canary's latency against the kernel it replaces (``kcert-promotion/3``), when the
    #: promotion named one on a target with a latency policy; the gate never carries it.
    latency: LatencyInputs | None = None

    def trusted_keys_digest(self) -> str:
        """Content address of the trusted key set (sorted key ids, canonical JSON)."""
        return str(Digest.of_json(sorted(self.trusted_keys)))

    def to_json(self) -> dict[str, Any]:
        return {
            "policy_version": self.policy_version,
            "kernel": self.kernel,
            "target": self.target,
            "target_hw_class": self.target_hw_class,
            "target_fingerprint": self.target_fingerprint,
            "trusted_keys": list(self.trusted_keys),
            "trusted_keys_digest": self.trusted_keys_digest(),
            "revoked_keys": list(self.revoked_keys),
            "revoked_certificates": list(self.revoked_certificates),
            "candidates": [c.to_json() for c in self.candidates],
            **({"latency": self.latency.to_json()} if self.latency is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PromotionInputs:
        """Rebuild inputs from :meth:`to_json` output; the key-set digest must agree."""
        inputs = cls(
            kernel=str(data["kernel"]),
            target=str(data["target"]),
            target_hw_class=_opt_str(data.get("target_hw_class")),
            target_fingerprint=_opt_str(data.get("target_fingerprint")),
            trusted_keys=tuple(str(k) for k in data["trusted_keys"]),
            revoked_keys=tuple(str(k) for k in data["revoked_keys"]),
            revoked_certificates=tuple(str(c) for c in data["revoked_certificates"]),
            candidates=tuple(Candidate.from_json(c) for c in data["candidates"]),
            policy_version=str(data.get("policy_version", POLICY_VERSION)),
            latency=LatencyInputs.from_json(data["latency"]) if data.get("latency") else None,
        )
        if inputs.latency is not None and inputs.policy_version in _NO_LATENCY:
            raise PolicyError(f"policy {inputs.policy_version!r} has no latency half")
        recorded = data.get("trusted_keys_digest")
        if recorded is not None and recorded != inputs.trusted_keys_digest():
            raise PolicyError(
                "recorded trusted_keys_digest does not match the recorded trusted_keys"
            )
        return inputs


@dataclass(frozen=True, slots=True)
class Decision:
    """Allow or deny, the certificate that carried an allow, and every reason."""

    allow: bool
    certificate: str | None
    reasons: tuple[str, ...]
    policy_version: str = POLICY_VERSION
    #: Per-candidate reasons, for the log and for people debugging a denial.
    findings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "allow": self.allow,
            "certificate": self.certificate,
            "reasons": list(self.reasons),
            "policy_version": self.policy_version,
            "findings": {k: list(v) for k, v in self.findings.items()},
        }


@dataclass(frozen=True, slots=True)
class Context:
    """What one check looks at: the inputs and the candidate under consideration."""

    inputs: PromotionInputs
    candidate: Candidate


Check = Callable[[Context], None]


def all_of(*checks: Check) -> Check:
    """Holds when every check holds; otherwise raises with the reasons of all that failed."""
    if not checks:
        raise PolicyError("all_of() with no checks would allow everything; name at least one")

    def run(ctx: Context) -> None:
        reasons: list[str] = []
        for check in checks:
            try:
                check(ctx)
            except Unsatisfied as exc:
                reasons.extend(exc.reasons)
        if reasons:
            raise Unsatisfied(*reasons)

    return run


def any_of(*checks: Check) -> Check:
    """Holds when one check holds; otherwise raises with the reasons of every check."""
    if not checks:
        raise PolicyError("any_of() with no checks can never decide; name at least one")

    def run(ctx: Context) -> None:
        reasons: list[str] = []
        for check in checks:
            try:
                check(ctx)
                return
            except Unsatisfied as exc:
                reasons.extend(exc.reasons)
        raise Unsatisfied(*reasons)

    return run


def signed_by_trusted_key(ctx: Context) -> None:
    keyid = ctx.candidate.keyid
    if keyid in ctx.inputs.revoked_keys:
        raise Unsatisfied(f"signing key {keyid} is revoked")
    if keyid not in ctx.inputs.trusted_keys:
        raise Unsatisfied(f"signing key {keyid} is not trusted")


def not_revoked(ctx: Context) -> None:
    if ctx.candidate.id in ctx.inputs.revoked_certificates:
        raise Unsatisfied("certificate is revoked")


def verdict_passes(ctx: Context) -> None:
    if ctx.candidate.verdict != PASSING_VERDICT:
        raise Unsatisfied(f"verdict is {ctx.candidate.verdict!r}, not {PASSING_VERDICT!r}")


def hardware_matches(ctx: Context) -> None:
    wanted = ctx.inputs.target_hw_class
    if wanted is None:
        raise Unsatisfied(f"target {ctx.inputs.target!r} has not reported its hardware")
    if ctx.candidate.hw_class != wanted:
        raise Unsatisfied(
            f"certified for hardware {ctx.candidate.hw_class!r}, target is {wanted!r}"
        )


def fingerprint_matches(ctx: Context) -> None:
    wanted = ctx.inputs.target_fingerprint
    if wanted is None:
        raise Unsatisfied(f"target {ctx.inputs.target!r} has not reported an environment")
    if ctx.candidate.fingerprint != wanted:
        raise Unsatisfied(
            f"certified in environment {ctx.candidate.fingerprint}, "
            f"target now reports {wanted} (stale)"
        )


def made_in_sandbox(ctx: Context) -> None:
    """The kernel ran in the certifier's sandbox: under ``--no-sandbox`` its code had the
    certifier's rights (its key, its files), so nothing it reported can be relied on."""
    sandboxed = ctx.candidate.sandboxed
    if sandboxed is None:
        raise Unsatisfied(
            "the decision's inputs do not record whether the certificate was made in the sandbox"
        )
    if not sandboxed:
        raise Unsatisfied(
            "certificate was made with --no-sandbox (or by a certifier that did not record "
            "its sandbox): the kernel's code could reach the certifier; certify it again "
            "without --no-sandbox"
        )


#: A certificate is valid for a target when all of these hold (docs/api.md, "Validity,
#: promotion and the gate").
CERTIFICATE_VALID: Check = all_of(
    signed_by_trusted_key, not_revoked, verdict_passes, hardware_matches, fingerprint_matches,
    made_in_sandbox,
)  # fmt: skip

#: Each policy version this kcert can decide under, never changed once released: replay
#: re-decides a logged decision under the version it recorded.
POLICIES: Mapping[str, Check] = {
    "kcert-promotion/1": all_of(
        signed_by_trusted_key,
        not_revoked,
        verdict_passes,
        hardware_matches,
        fingerprint_matches,
    ),  # fmt: skip
    "kcert-promotion/2": CERTIFICATE_VALID,
    POLICY_VERSION: CERTIFICATE_VALID,
}
#: Versions from before the latency half.
_NO_LATENCY = ("kcert-promotion/1", "kcert-promotion/2")


def evaluate(inputs: PromotionInputs, candidate: Candidate, policy: Check) -> tuple[str, ...]:
    """The reasons ``candidate`` fails ``policy``; empty when it holds."""
    try:
        policy(Context(inputs=inputs, candidate=candidate))
    except Unsatisfied as exc:
        return exc.reasons or ("check failed without a reason",)
    return ()


def decide_promotion(inputs: PromotionInputs) -> Decision:
    """Grant when some candidate satisfies the policy of ``inputs.policy_version``; the
    first such one carries it.

    Candidates are considered in the order recorded, so the same inputs always
    name the same certificate.
    """
    policy = POLICIES.get(inputs.policy_version)
    if policy is None:
        raise PolicyError(
            f"inputs were recorded under policy {inputs.policy_version!r}; "
            f"this kcert decides with {', '.join(map(repr, POLICIES))}"
        )
    version = inputs.policy_version
    if not inputs.candidates:
        return Decision(
            allow=False,
            certificate=None,
            reasons=(f"kernel {inputs.kernel} has no certificate in this registry",),
            policy_version=version,
        )
    findings: dict[str, tuple[str, ...]] = {}
    for candidate in inputs.candidates:
        reasons = evaluate(inputs, candidate, policy)
        if not reasons and inputs.latency is not None:
            slow = latency_reasons(inputs.latency)
            if slow:
                return Decision(
                    allow=False, certificate=None, reasons=slow, policy_version=version,
                    findings={candidate.id: ()},
                )  # fmt: skip
        if not reasons:
            return Decision(
                allow=True,
                certificate=candidate.id,
                reasons=(f"certificate {candidate.id} is valid for target {inputs.target!r}",),
                policy_version=version,
                findings={candidate.id: ()},
            )
        findings[candidate.id] = reasons
    return Decision(
        allow=False,
        certificate=None,
        reasons=tuple(f"{cid}: {r}" for cid, rs in findings.items() for r in rs),
        policy_version=version,
        findings=findings,
    )


@dataclass(frozen=True, slots=True)
class PromotionState:
    """The promotion row the gate consults, or its absence."""

    status: str  # "active" | "suspended"
    reason: str | None = None


def decide_gate(inputs: PromotionInputs, promotion: PromotionState | None) -> Decision:
    """The gate: an active promotion and, right now, a valid certificate."""
    decision = decide_promotion(inputs)
    extra: list[str] = []
    if promotion is None:
        extra.append(f"kernel {inputs.kernel} is not promoted to target {inputs.target!r}")
    elif promotion.status != "active":
        why = f": {promotion.reason}" if promotion.reason else ""
        extra.append(f"promotion to target {inputs.target!r} is {promotion.status}{why}")
    if not extra:
        return decision
    reasons: Sequence[str] = extra if decision.allow else [*extra, *decision.reasons]
    return Decision(
        allow=False, certificate=None, reasons=tuple(reasons),
        policy_version=decision.policy_version, findings=decision.findings,
    )  # fmt: skip


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)

"""Replaying logged decisions, and comparing a re-run's anchors with the recorded ones.

A runtime mismatch (``observation.mismatch``) is re-decided the same way, by
:func:`kcert.registry.runtime_policy.decide_mismatch`. This module sits in the
registry, beside the policies it runs again, so that :mod:`kcert.log` stays a
library below the registry.

A promotion leaf (``promotion.granted``, ``promotion.denied``,
``promotion.suspended``) carries ``{"inputs": PromotionInputs.to_json(),
"decision": Decision.to_json(), ...}``. :func:`replay_decision` rebuilds the
inputs from the leaf alone, runs the registry's pure policy function again and
compares every field of the decision. :func:`check_candidates` then holds the
recorded inputs against the certificates they name: a recorded verdict, hardware
class, signer or sandbox (where the leaf recorded one) that the certificate itself
does not carry is a difference too. Each leaf is decided again under the policy
version it recorded (:data:`kcert.registry.policy.POLICIES`).

:func:`compare_anchors` is the pure half of ``replay --rerun``: given the probes
a certificate recorded and the probes of a fresh certification of the same
kernel, it names every anchor that changed and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kcert.attest.certificate import inspect_envelope, parse_envelope
from kcert.digest import Digest, canonical_json
from kcert.errors import KcertError
from kcert.log.leaf import Leaf
from kcert.registry.errors import ReplayError
from kcert.registry.policy import PromotionInputs, decide_promotion, records_sandbox
from kcert.registry.runtime_policy import MismatchInputs, decide_mismatch

DECISION_KINDS = ("promotion.granted", "promotion.denied", "promotion.suspended")
#: A runtime mismatch records what it did (record or suspend) and the inputs of that.
MISMATCH_KIND = "observation.mismatch"


@dataclass(frozen=True, slots=True)
class DecisionReplay:
    recorded: Mapping[str, Any]
    replayed: Mapping[str, Any]
    differences: tuple[str, ...]

    @property
    def same(self) -> bool:
        return not self.differences


def replay_decision(leaf: Leaf) -> DecisionReplay:
    """Decide ``leaf``'s promotion again from its recorded inputs alone."""
    if leaf.kind == MISMATCH_KIND:
        return _replay_mismatch(leaf)
    if leaf.kind not in DECISION_KINDS:
        raise ReplayError(
            f"entry {leaf.index} records {leaf.kind!r}, not a decision; replay re-decides "
            f"entries of kind {', '.join((*DECISION_KINDS, MISMATCH_KIND))}"
        )
    return _redecide(leaf, lambda inputs: decide_promotion(
        PromotionInputs.from_json(inputs)).to_json())  # fmt: skip


def _replay_mismatch(leaf: Leaf) -> DecisionReplay:
    """Decide a runtime mismatch's action again (:mod:`kcert.registry.runtime_policy`)."""
    return _redecide(leaf, lambda inputs: decide_mismatch(
        MismatchInputs.from_json(inputs)).to_json())  # fmt: skip


Decide = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def _redecide(leaf: Leaf, decide: Decide) -> DecisionReplay:
    """Run ``decide`` on the leaf's recorded inputs and name every field that differs."""
    inputs, recorded = leaf.payload.get("inputs"), leaf.payload.get("decision")
    if not isinstance(inputs, Mapping) or not isinstance(recorded, Mapping):
        raise ReplayError(f"entry {leaf.index} lacks its recorded inputs or decision")
    try:
        replayed = decide(inputs)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"entry {leaf.index} has malformed inputs: {exc!r}") from exc
    except KcertError as exc:
        raise ReplayError(f"entry {leaf.index} cannot be re-decided: {exc.diagnostics()}") from exc
    differences = tuple(
        f"{key}: recorded {recorded.get(key)!r}, replayed {replayed.get(key)!r}"
        for key in sorted(set(recorded) | set(replayed))
        if _json(recorded.get(key)) != _json(replayed.get(key))
    )
    return DecisionReplay(recorded, replayed, differences)


def _json(value: Any) -> bytes:
    return canonical_json(value)


@dataclass(frozen=True, slots=True)
class ObjectCheck:
    """One certificate named by the inputs, held against what was recorded about it."""

    certificate: str
    status: str  # "same" | "differs" | "unavailable"
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"certificate": self.certificate, "status": self.status, "notes": list(self.notes)}


#: Fetches a stored envelope (DSSE JSON) by certificate id; ``None`` when it cannot.
EnvelopeFetcher = Callable[[str], "Mapping[str, Any] | None"]


def check_candidates(leaf: Leaf, fetch: EnvelopeFetcher) -> list[ObjectCheck]:
    """Compare each recorded candidate with the certificate it names."""
    inputs = leaf.payload.get("inputs")
    candidates = inputs.get("candidates", []) if isinstance(inputs, Mapping) else []
    checks: list[ObjectCheck] = []
    for candidate in candidates:
        cid = str(candidate.get("id"))
        envelope = fetch(cid)
        if envelope is None:
            checks.append(ObjectCheck(cid, "unavailable", ("the registry did not serve it",)))
            continue
        notes: list[str] = []
        try:
            contents = inspect_envelope(parse_envelope(canonical_json(dict(envelope))))
        except KcertError as exc:
            checks.append(ObjectCheck(cid, "differs", (f"unreadable: {exc.diagnostics()}",)))
            continue
        # Leaves written before the registry's migration 0004 name certificates by the
        # old id, ``sha256`` of the envelope's canonical JSON; the registry serves the
        # envelope stored under such an id then, so either rule must give back the id.
        if cid not in (str(contents.id), str(Digest.of_json(dict(envelope)))):
            notes.append("the served envelope does not hash to this id")
        for name, actual in (("verdict", str(contents.verdict)), ("hw_class", contents.hw_class)):
            if candidate.get(name) != actual:
                notes.append(f"{name}: recorded {candidate.get(name)!r}, certificate {actual!r}")
        # Leaves recorded before the registry kept the sandbox have no such key.
        sandboxed = records_sandbox(contents.predicate)
        if "sandboxed" in candidate and candidate["sandboxed"] != sandboxed:
            recorded = candidate["sandboxed"]
            notes.append(f"sandboxed: recorded {recorded!r}, certificate {sandboxed!r}")
        keyids = {s.keyid for s in contents.envelope.signatures if s.keyid}
        if keyids and candidate.get("keyid") not in keyids:
            notes.append(f"keyid: recorded {candidate.get('keyid')!r}, signed by {sorted(keyids)}")
        if candidate.get("fingerprint") != str(contents.fingerprint):
            # Not a difference by itself: a target may fingerprint over its own drift fields.
            extra = "recorded fingerprint is over the target's own drift fields (not rechecked)"
            checks.append(ObjectCheck(cid, "differs" if notes else "same", (*notes, extra)))
            continue
        checks.append(ObjectCheck(cid, "differs" if notes else "same", tuple(notes)))
    return checks


# --- --rerun: anchors of a fresh certification against the recorded ones ---------------------


def canonical_text(value: Any) -> str:
    """A recorded JSON value as one line (RFC 8785), for a difference's two sides."""
    return canonical_json(value).decode("utf-8")


@dataclass(frozen=True, slots=True)
class AnchorDifference:
    probe: str
    role: str  # "input" | "reference" | "output" | "probe" | "conditions"
    name: str
    recorded: str | None
    rerun: str | None
    #: "kernel output drift", "reference drift", "input drift", "conditions drift" or
    #: "probe not re-run".
    cause: str

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": self.probe, "role": self.role, "name": self.name,
            "recorded": self.recorded, "rerun": self.rerun, "cause": self.cause,
        }  # fmt: skip


def compare_anchors(
    recorded: Sequence[Mapping[str, Any]], rerun: Sequence[Mapping[str, Any]]
) -> list[AnchorDifference]:
    """Every anchor that differs between two runs over the same probes, with its cause.

    Probes are matched by id. Inputs come from recorded seeds, so a changed
    input anchor means the probe generator itself drifted ("input drift") and
    everything computed from it differs as a consequence. With equal inputs, a
    changed reference anchor is "reference drift" (the NumPy reference or its
    stack computes something else) and a changed output anchor is "kernel output
    drift" (the kernel, its build or the GPU stack computes something else). Each
    probe's recorded conditions (drawn from the recorded fresh seed) must come out
    the same too ("conditions drift").
    """
    fresh = {str(p["id"]): p for p in rerun}
    differences: list[AnchorDifference] = []
    for probe in recorded:
        pid = str(probe["id"])
        other = fresh.get(pid)
        if other is None:
            differences.append(AnchorDifference(pid, "probe", "", None, None, "probe not re-run"))
            continue
        inputs_drifted = False
        # the buffers' fills and addresses come from the recorded fresh seed: a re-run that
        # drew other ones did not reproduce the conditions the kernel ran under
        for run in sorted(set(probe.get("conditions", {})) | set(other.get("conditions", {}))):
            before_c = probe.get("conditions", {}).get(run)
            after_c = other.get("conditions", {}).get(run)
            if before_c != after_c:
                differences.append(AnchorDifference(
                    pid, "conditions", run, None if before_c is None else canonical_text(before_c),
                    None if after_c is None else canonical_text(after_c), "conditions drift"))
        for role, cause in (("inputs", "input drift"), ("reference", "reference drift"),
                            ("outputs", "kernel output drift")):  # fmt: skip
            before: Mapping[str, str] = probe.get(role, {})
            after: Mapping[str, str] = other.get(role, {})
            for name in sorted(set(before) | set(after)):
                if before.get(name) == after.get(name):
                    continue
                why = cause
                if inputs_drifted and role != "inputs":
                    why = f"{cause} (after input drift)"
                differences.append(
                    AnchorDifference(
                        pid, role.rstrip("s"), name, before.get(name), after.get(name), why
                    )  # fmt: skip
                )
                if role == "inputs":
                    inputs_drifted = True
    return differences

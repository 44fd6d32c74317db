"""Replaying a decision from its leaf, and naming anchor drift after a re-run."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kcert.log.leaf import build_leaf, parse_leaf
from kcert.registry.errors import ReplayError
from kcert.registry.policy import POLICY_VERSION, Candidate, PromotionInputs, decide_promotion
from kcert.registry.replay import compare_anchors, replay_decision

FP = "sha256:" + "f" * 64


def _inputs(**overrides: Any) -> PromotionInputs:
    values: dict[str, Any] = {
        "kernel": "sha256:" + "a" * 64,
        "target": "fleet",
        "target_hw_class": "H100",
        "target_fingerprint": FP,
        "trusted_keys": ("k1",),
        "revoked_keys": (),
        "revoked_certificates": (),
        "candidates": (Candidate("sha256:" + "c" * 64, "k1", "pass", "H100", FP, True),),
    }
    values.update(overrides)
    return PromotionInputs(**values)


def _leaf(kind: str, payload: dict[str, Any]) -> Any:
    data = build_leaf(index=7, kind=kind, payload=payload, time=datetime.now(UTC))
    return parse_leaf(7, data)


def _payload(inputs: PromotionInputs) -> dict[str, Any]:
    return {"inputs": inputs.to_json(), "decision": decide_promotion(inputs).to_json()}


@pytest.mark.parametrize(
    "inputs",
    [_inputs(), _inputs(target_fingerprint="sha256:" + "0" * 64), _inputs(candidates=()),
     _inputs(revoked_keys=("k1",), trusted_keys=())],
)  # fmt: skip
def test_a_recorded_decision_replays_the_same(inputs: PromotionInputs) -> None:
    kind = "promotion.granted" if decide_promotion(inputs).allow else "promotion.denied"
    replay = replay_decision(_leaf(kind, _payload(inputs)))
    assert replay.same, replay.differences


def test_a_decision_that_does_not_follow_from_its_inputs_differs() -> None:
    payload = _payload(_inputs())
    payload["inputs"]["target_fingerprint"] = "sha256:" + "0" * 64  # inputs say stale
    replay = replay_decision(_leaf("promotion.granted", payload))
    assert not replay.same
    assert any(d.startswith("allow:") for d in replay.differences)
    assert any(d.startswith("reasons:") for d in replay.differences)


def test_only_decisions_replay() -> None:
    with pytest.raises(ReplayError, match="not a decision"):
        replay_decision(_leaf("key.trusted", {"keyid": "k1"}))
    with pytest.raises(ReplayError, match="lacks"):
        replay_decision(_leaf("promotion.denied", {"decision": {}}))
    bad = _payload(_inputs())
    del bad["inputs"]["candidates"]
    with pytest.raises(ReplayError, match="malformed"):
        replay_decision(_leaf("promotion.denied", bad))
    other_policy = _payload(_inputs())
    other_policy["inputs"]["policy_version"] = "kcert-promotion/0"
    with pytest.raises(ReplayError, match="policy"):
        replay_decision(_leaf("promotion.denied", other_policy))


#: A grant exactly as kcert wrote it under policy kcert-promotion/1, before certificates
#: recorded their sandbox: the candidate has no "sandboxed" key.
RECORDED_UNDER_POLICY_1: dict[str, Any] = {
    "inputs": {
        "policy_version": "kcert-promotion/1",
        "kernel": "sha256:" + "a" * 64,
        "target": "fleet",
        "target_hw_class": "H100",
        "target_fingerprint": FP,
        "trusted_keys": ["k1"],
        "trusted_keys_digest": (
            "sha256:a082cab368a85555a04c7ebe81d2bc0f4d9cbba98c2bede3a62d8fc4661be4e9"
        ),
        "revoked_keys": [],
        "revoked_certificates": [],
        "candidates": [
            {
                "id": "sha256:" + "c" * 64,
                "keyid": "k1",
                "verdict": "pass",
                "hw_class": "H100",
                "fingerprint": FP,
            },
        ],  # fmt: skip
    },
    "decision": {
        "allow": True,
        "certificate": "sha256:" + "c" * 64,
        "reasons": [f"certificate sha256:{'c' * 64} is valid for target 'fleet'"],
        "policy_version": "kcert-promotion/1",
        "findings": {"sha256:" + "c" * 64: []},
    },
}


def test_a_leaf_recorded_before_the_sandbox_check_replays_the_same() -> None:
    replay = replay_decision(_leaf("promotion.granted", json.loads(json.dumps(
        RECORDED_UNDER_POLICY_1))))  # fmt: skip
    assert replay.same, replay.differences
    assert replay.replayed["policy_version"] == "kcert-promotion/1"


def test_the_old_policy_is_not_what_decides_new_inputs() -> None:
    """The same candidate, recorded today, says nothing about its sandbox: denied."""
    old = PromotionInputs.from_json(RECORDED_UNDER_POLICY_1["inputs"])
    assert old.candidates[0].sandboxed is None
    assert old.to_json() == RECORDED_UNDER_POLICY_1["inputs"]
    today = dataclasses.replace(old, policy_version=POLICY_VERSION)
    decision = decide_promotion(today)
    assert not decision.allow
    assert any("do not record whether the certificate was made in the sandbox" in r
               for r in decision.reasons)  # fmt: skip


def test_a_denial_for_an_unsandboxed_certificate_replays_the_same() -> None:
    unsandboxed = Candidate("sha256:" + "c" * 64, "k1", "pass", "H100", FP, False)
    inputs = _inputs(candidates=(unsandboxed,))
    payload = json.loads(json.dumps(_payload(inputs)))
    assert payload["inputs"]["candidates"][0]["sandboxed"] is False
    assert payload["decision"]["allow"] is False
    assert any("was made with --no-sandbox" in r for r in payload["decision"]["reasons"])
    replay = replay_decision(_leaf("promotion.denied", payload))
    assert replay.same, replay.differences
    # The recorded fact decides: claim the certificate was sandboxed and the replay differs.
    payload["inputs"]["candidates"][0]["sandboxed"] = True
    assert not replay_decision(_leaf("promotion.denied", payload)).same


def test_a_sandboxed_value_that_is_not_a_boolean_is_malformed() -> None:
    payload = json.loads(json.dumps(_payload(_inputs())))
    payload["inputs"]["candidates"][0]["sandboxed"] = "yes"
    with pytest.raises(ReplayError, match="malformed"):
        replay_decision(_leaf("promotion.granted", payload))


def _probe(pid: str, x: str = "x1", ref: str = "r1", out: str = "o1") -> dict[str, Any]:
    return {"id": pid, "inputs": {"x": x}, "reference": {"y": ref}, "outputs": {"y": out}}


def test_identical_runs_have_no_differences() -> None:
    probes = [_probe("n=1"), _probe("n=33")]
    assert compare_anchors(probes, [dict(p) for p in reversed(probes)]) == []


def test_each_difference_is_named_by_its_cause() -> None:
    recorded = [_probe("n=1"), _probe("n=2"), _probe("n=3"), _probe("n=4")]
    rerun = [
        _probe("n=1", out="o2"),
        _probe("n=2", ref="r2"),
        _probe("n=3", x="x2", ref="r9", out="o9"),
    ]
    diffs = {(d.probe, d.role): d for d in compare_anchors(recorded, rerun)}
    assert diffs[("n=1", "output")].cause == "kernel output drift"
    assert ("n=1", "reference") not in diffs
    assert diffs[("n=2", "reference")].cause == "reference drift"
    assert ("n=2", "output") not in diffs
    assert diffs[("n=3", "input")].cause == "input drift"
    assert diffs[("n=3", "output")].cause == "kernel output drift (after input drift)"
    assert diffs[("n=4", "probe")].cause == "probe not re-run"
    assert (diffs[("n=1", "output")].recorded, diffs[("n=1", "output")].rerun) == ("o1", "o2")


def test_an_output_that_appears_or_vanishes_is_a_difference() -> None:
    recorded = [_probe("n=1")]
    rerun = [{**_probe("n=1"), "outputs": {"y": "o1", "z": "o3"}}]
    (diff,) = compare_anchors(recorded, rerun)
    assert (diff.name, diff.recorded, diff.rerun) == ("z", None, "o3")


def test_conditions_that_a_rerun_draws_differently_are_a_difference() -> None:
    conditions = {"A": {"seed": 1, "pair_seed": 3, "shift": 16, "roll": 0},
                  "B": {"seed": 2, "pair_seed": 3, "shift": 256, "roll": 9}}
    recorded = [{**_probe("n=1"), "conditions": conditions}]
    assert compare_anchors(recorded, [{**_probe("n=1"), "conditions": conditions}]) == []
    moved = {**conditions, "B": {**conditions["B"], "shift": 512}}
    (diff,) = compare_anchors(recorded, [{**_probe("n=1"), "conditions": moved}])
    assert (diff.role, diff.name, diff.cause) == ("conditions", "B", "conditions drift")
    assert diff.recorded is not None and '"shift":256' in diff.recorded

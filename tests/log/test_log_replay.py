"""Replaying a decision from its leaf, and naming anchor drift after a re-run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kcert.log.leaf import build_leaf, parse_leaf
from kcert.log.replay import ReplayError, compare_anchors, replay_decision
from kcert.registry.policy import Candidate, PromotionInputs, decide_promotion

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
        "candidates": (Candidate("sha256:" + "c" * 64, "k1", "pass", "H100", FP),),
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

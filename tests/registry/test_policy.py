"""The promotion policy is pure: same inputs, same decision, every reason named."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcert.registry.errors import PolicyError
from kcert.registry.policy import (
    CERTIFICATE_VALID,
    POLICIES,
    POLICY_VERSION,
    Candidate,
    Context,
    PromotionInputs,
    PromotionState,
    Unsatisfied,
    all_of,
    any_of,
    decide_gate,
    decide_promotion,
    evaluate,
    hardware_matches,
    records_sandbox,
    verdict_passes,
)

FP = "sha256:" + "a" * 64
OTHER_FP = "sha256:" + "b" * 64
KERNEL = "sha256:" + "c" * 64
KEY = "d" * 64


def candidate(**overrides: Any) -> Candidate:
    base = Candidate(id="sha256:" + "e" * 64, keyid=KEY, verdict="pass", hw_class="H100",
                     fingerprint=FP, sandboxed=True)  # fmt: skip
    return dataclasses.replace(base, **overrides)


def inputs(*candidates: Candidate, **overrides: object) -> PromotionInputs:
    base = PromotionInputs(
        kernel=KERNEL, target="prod", target_hw_class="H100", target_fingerprint=FP,
        trusted_keys=(KEY,), revoked_keys=(), revoked_certificates=(),
        candidates=candidates or (candidate(),),
    )  # fmt: skip
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_a_valid_certificate_is_granted_and_named() -> None:
    decision = decide_promotion(inputs())
    assert decision.allow
    assert decision.certificate == candidate().id


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"trusted_keys": ()}, "is not trusted"),
        ({"revoked_keys": (KEY,), "trusted_keys": ()}, "is revoked"),
        ({"revoked_certificates": ("sha256:" + "e" * 64,)}, "certificate is revoked"),
        ({"target_fingerprint": OTHER_FP}, "(stale)"),
        ({"target_hw_class": "A100"}, "target is 'A100'"),
        ({"target_hw_class": None, "target_fingerprint": None}, "has not reported"),
    ],
)
def test_each_failed_check_denies_with_its_reason(change: dict[str, object], reason: str) -> None:
    decision = decide_promotion(inputs(**change))
    assert not decision.allow
    assert decision.certificate is None
    assert any(reason in r for r in decision.reasons), decision.reasons


def test_a_failed_verdict_never_counts() -> None:
    decision = decide_promotion(inputs(candidate(verdict="fail")))
    assert not decision.allow
    assert any("verdict is 'fail'" in r for r in decision.reasons)


def test_every_reason_is_reported_not_only_the_first() -> None:
    bad = candidate(verdict="fail", hw_class="cpu", fingerprint=OTHER_FP)
    decision = decide_promotion(inputs(bad, trusted_keys=()))
    assert len(decision.findings[bad.id]) == 4


NO_SANDBOX = "certificate was made with --no-sandbox (or by a certifier that did not record"


def test_a_certificate_made_outside_the_sandbox_is_denied_with_its_reason() -> None:
    decision = decide_promotion(inputs(candidate(sandboxed=False)))
    assert not decision.allow and decision.certificate is None
    (reason,) = decision.reasons
    assert NO_SANDBOX in reason
    assert "the kernel's code could reach the certifier" in reason
    assert "certify it again without --no-sandbox" in reason


def test_inputs_that_do_not_record_the_sandbox_are_denied_under_this_policy() -> None:
    decision = decide_promotion(inputs(candidate(sandboxed=None)))
    assert not decision.allow
    assert "do not record whether the certificate was made in the sandbox" in decision.reasons[0]


def test_a_sandboxed_certificate_beside_an_unsandboxed_one_carries_the_grant() -> None:
    unsandboxed = candidate(id="sha256:" + "1" * 64, sandboxed=False)
    sandboxed = candidate(id="sha256:" + "2" * 64)
    decision = decide_promotion(inputs(unsandboxed, sandboxed))
    assert decision.allow and decision.certificate == sandboxed.id


def test_inputs_recorded_under_policy_1_are_decided_by_policy_1() -> None:
    """Before the sandbox check: what it granted, replay grants, under the version it named."""
    assert POLICY_VERSION != "kcert-promotion/1" and "kcert-promotion/1" in POLICIES
    old = inputs(candidate(sandboxed=None), policy_version="kcert-promotion/1")
    decision = decide_promotion(old)
    assert decision.allow and decision.policy_version == "kcert-promotion/1"
    gate = decide_gate(old, None)
    assert not gate.allow and gate.policy_version == "kcert-promotion/1"


def test_inputs_without_the_sandbox_fact_round_trip_without_it() -> None:
    data = inputs(candidate(sandboxed=None), policy_version="kcert-promotion/1").to_json()
    assert "sandboxed" not in data["candidates"][0]
    assert PromotionInputs.from_json(data).candidates[0].sandboxed is None
    assert inputs().to_json()["candidates"][0]["sandboxed"] is True


@pytest.mark.parametrize(
    ("certifier", "expected"),
    [
        ({"name": "kcert", "version": "0.1.0"}, False),
        ({"name": "kcert", "version": "0.1.0", "confinement": {"sandbox": False}}, False),
        ({"name": "kcert", "version": "0.1.0", "confinement": {"sandbox": True}}, True),
        ({"confinement": {"sandbox": True, "module_code": True}}, True),
        ({"confinement": {"sandbox": "true"}}, False),
        ({"confinement": {"sandbox": 1}}, False),
        ({"confinement": None}, False),
        ({"confinement": [True]}, False),
        (None, False),
    ],
)
def test_only_a_recorded_sandbox_true_counts(certifier: object, expected: bool) -> None:
    assert records_sandbox({"certifier": certifier}) is expected


def test_no_certificate_is_a_denial() -> None:
    decision = decide_promotion(dataclasses.replace(inputs(), candidates=()))
    assert not decision.allow
    assert "no certificate" in decision.reasons[0]


def test_the_first_valid_candidate_in_recorded_order_carries_the_grant() -> None:
    stale = candidate(id="sha256:" + "1" * 64, fingerprint=OTHER_FP)
    good_a = candidate(id="sha256:" + "2" * 64)
    good_b = candidate(id="sha256:" + "3" * 64)
    assert decide_promotion(inputs(stale, good_b, good_a)).certificate == good_b.id
    assert decide_promotion(inputs(stale, good_a, good_b)).certificate == good_a.id


def test_empty_combinations_are_errors_not_allows() -> None:
    with pytest.raises(PolicyError):
        all_of()
    with pytest.raises(PolicyError):
        any_of()


def test_any_of_holds_when_one_holds_and_collects_all_reasons_otherwise() -> None:
    ctx = Context(inputs=inputs(), candidate=candidate(verdict="fail", hw_class="cpu"))
    with pytest.raises(Unsatisfied) as exc:
        any_of(verdict_passes, hardware_matches)(ctx)
    assert len(exc.value.reasons) == 2
    any_of(verdict_passes, hardware_matches)(Context(inputs(), candidate(hw_class="cpu")))


def test_inputs_round_trip_through_json_and_decide_the_same() -> None:
    original = inputs(candidate(), candidate(id="sha256:" + "9" * 64, verdict="fail"))
    data = json.loads(json.dumps(original.to_json()))
    rebuilt = PromotionInputs.from_json(data)
    assert rebuilt == original
    assert decide_promotion(rebuilt) == decide_promotion(original)


def test_a_tampered_key_set_is_caught_on_rebuild() -> None:
    data = inputs().to_json()
    data["trusted_keys"] = [KEY, "f" * 64]
    with pytest.raises(PolicyError, match="trusted_keys_digest"):
        PromotionInputs.from_json(data)


def test_inputs_from_another_policy_version_are_refused() -> None:
    with pytest.raises(PolicyError, match="policy"):
        decide_promotion(inputs(policy_version="kcert-promotion/0"))


def test_the_gate_needs_an_active_promotion_as_well() -> None:
    ok = inputs()
    assert decide_gate(ok, PromotionState(status="active")).allow
    missing = decide_gate(ok, None)
    assert not missing.allow and "not promoted" in missing.reasons[0]
    suspended = decide_gate(ok, PromotionState(status="suspended", reason="target drifted"))
    assert not suspended.allow and "suspended: target drifted" in suspended.reasons[0]
    stale = decide_gate(inputs(target_fingerprint=OTHER_FP), PromotionState(status="active"))
    assert not stale.allow and any("(stale)" in r for r in stale.reasons)


@given(
    verdict=st.sampled_from(["pass", "fail"]),
    hw=st.sampled_from(["H100", "A100"]),
    fp=st.sampled_from([FP, OTHER_FP]),
    trusted=st.booleans(),
    revoked=st.booleans(),
    sandboxed=st.sampled_from([True, False, None]),
)
def test_allow_exactly_when_every_check_holds(
    verdict: str, hw: str, fp: str, trusted: bool, revoked: bool, sandboxed: bool | None
) -> None:
    c = candidate(verdict=verdict, hw_class=hw, fingerprint=fp, sandboxed=sandboxed)
    i = inputs(c, trusted_keys=(KEY,) if trusted else (),
               revoked_certificates=(c.id,) if revoked else ())  # fmt: skip
    expected = (
        verdict == "pass" and hw == "H100" and fp == FP and trusted and not revoked
        and sandboxed is True
    )  # fmt: skip
    assert decide_promotion(i).allow is expected
    assert (not evaluate(i, c, CERTIFICATE_VALID)) is expected

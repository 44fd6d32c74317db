"""Certificate diffs: deltas by probe id, and each regression rule on its own."""

from __future__ import annotations

import dataclasses
import json

import pytest
from attest_report_factory import make_probe, make_report, make_resources, make_timing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kcert.attest.certificate import CertificateContents, inspect_envelope, sign_report
from kcert.attest.diff import Thresholds, diff_certificates
from kcert.certify.report import CertificationReport


def _contents(report: CertificationReport, key: Ed25519PrivateKey) -> CertificateContents:
    return inspect_envelope(sign_report(report, key))


def _kinds(a: CertificationReport, b: CertificationReport, key: Ed25519PrivateKey,
           thresholds: Thresholds | None = None) -> list[str]:  # fmt: skip
    diff = diff_certificates(_contents(a, key), _contents(b, key), thresholds)
    return [r.kind for r in diff.regressions]


def test_identical_certificates_differ_in_nothing(signing_key: Ed25519PrivateKey) -> None:
    a = _contents(make_report(), signing_key)
    diff = diff_certificates(a, a)
    assert not diff.regressed
    assert (diff.kernel, diff.checks, diff.environment, diff.verdict) == ((), (), (), None)
    assert all(e.delta == 0 for e in diff.errors)
    assert {e.probe for e in diff.errors} == {"n=1", "n=33"}


def test_errors_are_matched_by_probe_id(signing_key: Ed25519PrivateKey) -> None:
    a = make_report(probes=(make_probe(1), make_probe(33, max_abs=2e-7)))
    b = make_report(probes=(make_probe(33, max_abs=5e-7), make_probe(65)))
    diff = diff_certificates(_contents(a, signing_key), _contents(b, signing_key))
    rows = {(e.probe, e.metric): e for e in diff.errors}
    assert set(rows) == {("n=33", "max_abs"), ("n=33", "max_rel"), ("n=33", "max_ulp")}
    assert rows["n=33", "max_abs"].delta == pytest.approx(3e-7)
    assert (diff.probes_only_in_a, diff.probes_only_in_b) == (("n=1",), ("n=65",))


def test_a_probe_redrawn_from_another_seed_is_not_compared(
    signing_key: Ed25519PrivateKey,
) -> None:
    # a tile-boundary fresh probe keeps its id (n=8192) but draws its values from each
    # run's fresh seed: errors on other inputs say nothing of a regression
    a = make_report(probes=(make_probe(33, max_abs=1e-6),))
    redrawn = dataclasses.replace(make_probe(33, max_abs=2e-6),
                                  inputs={"x": "sha256:" + "1" * 64, "y": "sha256:" + "2" * 64})
    diff = diff_certificates(_contents(a, signing_key), _contents(
        make_report(probes=(redrawn,)), signing_key))  # fmt: skip
    assert diff.errors == () and not diff.regressed
    assert (diff.probes_only_in_a, diff.probes_only_in_b) == (("n=33",), ("n=33",))
    # the same inputs are compared, and the growth is a regression
    same = make_report(probes=(make_probe(33, max_abs=2e-6),))
    assert _kinds(a, same, signing_key) == ["error"]


def test_error_growth_beyond_the_margin_regresses(signing_key: Ed25519PrivateKey) -> None:
    a = make_report(probes=(make_probe(33, max_abs=1e-6),))
    within = make_report(probes=(make_probe(33, max_abs=1.05e-6),))
    beyond = make_report(probes=(make_probe(33, max_abs=2e-6),))
    assert _kinds(a, within, signing_key) == []
    assert _kinds(a, beyond, signing_key) == ["error"]
    assert _kinds(a, beyond, signing_key, Thresholds(error_growth=1.5)) == []
    # A shrinking error is an improvement, never a regression.
    assert _kinds(beyond, a, signing_key) == []


def test_growth_far_below_atol_is_noise(signing_key: Ed25519PrivateKey) -> None:
    # From 0 to 1e-9 is "infinitely" more, but 1e-9 is 1e-4 of atol (1e-5).
    a = make_report(probes=(make_probe(33, max_abs=0.0),))
    b = make_report(probes=(make_probe(33, max_abs=1e-9),))
    assert _kinds(a, b, signing_key) == []


def test_error_turning_nan_regresses(signing_key: Ed25519PrivateKey) -> None:
    probe = make_probe(33)
    nan = dataclasses.replace(probe, metrics={
        "y": dataclasses.replace(probe.metrics["y"], max_abs=float("nan"))})  # fmt: skip
    diff = diff_certificates(_contents(make_report(probes=(probe,)), signing_key),
                             _contents(make_report(probes=(nan,)), signing_key))  # fmt: skip
    assert [r.kind for r in diff.regressions] == ["error"]
    row = next(e for e in diff.to_json()["errors"] if e["metric"] == "max_abs")
    assert (row["b"], row["delta"]) == ("nan", None)
    json.dumps(diff.to_json(), allow_nan=False)  # the JSON form stays strict JSON


def test_check_and_verdict_changes(signing_key: Ed25519PrivateKey) -> None:
    a = make_report(failing={"timing": "slow"})
    b = make_report(failing={"bounds": "wrote 4 bytes past y"})
    diff = diff_certificates(_contents(a, signing_key), _contents(b, signing_key))
    assert {(c.field, c.a, c.b) for c in diff.checks} == {
        ("bounds", "pass", "fail"), ("timing", "fail", "pass")}  # fmt: skip
    assert diff.verdict is None  # fail in both
    assert [r.message for r in diff.regressions] == ["check bounds passed in A and fails in B"]
    assert _kinds(make_report(), b, signing_key) == ["verdict", "check"]


def test_artifact_growth_regresses(signing_key: Ed25519PrivateKey) -> None:
    a = make_report(resources=make_resources(registers=32))
    more_registers = make_report(resources=make_resources(registers=40))
    spills = make_report(resources=make_resources(registers=32, spill_stores=8))
    fewer = make_report(resources=make_resources(registers=24))
    assert _kinds(a, more_registers, signing_key) == ["artifact"]
    assert _kinds(a, spills, signing_key) == ["artifact", "artifact"]  # stores and loads
    assert _kinds(a, fewer, signing_key) == []
    diff = diff_certificates(_contents(a, signing_key), _contents(fewer, signing_key))
    registers = next(d for d in diff.artifact if d.field == "registers")
    assert (registers.a, registers.b, registers.delta) == (32, 24, -8)


def test_slowdown_beyond_threshold_regresses(signing_key: Ed25519PrivateKey) -> None:
    a = make_report(timing=make_timing(kernel_ms=1.0))
    slightly = make_report(timing=make_timing(kernel_ms=1.05))
    much = make_report(timing=make_timing(kernel_ms=1.5))
    assert _kinds(a, slightly, signing_key) == []
    assert _kinds(a, much, signing_key) == ["timing"]
    assert _kinds(a, much, signing_key, Thresholds(slowdown=0.6)) == []
    diff = diff_certificates(_contents(a, signing_key), _contents(much, signing_key))
    median = next(d for d in diff.timing if d.field == "kernel.median_ms")
    assert median.ratio == pytest.approx(1.5)


def test_times_from_different_hardware_are_shown_but_not_judged(
    signing_key: Ed25519PrivateKey,
) -> None:
    gpu = make_report(timing=make_timing(kernel_ms=0.01))
    cpu = make_report(cuda=False, timing=make_timing(kernel_ms=50.0))
    diff = diff_certificates(_contents(gpu, signing_key), _contents(cpu, signing_key))
    assert "timing" not in [r.kind for r in diff.regressions]
    assert any(d.field == "kernel.median_ms" for d in diff.timing)
    fields = {c.field for c in diff.environment}
    assert {"hardware.class", "hardware.executor"} <= fields


def test_environment_differences(signing_key: Ed25519PrivateKey) -> None:
    env_a = {"gpu_name": "H100", "driver": "580.65", "numpy": "2.3.0"}
    env_b = {"gpu_name": "H100", "driver": "580.82", "triton": "3.9.0"}
    diff = diff_certificates(_contents(make_report(environment=env_a), signing_key),
                             _contents(make_report(environment=env_b), signing_key))  # fmt: skip
    changes = {c.field: (c.a, c.b) for c in diff.environment}
    fingerprint_a, fingerprint_b = changes.pop("fingerprint")
    assert fingerprint_a != fingerprint_b
    assert changes == {
        "environment.driver": ("580.65", "580.82"),
        "environment.numpy": ("2.3.0", None),
        "environment.triton": (None, "3.9.0"),
    }
    assert not diff.regressed  # a new environment alone is not a regression


def test_json_form(signing_key: Ed25519PrivateKey) -> None:
    a = _contents(make_report(), signing_key)
    b = _contents(make_report(resources=make_resources(registers=40)), signing_key)
    document = diff_certificates(a, b).to_json()
    assert document["a"] == str(a.id) and document["b"] == str(b.id)
    assert document["regressed"] is True
    assert document["regressions"] == [
        {"kind": "artifact", "message": "registers grew from 16 to 40"}]  # fmt: skip
    assert set(document) >= {"kernel", "verdict", "checks", "errors", "artifact", "timing",
                             "environment", "thresholds", "probes_only_in_a"}  # fmt: skip

"""The registry library on SQLite and PostgreSQL: store, trust, drift, promote, gate, revoke."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, func
from sqlmodel import col, select

from kcert.attest.dsse import Envelope, Signature
from kcert.attest.keys import generate_private_key, key_id, public_key_hex
from kcert.digest import Digest
from kcert.registry.audit import read_entries
from kcert.registry.certificates import get_certificate
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.db import read_session, write_session
from kcert.registry.errors import CertificateRejected, KeyConflict, NotFound, PromotionDenied
from kcert.registry.log_models import LogEntry
from kcert.registry.models import CertificateSubject, Promotion, TargetCreate, TrustedKeyCreate
from kcert.registry.policy import PromotionInputs, decide_promotion
from kcert.registry.testing import gpu_environment, make_certificate


def trust(registry: EmbeddedRegistry, key: Ed25519PrivateKey, name: str = "ci") -> str:
    public = key.public_key()
    registry.trust_key(TrustedKeyCreate(name=name, public_key=public_key_hex(public)))
    return key_id(public)


def report(registry: EmbeddedRegistry, name: str = "prod", **env: object) -> str:
    reported = registry.report_target(
        name, TargetCreate(hw_class="H100", environment=gpu_environment(**env))
    )
    return reported.fingerprint


def log_kinds(engine: Engine) -> list[str]:
    with read_session(engine) as session:
        return list(session.exec(select(LogEntry.kind).order_by(col(LogEntry.leaf_index))).all())


def test_a_certificate_from_an_untrusted_key_is_refused(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    cert = make_certificate(signing_key)
    with pytest.raises(CertificateRejected, match="untrusted|no trusted keys"):
        registry.push(cert.envelope)


def test_store_is_idempotent_and_indexed_by_every_subject(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    first = registry.push(cert.envelope)
    again = registry.push(cert.envelope)
    assert first.created and not again.created
    assert first.id == again.id == cert.id
    assert first.subjects == [cert.kernel]
    with read_session(engine) as session:
        count = session.exec(select(func.count()).select_from(CertificateSubject)).one()
    assert count == 1
    assert log_kinds(engine).count("certificate.stored") == 1


def test_a_tampered_signature_is_refused(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    envelope = make_certificate(signing_key).envelope
    sig = envelope.signatures[0]
    flipped = bytes([sig.sig[0] ^ 1]) + sig.sig[1:]
    bad = Envelope(envelope.payload_type, envelope.payload, (Signature(flipped, sig.keyid),))
    with pytest.raises(CertificateRejected, match="bad signature"):
        registry.push(bad)


def test_a_revoked_key_cannot_push_or_be_trusted_again(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    keyid = trust(registry, signing_key)
    registry.revoke_key(keyid, "leaked")
    with pytest.raises(CertificateRejected, match="revoked"):
        registry.push(make_certificate(signing_key).envelope)
    with pytest.raises(KeyConflict):
        trust(registry, signing_key)


def test_the_whole_flow_with_drift(registry: EmbeddedRegistry, engine: Engine) -> None:
    key = generate_private_key()
    trust(registry, key)
    cert = make_certificate(key)
    registry.push(cert.envelope)
    kernel = Digest.parse(cert.kernel)
    report(registry)
    assert not registry.gate(kernel, "prod").allow  # certified but not promoted yet
    promotion = registry.promote(kernel, "prod")
    assert promotion.status == "active" and promotion.certificate == cert.id
    gate = registry.gate(kernel, "prod")
    assert gate.allow and gate.certificate == cert.id

    drifted = registry.report_target(
        "prod", TargetCreate(hw_class="H100", environment=gpu_environment(driver_version="999.1"))
    )
    assert drifted.changed and drifted.stale_certificates == [cert.id]
    assert drifted.suspended_promotions == [cert.kernel]
    assert [h.generation for h in drifted.history] == [1, 2]
    gate = registry.gate(kernel, "prod")
    assert not gate.allow
    assert any("suspended" in r for r in gate.reasons)
    assert any("(stale)" in r for r in gate.reasons)
    with pytest.raises(PromotionDenied) as denied:
        registry.promote(kernel, "prod")
    assert any("(stale)" in r for r in denied.value.reasons)
    assert denied.value.log_index is not None

    kinds = log_kinds(engine)
    for kind in ("key.trusted", "certificate.stored", "target.reported", "promotion.granted",
                 "certificate.invalidated", "promotion.suspended", "promotion.denied"):  # fmt: skip
        assert kind in kinds, kind


def test_a_sideways_report_changes_nothing_and_drift_back_needs_a_new_promotion(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    kernel = Digest.parse(cert.kernel)
    report(registry)
    registry.promote(kernel, "prod")
    # A field outside the drift set changes: same fingerprint, nothing goes stale.
    same = registry.report_target(
        "prod", TargetCreate(hw_class="H100", environment=gpu_environment(os="Linux-6.9"))
    )
    assert not same.changed and same.stale_certificates == []
    assert registry.gate(kernel, "prod").allow
    report(registry, driver_version="1.0")
    report(registry)  # back where it was: the certificate is valid again ...
    assert not registry.gate(kernel, "prod").allow  # ... but the promotion stays suspended
    registry.promote(kernel, "prod")
    assert registry.gate(kernel, "prod").allow


def test_custom_drift_fields_decide_what_is_drift(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    kernel = Digest.parse(cert.kernel)
    only_gpu = ["gpu_name", "compute_capability"]
    env = gpu_environment()
    registry.report_target("edge", TargetCreate(hw_class="H100", environment=env,
                                                drift_fields=only_gpu))  # fmt: skip
    registry.promote(kernel, "edge")
    newer_driver = gpu_environment(driver_version="999.1")
    same = registry.report_target(
        "edge", TargetCreate(hw_class="H100", environment=newer_driver, drift_fields=only_gpu)
    )
    assert not same.changed
    assert registry.gate(kernel, "edge").allow
    other_gpu = gpu_environment(gpu_name="NVIDIA H100 PCIe")
    moved = registry.report_target(
        "edge", TargetCreate(hw_class="H100", environment=other_gpu, drift_fields=only_gpu)
    )
    assert moved.stale_certificates == [cert.id]
    assert not registry.gate(kernel, "edge").allow


def test_hardware_class_and_verdict_must_match(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    failed = make_certificate(signing_key, failing={"correctness": "n=33: 3 bad elements"})
    registry.push(failed.envelope)  # evidence of a rejection is stored ...
    report(registry)
    with pytest.raises(PromotionDenied) as denied:  # ... but never promoted
        registry.promote(Digest.parse(failed.kernel), "prod")
    assert any("verdict is 'fail'" in r for r in denied.value.reasons)
    registry.report_target("a100s", TargetCreate(hw_class="A100", environment=gpu_environment()))
    good = make_certificate(signing_key)
    registry.push(good.envelope)
    with pytest.raises(PromotionDenied, match="denied") as wrong_hw:
        registry.promote(Digest.parse(good.kernel), "a100s")
    assert any("target is 'A100'" in r for r in wrong_hw.value.reasons)


def test_promotion_to_an_unknown_target_is_denied(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    with pytest.raises(PromotionDenied) as denied:
        registry.promote(Digest.parse(cert.kernel), "nowhere")
    assert any("has not reported" in r for r in denied.value.reasons)


def test_revoking_a_certificate_suspends_what_rested_on_it(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    kernel = Digest.parse(cert.kernel)
    report(registry)
    registry.promote(kernel, "prod")
    revoked = registry.revoke_certificate(cert.id, "wrong reference")
    assert revoked.revoke_reason == "wrong reference"
    gate = registry.gate(kernel, "prod")
    assert not gate.allow
    assert any("certificate is revoked" in r for r in gate.reasons)


def test_a_second_certificate_keeps_a_promotion_alive_through_one_revocation(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    other_key = generate_private_key()
    trust(registry, other_key, name="second")
    first = make_certificate(signing_key, source="one kernel")
    second = make_certificate(other_key, source="one kernel")
    registry.push(first.envelope)
    # The same statement signed by another key is the same certificate, co-signed.
    assert first.id == second.id
    cosigned = registry.push(second.envelope)
    assert not cosigned.created and cosigned.log_index is not None
    kernel = Digest.parse(first.kernel)
    report(registry)
    registry.promote(kernel, "prod")
    registry.revoke_key(key_id(signing_key.public_key()), "rotated")
    gate = registry.gate(kernel, "prod")
    assert gate.allow and gate.certificate == second.id
    with read_session(registry.engine) as session:
        signer = get_certificate(session=session, certificate=second.id).keyid
    assert signer == key_id(other_key.public_key())
    registry.revoke_key(key_id(other_key.public_key()), "rotated too")
    gate = registry.gate(kernel, "prod")
    assert not gate.allow
    assert any("is revoked" in r for r in gate.reasons)


def test_a_promotion_leaf_can_be_decided_again_from_what_it_recorded(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    report(registry)
    registry.promote(Digest.parse(cert.kernel), "prod")
    with read_session(engine) as session:
        leaves = [json.loads(r.leaf) for r in read_entries(session, 0, 100)]
    granted = [leaf for leaf in leaves if leaf["kind"] == "promotion.granted"]
    assert len(granted) == 1
    payload = granted[0]["payload"]
    inputs = PromotionInputs.from_json(payload["inputs"])
    assert inputs.candidates[0].id == cert.id
    assert decide_promotion(inputs).to_json() == payload["decision"]


def test_unknown_things_are_not_found(registry: EmbeddedRegistry) -> None:
    with pytest.raises(NotFound):
        registry.get_target("nope")
    with pytest.raises(NotFound):
        registry.revoke_certificate("sha256:" + "0" * 64, "x")
    with pytest.raises(NotFound):
        registry.revoke_key("0" * 64, "x")


def test_write_sessions_roll_back_with_their_log_leaf(engine: Engine) -> None:
    """A change and its leaf commit together: an aborted transaction leaves neither."""
    from kcert.registry import audit

    with write_session(engine) as session:
        audit.record_event(session, "key.trusted", {"keyid": "x"})
        session.rollback()
    assert log_kinds(engine) == []


def test_a_signed_certificate_with_oversized_fields_is_refused_not_a_server_error(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    """PostgreSQL enforces column lengths; the registry must refuse first, with a reason."""
    trust(registry, signing_key)
    cert = make_certificate(signing_key, hw_class="H" * 100)
    with pytest.raises(CertificateRejected, match="hardware class"):
        registry.push(cert.envelope)


NO_SANDBOX = (
    "certificate was made with --no-sandbox (or by a certifier that did not record its "
    "sandbox): the kernel's code could reach the certifier; certify it again without "
    "--no-sandbox"
)


@pytest.mark.parametrize(
    ("sandbox", "module_code"), [(False, False), (None, False), (False, True)],
    ids=["no-sandbox", "older-certifier", "no-sandbox-module-code"],
)  # fmt: skip
def test_a_certificate_not_made_in_the_sandbox_is_stored_but_never_promoted(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey,
    sandbox: bool | None, module_code: bool,
) -> None:  # fmt: skip
    trust(registry, signing_key)
    cert = make_certificate(signing_key, sandbox=sandbox, module_code=module_code)
    stored = registry.push(cert.envelope)  # stored: it is evidence of what was certified
    assert stored.created and stored.sandboxed is False
    with read_session(engine) as session:
        assert get_certificate(session=session, certificate=cert.id).sandboxed is False
    report(registry)
    kernel = Digest.parse(cert.kernel)
    with pytest.raises(PromotionDenied) as denied:
        registry.promote(kernel, "prod")
    assert list(denied.value.reasons) == [f"{cert.id}: {NO_SANDBOX}"]
    gate = registry.gate(kernel, "prod")
    assert not gate.allow and gate.certificate is None
    assert f"{cert.id}: {NO_SANDBOX}" in gate.reasons

    with read_session(engine) as session:
        leaves = [json.loads(r.leaf) for r in read_entries(session, 0, 100)]
    (stored_leaf,) = [leaf for leaf in leaves if leaf["kind"] == "certificate.stored"]
    assert stored_leaf["payload"]["sandboxed"] is False
    (denial,) = [leaf for leaf in leaves if leaf["kind"] == "promotion.denied"]
    assert denial["payload"]["inputs"]["candidates"][0]["sandboxed"] is False
    replayed = decide_promotion(PromotionInputs.from_json(denial["payload"]["inputs"]))
    assert replayed.to_json() == denial["payload"]["decision"]


@pytest.mark.parametrize("module_code", [False, True], ids=["module-checked", "module-code"])
def test_a_certificate_made_in_the_sandbox_is_promoted_and_allowed(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey,
    module_code: bool,
) -> None:  # fmt: skip
    trust(registry, signing_key)
    cert = make_certificate(signing_key, sandbox=True, module_code=module_code)
    assert registry.push(cert.envelope).sandboxed is True
    report(registry)
    kernel = Digest.parse(cert.kernel)
    assert registry.promote(kernel, "prod").certificate == cert.id
    gate = registry.gate(kernel, "prod")
    assert gate.allow and gate.certificate == cert.id
    with read_session(engine) as session:
        leaves = [json.loads(r.leaf) for r in read_entries(session, 0, 100)]
    (granted,) = [leaf for leaf in leaves if leaf["kind"] == "promotion.granted"]
    assert granted["payload"]["inputs"]["candidates"][0]["sandboxed"] is True


def test_a_promotion_resting_on_an_old_certificate_is_denied_by_the_gate(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    """A promotion granted before the registry checked the sandbox stays on record, but the
    gate decides under today's policy: an older certificate no longer lets it run."""
    trust(registry, signing_key)
    source = "kernel certified before certificates recorded their sandbox"
    old = make_certificate(signing_key, source=source, sandbox=None)
    registry.push(old.envelope)
    report(registry)
    with write_session(engine) as session:  # as a registry before this policy granted it
        session.add(Promotion(kernel=old.kernel, target_name="prod", status="active",
                              certificate_id=old.id))  # fmt: skip
        session.commit()
    gate = registry.gate(Digest.parse(old.kernel), "prod")
    assert not gate.allow
    assert gate.reasons == [f"{old.id}: {NO_SANDBOX}"]
    # Certifying the same kernel again, in the sandbox, is the way back.
    again = make_certificate(signing_key, source=source, sandbox=True)
    assert again.kernel == old.kernel and again.id != old.id
    registry.push(again.envelope)
    gate = registry.gate(Digest.parse(old.kernel), "prod")
    assert gate.allow and gate.certificate == again.id

"""Replaying every leaf in order: a decision must follow from the log's own history."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine
from sqlmodel import select

from kcert.attest.keys import public_key_hex
from kcert.digest import Digest
from kcert.log.leaf import LeafError, build_leaf, parse_leaf
from kcert.registry import audit
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.db import read_session, write_session
from kcert.registry.decisions import TargetState, decision_payload, gather_inputs
from kcert.registry.environment import target_fingerprint
from kcert.registry.history import replay_history
from kcert.registry.log_models import LogEntry
from kcert.registry.models import Target, TargetCreate, TrustedKeyCreate
from kcert.registry.policy import Candidate, PromotionInputs, decide_promotion
from kcert.registry.replay import replay_decision
from kcert.registry.testing import gpu_environment, make_certificate


@pytest.fixture
def registry(engine: Engine, database_url: str, signing_key: Ed25519PrivateKey) -> EmbeddedRegistry:
    reg = EmbeddedRegistry(Settings(database_url=database_url), engine=engine)
    reg.trust_key(TrustedKeyCreate(name="ci", public_key=public_key_hex(signing_key.public_key())))
    reg.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    return reg


def leaves(engine: Engine) -> list[tuple[int, bytes]]:
    with read_session(engine) as session:
        rows = session.exec(select(LogEntry.leaf_index, LogEntry.leaf)).all()
    return sorted((int(i), bytes(leaf)) for i, leaf in rows)


def test_an_ordinary_history_replays_the_same(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    kept, revoked = make_certificate(signing_key), make_certificate(signing_key)
    for cert in (kept, revoked):
        registry.push(cert.envelope)
        registry.promote(Digest.parse(cert.kernel), "prod")
    registry.revoke_certificate(revoked.id, "bad")
    env = gpu_environment(driver_version="1.0")
    registry.report_target("prod", TargetCreate(hw_class="H100", environment=env))
    result = replay_history(leaves(engine))
    assert result.same, result.differences
    assert result.decisions == 4  # two grants, two suspensions
    state = result.state
    assert state.certificates[revoked.id].revoked
    assert {(k, s.status) for (k, _), s in state.promotions.items()} == {
        (kept.kernel, "suspended"),
        (revoked.kernel, "suspended"),
    }
    assert (kept.id, "prod", 2) in state.stale


def test_a_grant_decided_before_a_logged_revocation_is_named(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    """The interleaving of issue 14's race, written deliberately: the promotion read the
    certificates, the revocation committed, then the promotion logged its grant."""
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    with read_session(engine) as session:
        target = TargetState.of(session.get(Target, "prod"))
        inputs = gather_inputs(
            session, kernel=cert.kernel, target_name="prod", target=target, full_key_set=True
        )
    registry.revoke_certificate(cert.id, "compromised")
    decision = decide_promotion(inputs)
    assert decision.allow
    with write_session(engine) as session:
        index = audit.record_event(
            session, audit.PROMOTION_GRANTED, decision_payload(inputs, decision)
        )
        session.commit()
    entries = leaves(engine)
    # The leaf alone re-decides the same way: that is what `audit replay N` checks.
    assert replay_decision(parse_leaf(index, entries[index][1])).same
    result = replay_history(entries)
    messages = [d.message for d in result.differences if d.index == index]
    assert f"revoked_certificates: recorded [], the log's history gives ['{cert.id}']" in messages
    assert f"decision: recorded allow ({cert.id}), the log's history gives deny" in messages
    assert all(d.index == index for d in result.differences)


def test_a_missing_leaf_stops_the_history() -> None:
    with pytest.raises(LeafError, match="entry 0 is missing"):
        replay_history([(1, b"{}")])


def _leaves(*events: tuple[str, dict[str, object]]) -> list[tuple[int, bytes]]:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        (i, build_leaf(index=i, kind=kind, payload=payload, time=when))
        for i, (kind, payload) in enumerate(events)
    ]


def _pre_0004_log(*, revoke_hinted: bool) -> list[tuple[int, bytes]]:
    """One statement stored under two old ids (a keyid hint changed), as before 0004."""
    kernel, plain, hinted = "sha256:" + "a" * 64, "sha256:" + "1" * 64, "sha256:" + "2" * 64
    env = gpu_environment()
    fp = target_fingerprint(env, None)
    stored = {"keyid": "k" * 64, "subjects": [kernel], "verdict": "pass", "hw_class": "H100",
              "fingerprint": fp, "sandboxed": True}  # fmt: skip
    events: list[tuple[str, dict[str, object]]] = [
        (audit.KEY_TRUSTED, {"keyid": "k" * 64, "name": "ci", "public_key": "p" * 64}),
        (audit.CERTIFICATE_STORED, {"certificate": plain, **stored}),
        (audit.CERTIFICATE_STORED, {"certificate": hinted, **stored}),
        (audit.FINGERPRINT_REPORTED, {"target": "prod", "generation": 1, "hw_class": "H100",
                                      "fingerprint": fp, "drift_fields": None}),
    ]  # fmt: skip
    if revoke_hinted:
        events.append((audit.CERTIFICATE_REVOKED, {"certificate": hinted, "reason": "bad"}))
    candidates = tuple(
        Candidate(id=c, keyid="k" * 64, verdict="pass", hw_class="H100", fingerprint=fp,
                  sandboxed=True)
        for c in (hinted, plain)
    )  # fmt: skip
    inputs = PromotionInputs(
        kernel=kernel, target="prod", target_hw_class="H100", target_fingerprint=fp,
        trusted_keys=("k" * 64,), revoked_keys=(),
        revoked_certificates=(hinted,) if revoke_hinted else (), candidates=candidates,
    )  # fmt: skip
    events.append((audit.PROMOTION_GRANTED, decision_payload(inputs, decide_promotion(inputs))))
    return _leaves(*events)


def test_entries_from_before_the_pae_id_fold_through_the_aliases() -> None:
    new = "sha256:" + "9" * 64
    aliases = {"sha256:" + "1" * 64: new, "sha256:" + "2" * 64: new}
    plain = replay_history(_pre_0004_log(revoke_hinted=False), aliases=aliases)
    assert plain.same, plain.differences
    assert list(plain.state.certificates) == [new]
    (promotion,) = plain.state.promotions.values()
    assert promotion.certificate == new
    # Granted on one old id while the other, the same statement, was revoked: the
    # revocation bypass of issue 14's first finding, named once the ids are one.
    bypass = replay_history(_pre_0004_log(revoke_hinted=True), aliases=aliases)
    decision, end = bypass.differences
    assert decision.message == f"decision: recorded allow ({new}), the log's history gives deny"
    assert "is still active at the end of the log" in end.message
    # Without the aliases the old ids are two certificates and the grant followed.
    assert replay_history(_pre_0004_log(revoke_hinted=True)).same


def test_a_change_logged_without_its_suspension_is_named() -> None:
    """Revocations whose transactions left the promotion active (no suspension leaf)."""
    log = _pre_0004_log(revoke_hinted=False)
    events = [
        (audit.CERTIFICATE_REVOKED, {"certificate": "sha256:" + c * 64, "reason": "bad"})
        for c in "12"
    ]
    revoked = _leaves(*([("x.y", {})] * len(log)), *events)[len(log) :]
    result = replay_history([*log, *revoked])
    (difference,) = result.differences
    assert difference.index == len(log) - 1  # the grant
    assert difference.message.startswith(
        f"promotion of sha256:{'a' * 64} on 'prod' is still active at the end of the log, "
        "which leaves it no valid certificate: "
    )


def test_a_decision_whose_inputs_contradict_themselves_is_a_difference() -> None:
    log = _pre_0004_log(revoke_hinted=False)
    index, data = log[-1]
    leaf = json.loads(data)
    leaf["payload"]["inputs"]["trusted_keys_digest"] = "sha256:" + "0" * 64
    edited = build_leaf(index=index, kind=leaf["kind"], payload=leaf["payload"],
                        time=datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip
    (difference,) = replay_history([*log[:-1], (index, edited)]).differences
    assert difference.index == index
    assert "trusted_keys_digest does not match" in difference.message

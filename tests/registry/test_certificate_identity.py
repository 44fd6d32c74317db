"""One signed statement is one certificate: unsigned fields never make a new one.

The id is ``sha256`` of the DSSE PAE (the signed bytes). These tests push the
same certificate with every unsigned field changed, and random byte flips of
it, and check that the registry stores one row with one canonical envelope,
logs only real state changes, and keeps a revoked certificate revoked.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, func
from sqlmodel import select
from test_registry import trust

from kcert.attest.certificate import certificate_id, parse_envelope
from kcert.attest.dsse import Envelope, Signature
from kcert.attest.errors import CertificateFormatError
from kcert.attest.keys import generate_private_key, key_id
from kcert.digest import Digest
from kcert.registry.certificates import get_envelope
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.db import read_session
from kcert.registry.errors import CertificateRejected, PromotionDenied
from kcert.registry.log_models import LogEntry
from kcert.registry.models import Certificate, CertificateSubject, TargetCreate
from kcert.registry.testing import MadeCertificate, gpu_environment, make_certificate


def counts(engine: Engine) -> tuple[int, int, int]:
    """(certificate rows, subject rows, log leaves)."""
    with read_session(engine) as session:
        return (
            session.exec(select(func.count()).select_from(Certificate)).one(),
            session.exec(select(func.count()).select_from(CertificateSubject)).one(),
            session.exec(select(func.count()).select_from(LogEntry)).one(),
        )


def stored_envelope(engine: Engine, cid: str) -> dict[str, Any]:
    with read_session(engine) as session:
        return get_envelope(session=session, certificate=cid)


def variants(cert: MadeCertificate, stranger: Ed25519PrivateKey) -> dict[str, Envelope]:
    """The certificate with each field no signature covers changed."""
    envelope = cert.envelope
    (mine,) = envelope.signatures
    foreign = Signature(stranger.sign(envelope.pae()), key_id(stranger.public_key()))
    document = envelope.to_json()

    def sigs(*signatures: Signature) -> Envelope:
        return Envelope(envelope.payload_type, envelope.payload, signatures)

    def relaid(text: str) -> Envelope:
        return parse_envelope(text.encode())

    return {
        "keyid hint changed": sigs(Signature(mine.sig, "0" * 64)),
        "keyid hint names the stranger": sigs(Signature(mine.sig, foreign.keyid)),
        "keyid hint dropped": sigs(Signature(mine.sig, None)),
        "signature repeated": sigs(mine, mine),
        "extra signature by an untrusted key": sigs(foreign, mine),
        "extra garbage signature": sigs(mine, Signature(b"\1" * 64, "f" * 64)),
        "other whitespace and key order": relaid(json.dumps(document, indent=7, sort_keys=True)),
        "url-safe base64": relaid(json.dumps({
            **document,
            "payload": base64.urlsafe_b64encode(envelope.payload).decode().rstrip("="),
        })),  # fmt: skip
    }


def test_revoke_then_repush_with_a_changed_keyid_does_not_bypass_revocation(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    """The reported attack: revoke, re-push with ``keyid`` changed, promote, gate."""
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    registry.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    registry.revoke_certificate(cert.id, "bad tail mask")
    (mine,) = cert.envelope.signatures
    for hint in ("0" * 64, None, "attacker"):
        respelled = Envelope(
            cert.envelope.payload_type, cert.envelope.payload, (Signature(mine.sig, hint),)
        )
        again = registry.push(respelled)
        assert again.id == cert.id and not again.created
        assert again.revoked_at is not None and again.revoke_reason == "bad tail mask"
    kernel = Digest.parse(cert.kernel)
    with pytest.raises(PromotionDenied) as denied:
        registry.promote(kernel, "prod")
    assert any("revoked" in r for r in denied.value.reasons)
    gate = registry.gate(kernel, "prod")
    assert not gate.allow
    assert any("revoked" in r for r in gate.reasons)


def test_a_revoked_certificate_takes_no_new_signatures(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    other = generate_private_key()
    trust(registry, other, name="second")
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    registry.revoke_certificate(cert.id, "withdrawn")
    before = counts(engine)
    cosigned = Envelope(cert.envelope.payload_type, cert.envelope.payload,
                        (Signature(other.sign(cert.envelope.pae()), None),))  # fmt: skip
    again = registry.push(cosigned)
    assert again.revoked_at is not None and again.log_index is None
    assert counts(engine) == before
    assert len(stored_envelope(engine, cert.id)["signatures"]) == 1


def test_unsigned_changes_map_to_the_same_certificate_and_write_nothing(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    keyid = trust(registry, signing_key)
    cert = make_certificate(signing_key)
    first = registry.push(cert.envelope)
    assert first.created and first.id == cert.id
    canonical = stored_envelope(engine, cert.id)
    assert [s["keyid"] for s in canonical["signatures"]] == [keyid]
    before = counts(engine)
    for what, envelope in variants(cert, generate_private_key()).items():
        assert str(certificate_id(envelope)) == cert.id, what
        again = registry.push(envelope)
        assert (again.id, again.created, again.log_index) == (cert.id, False, None), what
        assert counts(engine) == before, what
        assert stored_envelope(engine, cert.id) == canonical, what


def test_a_repush_signed_only_by_strangers_is_the_stored_certificate(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    """The signed bytes were verified when first stored; the stranger's signature is dropped."""
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    canonical, before = stored_envelope(engine, cert.id), counts(engine)
    stranger = generate_private_key()
    only_theirs = Envelope(cert.envelope.payload_type, cert.envelope.payload,
                           (Signature(stranger.sign(cert.envelope.pae()), None),))  # fmt: skip
    assert registry.push(only_theirs).id == cert.id
    assert (counts(engine), stored_envelope(engine, cert.id)) == (before, canonical)
    # A statement the registry has never seen still needs a trusted signature.
    new = make_certificate(stranger)
    with pytest.raises(CertificateRejected, match="untrusted"):
        registry.push(new.envelope)


def test_a_signature_by_a_second_trusted_key_is_merged_once(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    first_key = trust(registry, signing_key)
    other = generate_private_key()
    second_key = trust(registry, other, name="second")
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    rows, subjects, leaves = counts(engine)
    theirs = Signature(other.sign(cert.envelope.pae()), "a hint that lies")
    both = Envelope(cert.envelope.payload_type, cert.envelope.payload,
                    (theirs, *cert.envelope.signatures))  # fmt: skip
    merged = registry.push(both)
    assert merged.id == cert.id and not merged.created and merged.log_index == leaves
    assert merged.keyid == first_key
    assert counts(engine) == (rows, subjects, leaves + 1)
    signatures = stored_envelope(engine, cert.id)["signatures"]
    assert [s["keyid"] for s in signatures] == sorted([first_key, second_key])
    with read_session(engine) as session:
        leaf = session.exec(select(LogEntry).where(LogEntry.leaf_index == leaves)).one()
    assert leaf.kind == "certificate.cosigned"
    # Nothing new the second time, whichever signatures come along.
    again = registry.push(both)
    assert again.log_index is None and counts(engine) == (rows, subjects, leaves + 1)


def test_random_byte_flips_never_store_a_new_certificate(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    trust(registry, signing_key)
    cert = make_certificate(signing_key)
    registry.push(cert.envelope)
    data = cert.envelope.to_bytes()
    before = counts(engine)
    rng = random.Random(20261122)
    outcomes = {"refused": 0, "same": 0}
    for _ in range(200):
        flipped = bytearray(data)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        try:
            envelope = parse_envelope(bytes(flipped))
            stored = registry.push(envelope)
        except (CertificateFormatError, CertificateRejected):
            outcomes["refused"] += 1
            continue
        assert stored.id == cert.id and not stored.created
        outcomes["same"] += 1
    assert counts(engine) == before
    assert outcomes["refused"] and outcomes["same"], outcomes

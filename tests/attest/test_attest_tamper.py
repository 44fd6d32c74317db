"""Every single-byte change to a signed certificate is refused; no unsigned change renames it.

Exhaustive on a small certificate: each byte of the decoded payload is
changed (eight single-bit flips per byte, which include the smallest
possible edits), and each byte of the signature takes every one of its 255
other values. Each variant goes through the whole path a pushed certificate
takes: JSON bytes -> parse_envelope -> verify_envelope.

The other half: every field no signature covers (a signature's ``keyid``
hint, extra, repeated, dropped-but-one or reordered signatures, JSON layout,
key order and base64 spelling) is changed in turn, and the id stays the same
and the canonical envelope the registry would store stays the same.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from attest_report_factory import make_probe, make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kcert.attest.certificate import (
    canonical_envelope,
    certificate_id,
    parse_envelope,
    sign_report,
    verify_envelope,
)
from kcert.attest.dsse import Envelope, Signature, pae
from kcert.attest.errors import VerificationError
from kcert.attest.keys import generate_private_key, key_id
from kcert.digest import Digest


def _small_envelope_json(key: Ed25519PrivateKey) -> dict[str, object]:
    report = make_report(cuda=False, probes=(make_probe(1),))
    return sign_report(report, key).to_json()


def _with(document: dict[str, object], *, payload: bytes | None = None,
          sig: bytes | None = None) -> bytes:  # fmt: skip
    out = json.loads(json.dumps(document))
    if payload is not None:
        out["payload"] = base64.b64encode(payload).decode()
    if sig is not None:
        out["signatures"][0]["sig"] = base64.b64encode(sig).decode()
    return json.dumps(out).encode()


def test_untouched_small_certificate_verifies(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    document = _small_envelope_json(signing_key)
    verify_envelope(parse_envelope(json.dumps(document).encode()), trusted)


def test_every_payload_byte_change_is_refused(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    document = _small_envelope_json(signing_key)
    payload = base64.b64decode(str(document["payload"]))
    assert 500 < len(payload) < 4000, "the test is meant for a small certificate"
    refused = 0
    for index in range(len(payload)):
        for bit in range(8):
            changed = bytearray(payload)
            changed[index] ^= 1 << bit
            envelope = parse_envelope(_with(document, payload=bytes(changed)))
            with pytest.raises(VerificationError, match="bad signature"):
                verify_envelope(envelope, trusted)
            refused += 1
    assert refused == 8 * len(payload)


def test_truncated_or_extended_payload_is_refused(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    document = _small_envelope_json(signing_key)
    payload = base64.b64decode(str(document["payload"]))
    for changed in (payload[:-1], payload[1:], payload + b" ", b" " + payload):
        with pytest.raises(VerificationError, match="bad signature"):
            verify_envelope(parse_envelope(_with(document, payload=changed)), trusted)


def test_every_signature_byte_change_is_refused(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    document = _small_envelope_json(signing_key)
    signatures = document["signatures"]
    assert isinstance(signatures, list)
    sig = base64.b64decode(signatures[0]["sig"])
    assert len(sig) == 64
    for index in range(len(sig)):
        for value in range(256):
            if value == sig[index]:
                continue
            changed = bytearray(sig)
            changed[index] = value
            envelope = parse_envelope(_with(document, sig=bytes(changed)))
            with pytest.raises(VerificationError, match="bad signature"):
                verify_envelope(envelope, trusted)
    for short in (sig[:-1], sig + b"\0", b""):
        with pytest.raises(VerificationError, match="bad signature"):
            verify_envelope(parse_envelope(_with(document, sig=short)), trusted)


def test_changed_payload_type_is_refused(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    document = _small_envelope_json(signing_key)
    for kind in ("application/vnd.in-toto+jsoN", "application/json", ""):
        changed = json.loads(json.dumps(document))
        changed["payloadType"] = kind
        with pytest.raises(VerificationError, match="bad signature"):
            verify_envelope(parse_envelope(json.dumps(changed).encode()), trusted)


def _unsigned_variants(
    document: dict[str, Any], stranger: Ed25519PrivateKey
) -> dict[str, bytes]:
    """The same signed statement with each unsigned field of the envelope changed."""
    payload = base64.b64decode(str(document["payload"]))
    (signature,) = document["signatures"]
    foreign = {
        "keyid": key_id(stranger.public_key()),
        "sig": base64.b64encode(stranger.sign(pae(str(document["payloadType"]), payload)))
        .decode(),
    }  # fmt: skip
    garbage = {"keyid": "f" * 64, "sig": base64.b64encode(b"\x01" * 64).decode()}

    def with_signatures(*signatures: dict[str, str]) -> bytes:
        return json.dumps({**document, "signatures": list(signatures)}).encode()

    urlsafe = dict(signature, sig=base64.urlsafe_b64encode(
        base64.b64decode(signature["sig"])).decode().rstrip("="))  # fmt: skip
    return {
        "keyid hint changed": with_signatures(dict(signature, keyid="0" * 64)),
        "keyid hint names another key": with_signatures(dict(signature, keyid=foreign["keyid"])),
        "keyid hint removed": with_signatures({"sig": signature["sig"]}),
        "keyid hint empty": with_signatures(dict(signature, keyid="")),
        "signature repeated": with_signatures(signature, signature),
        "signature repeated, other hint": with_signatures(signature, dict(signature, keyid="x")),
        "extra signature by an untrusted key": with_signatures(signature, foreign),
        "extra signature first": with_signatures(foreign, signature),
        "extra garbage signature": with_signatures(garbage, signature),
        "indented, keys sorted": json.dumps(document, indent=4, sort_keys=True).encode(),
        "compact, keys reversed": json.dumps(
            dict(reversed(list(document.items()))), separators=(",", ":")
        ).encode(),
        "signature keys reordered": with_signatures({"keyid": signature["keyid"],
                                                     "sig": signature["sig"]}),  # fmt: skip
        "url-safe base64, no padding": json.dumps({
            **document, "payload": base64.urlsafe_b64encode(payload).decode().rstrip("="),
            "signatures": [urlsafe],
        }).encode(),  # fmt: skip
    }


def test_no_unsigned_field_changes_the_id_or_the_canonical_envelope(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    document = _small_envelope_json(signing_key)
    original = parse_envelope(json.dumps(document).encode())
    expected = certificate_id(original)
    assert expected == Digest.of_bytes(original.pae())
    canonical = canonical_envelope(original, trusted)
    assert canonical.signatures == original.signatures
    variants = _unsigned_variants(document, generate_private_key())
    for what, data in variants.items():
        envelope = parse_envelope(data)
        assert certificate_id(envelope) == expected, what
        assert verify_envelope(envelope, trusted).id == expected, what
        assert canonical_envelope(envelope, trusted) == canonical, what
    assert len({*variants.values(), json.dumps(document).encode()}) == len(variants) + 1


def test_every_signed_change_changes_the_id(signing_key: Ed25519PrivateKey) -> None:
    document = _small_envelope_json(signing_key)
    payload = base64.b64decode(str(document["payload"]))
    expected = certificate_id(parse_envelope(json.dumps(document).encode()))
    ids = {expected}
    for index in range(len(payload)):
        changed = bytearray(payload)
        changed[index] ^= 1
        ids.add(certificate_id(parse_envelope(_with(document, payload=bytes(changed)))))
    kinds = ("application/json", "")
    for kind in kinds:
        ids.add(certificate_id(parse_envelope(json.dumps({**document, "payloadType": kind})
                                              .encode())))  # fmt: skip
    assert len(ids) == 1 + len(payload) + len(kinds)


def test_canonical_envelope_keeps_one_signature_per_trusted_key_named_by_its_real_id(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    second = generate_private_key()
    both = {**trusted, key_id(second.public_key()): second.public_key()}
    envelope = sign_report(make_report(cuda=False, probes=(make_probe(1),)), signing_key)
    (mine,) = envelope.signatures
    theirs = Signature(second.sign(envelope.pae()), keyid="a hint that lies")
    signatures = (theirs, Signature(mine.sig, None), mine, Signature(b"\0" * 64, "x"))
    noisy = Envelope(envelope.payload_type, envelope.payload, signatures)
    canonical = canonical_envelope(noisy, both)
    assert [s.keyid for s in canonical.signatures] == sorted(both)
    assert {s.sig for s in canonical.signatures} == {mine.sig, theirs.sig}
    assert [s.keyid for s in canonical_envelope(noisy, trusted).signatures] == list(trusted)
    assert canonical_envelope(noisy, {}).signatures == ()

"""Every single-byte change to a signed certificate is refused.

Exhaustive on a small certificate: each byte of the decoded payload is
changed (eight single-bit flips per byte, which include the smallest
possible edits), and each byte of the signature takes every one of its 255
other values. Each variant goes through the whole path a pushed certificate
takes: JSON bytes -> parse_envelope -> verify_envelope.
"""

from __future__ import annotations

import base64
import json

import pytest
from attest_report_factory import make_probe, make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kcert.attest.certificate import parse_envelope, sign_report, verify_envelope
from kcert.attest.errors import VerificationError


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

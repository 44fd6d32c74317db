"""kcert and securesystemslib's DSSE implementation accept each other's envelopes.

securesystemslib matches signatures to keys by keyid, so its key is given
kcert's key id (hex SHA-256 of the raw public key).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from attest_report_factory import make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from securesystemslib import exceptions as sslib_exceptions
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.signer import (  # type: ignore[attr-defined]  # no __all__ there
    CryptoSigner,
    SSlibKey,
)

from kcert.attest.certificate import parse_envelope, report_subjects, sign_report, verify_envelope
from kcert.attest.errors import VerificationError
from kcert.attest.keys import generate_private_key, key_id, public_key_hex
from kcert.attest.statement import PAYLOAD_TYPE, make_statement


def sslib_key(public_key: Ed25519PublicKey) -> SSlibKey:
    return SSlibKey.from_crypto(public_key, keyid=key_id(public_key), scheme="ed25519")


def test_securesystemslib_key_is_the_same_key(signing_key: Ed25519PrivateKey) -> None:
    key = sslib_key(signing_key.public_key())
    assert key.keytype == "ed25519"
    assert key.keyval["public"] == public_key_hex(signing_key.public_key())


@pytest.mark.parametrize("cuda", [True, False])
def test_securesystemslib_verifies_kcert_envelopes(
    signing_key: Ed25519PrivateKey, cuda: bool
) -> None:
    envelope = sign_report(make_report(cuda=cuda), signing_key)
    theirs = SslibEnvelope.from_dict(json.loads(envelope.to_bytes()))
    accepted = theirs.verify([sslib_key(signing_key.public_key())], 1)
    assert list(accepted) == [key_id(signing_key.public_key())]
    assert theirs.payload == envelope.payload
    assert theirs.pae() == envelope.pae()


def test_securesystemslib_refuses_a_tampered_kcert_envelope(
    signing_key: Ed25519PrivateKey,
) -> None:
    document: dict[str, Any] = sign_report(make_report(), signing_key).to_json()
    document["payloadType"] = "application/json"
    theirs = SslibEnvelope.from_dict(document)
    with pytest.raises(sslib_exceptions.VerificationError):
        theirs.verify([sslib_key(signing_key.public_key())], 1)


def test_kcert_verifies_securesystemslib_envelopes(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    report = make_report()
    payload = make_statement(report_subjects(report), report.predicate())
    signer = CryptoSigner(signing_key, sslib_key(signing_key.public_key()))
    theirs = SslibEnvelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    theirs.sign(signer)
    data = json.dumps(theirs.to_dict()).encode()
    verified = verify_envelope(parse_envelope(data), trusted)
    assert verified.keyid == key_id(signing_key.public_key())
    assert verified.kernel_name == report.kernel.name
    # Same key, same payload: Ed25519 is deterministic, so both sides agree byte for byte.
    assert parse_envelope(data) == sign_report(report, signing_key)


def test_kcert_refuses_a_securesystemslib_envelope_from_an_untrusted_key(
    trusted: dict[str, Ed25519PublicKey],
) -> None:
    stranger = generate_private_key()
    report = make_report()
    theirs = SslibEnvelope(
        payload=make_statement(report_subjects(report), report.predicate()),
        payload_type=PAYLOAD_TYPE, signatures={},
    )  # fmt: skip
    theirs.sign(CryptoSigner(stranger, sslib_key(stranger.public_key())))
    with pytest.raises(VerificationError, match="untrusted key"):
        verify_envelope(parse_envelope(json.dumps(theirs.to_dict()).encode()), trusted)

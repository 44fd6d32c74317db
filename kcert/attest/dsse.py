"""DSSE envelopes: strict parsing, the PAE, Ed25519 signing and signature checks.

The wire format is the DSSE JSON envelope
(https://github.com/secure-systems-lab/dsse/blob/master/envelope.md):
``{"payload": b64, "payloadType": str, "signatures": [{"keyid": str, "sig": b64}]}``.
What is signed is the pre-authentication encoding of the type and the body,
never the JSON around them, so the envelope may be re-serialized freely.

Parsing is strict where leniency would let two readers disagree (duplicate
keys, unknown fields, non-base64 text) and lenient where the DSSE spec is
(standard or URL-safe base64, with or without padding; ``keyid`` optional).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kcert.attest.errors import CertificateFormatError, VerificationError
from kcert.attest.keys import key_id

_B64 = re.compile(r"^[A-Za-z0-9+/_-]*={0,2}$")
_ENVELOPE_FIELDS = frozenset({"payload", "payloadType", "signatures"})
_SIGNATURE_FIELDS = frozenset({"keyid", "sig"})
_ED25519_SIG_LEN = 64


@dataclass(frozen=True, slots=True)
class Signature:
    sig: bytes
    #: An unauthenticated hint naming the signing key; DSSE lets it be absent.
    keyid: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {"sig": base64.standard_b64encode(self.sig).decode("ascii")}
        if self.keyid is not None:
            out["keyid"] = self.keyid
        return out


@dataclass(frozen=True, slots=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]

    def pae(self) -> bytes:
        return pae(self.payload_type, self.payload)

    def to_json(self) -> dict[str, Any]:
        """The DSSE JSON object, base64 in its standard alphabet with padding."""
        return {
            "payload": base64.standard_b64encode(self.payload).decode("ascii"),
            "payloadType": self.payload_type,
            "signatures": [s.to_json() for s in self.signatures],
        }

    def to_bytes(self) -> bytes:
        """Readable JSON for files; identity and signatures never depend on this layout."""
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode("utf-8")


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSEv1 PAE: ``"DSSEv1" SP len(type) SP type SP len(body) SP body``."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def sign(payload_type: str, payload: bytes, private_key: Ed25519PrivateKey) -> Envelope:
    signature = Signature(
        sig=private_key.sign(pae(payload_type, payload)),
        keyid=key_id(private_key.public_key()),
    )
    return Envelope(payload_type=payload_type, payload=payload, signatures=(signature,))


def verify_signatures(envelope: Envelope, trusted: Mapping[str, Ed25519PublicKey]) -> str:
    """Return the id of a trusted key that signed the envelope's PAE, or raise.

    A signature's ``keyid`` only picks which key to try first: a signature
    whose hint names no trusted key is still tried against every trusted key,
    as DSSE treats the hint as optional and unauthenticated.
    """
    if not trusted:
        raise VerificationError("no trusted keys were given, so no signature can be accepted")
    message = envelope.pae()
    bad_trusted: list[str] = []
    unknown: list[str] = []
    for signature in envelope.signatures:
        hinted = signature.keyid if signature.keyid in trusted else None
        candidates = [hinted] if hinted is not None else list(trusted)
        for keyid in candidates:
            if _verifies(trusted[keyid], signature.sig, message):
                return keyid
        if hinted is not None:
            bad_trusted.append(hinted)
        else:
            unknown.append(signature.keyid or "(no keyid)")
    if bad_trusted:
        raise VerificationError(
            f"bad signature: the signature by trusted key {bad_trusted[0]} does not match the "
            "payload; the certificate was altered after signing or signed with another key"
        )
    raise VerificationError(
        f"signed by untrusted key {unknown[0]}: no signature verifies with a trusted key; "
        "trust the signer's public key or ask for a certificate signed by a trusted one"
    )


def verified_signatures(
    envelope: Envelope, trusted: Mapping[str, Ed25519PublicKey]
) -> tuple[Signature, ...]:
    """The envelope's signatures that verify against ``trusted``, normalized.

    Each kept signature names the key that verified it (whatever its hint said);
    a key appears once however often it signed, and the result is sorted by key
    id. Signatures that verify against no trusted key are dropped.
    """
    message = envelope.pae()
    found: dict[str, Signature] = {}
    for signature in envelope.signatures:
        hinted = signature.keyid if signature.keyid in trusted else None
        candidates = ([hinted] if hinted is not None else []) + [
            k for k in trusted if k != hinted
        ]
        for keyid in candidates:
            if keyid not in found and _verifies(trusted[keyid], signature.sig, message):
                found[keyid] = Signature(sig=signature.sig, keyid=keyid)
                break
    return tuple(found[k] for k in sorted(found))


def _verifies(public_key: Ed25519PublicKey, sig: bytes, message: bytes) -> bool:
    if len(sig) != _ED25519_SIG_LEN:
        return False
    try:
        public_key.verify(sig, message)
    except InvalidSignature:
        return False
    return True


def parse_envelope(data: bytes) -> Envelope:
    """Parse DSSE envelope JSON strictly; any defect raises :class:`CertificateFormatError`."""
    value = loads_strict(data, what="certificate")
    if not isinstance(value, dict):
        raise CertificateFormatError(
            f"not a DSSE envelope: the JSON is {_json_kind(value)}, expected an object"
        )
    missing = sorted(_ENVELOPE_FIELDS - value.keys())
    if missing:
        raise CertificateFormatError(f"not a DSSE envelope: missing {', '.join(missing)}")
    extra = sorted(value.keys() - _ENVELOPE_FIELDS)
    if extra:
        raise CertificateFormatError(f"not a DSSE envelope: unknown field(s) {', '.join(extra)}")
    payload_type = value["payloadType"]
    if not isinstance(payload_type, str):
        raise CertificateFormatError("not a DSSE envelope: payloadType must be a string")
    payload = _b64decode(value["payload"], where="payload")
    raw_signatures = value["signatures"]
    if not isinstance(raw_signatures, list):
        raise CertificateFormatError("not a DSSE envelope: signatures must be a list")
    if not raw_signatures:
        raise CertificateFormatError("the envelope has no signatures; a certificate must be signed")
    signatures = tuple(_parse_signature(s, i) for i, s in enumerate(raw_signatures))
    return Envelope(payload_type=payload_type, payload=payload, signatures=signatures)


def _parse_signature(value: Any, index: int) -> Signature:
    where = f"signatures[{index}]"
    if not isinstance(value, dict):
        raise CertificateFormatError(f"not a DSSE envelope: {where} must be an object")
    extra = sorted(value.keys() - _SIGNATURE_FIELDS)
    if extra:
        raise CertificateFormatError(
            f"not a DSSE envelope: unknown field(s) in {where}: {', '.join(extra)}"
        )
    if "sig" not in value:
        raise CertificateFormatError(f"not a DSSE envelope: {where} has no sig")
    keyid = value.get("keyid")
    if keyid is not None and not isinstance(keyid, str):
        raise CertificateFormatError(f"not a DSSE envelope: {where}.keyid must be a string")
    return Signature(sig=_b64decode(value["sig"], where=f"{where}.sig"), keyid=keyid or None)


def _b64decode(value: Any, *, where: str) -> bytes:
    if not isinstance(value, str) or not _B64.match(value):
        raise CertificateFormatError(f"not a DSSE envelope: {where} is not base64 text")
    if any(c in value for c in "-_") and any(c in value for c in "+/"):
        raise CertificateFormatError(f"not a DSSE envelope: {where} mixes two base64 alphabets")
    text = value.rstrip("=")
    if len(text) % 4 == 1:
        raise CertificateFormatError(f"not a DSSE envelope: {where} has a truncated base64 length")
    padded = text + "=" * (-len(text) % 4)
    try:
        if "-" in padded or "_" in padded:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CertificateFormatError(f"not a DSSE envelope: {where} is not valid base64") from exc


def loads_strict(data: bytes, *, what: str) -> Any:
    """JSON with no duplicate keys and no NaN/Infinity, so every reader sees the same value."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CertificateFormatError(f"the {what} is not UTF-8 text") from exc
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _StrictJSONError as exc:
        raise CertificateFormatError(f"the {what} is not valid JSON: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CertificateFormatError(
            f"the {what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError as exc:
        raise CertificateFormatError(f"the {what} is nested too deeply") from exc


class _StrictJSONError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in pairs:
        if key in out:
            raise _StrictJSONError(f"duplicate key {key!r}")
        out[key] = item
    return out


def _no_constant(name: str) -> Any:
    raise _StrictJSONError(f"{name} is not JSON")


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )

"""C2SP ``cosignature/v1``: timestamped Ed25519 cosignatures on checkpoints.

Format (https://c2sp.org/tlog-cosignature):

- A cosignature is one signed-note signature line on a checkpoint:
  ``— <name> base64(keyid[4] || timestamp[8, big-endian] || ed25519_signature[64])``.
- ``keyid`` is ``SHA-256(name || 0x0A || 0x04 || pubkey)[:4]``; 0x04 is the
  timestamped Ed25519 cosignature type, so a cosigner's key id never equals
  the id of a log key (type 0x01) even with the same name and key.
- The signed message is ``cosignature/v1\\ntime <timestamp>\\n`` followed by
  the checkpoint's whole note body (signature lines excluded).
- A cosigner's verifier key is ``<name>+<keyid hex>+base64(0x04 || pubkey)``.

A cosignature states that, at ``timestamp``, the largest consistent tree the
cosigner has seen for the origin has this root: a witness signs only after
checking the checkpoint extends what it saw before (:mod:`kcert.log.witness`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kcert.log.errors import NoteError, SignatureError
from kcert.log.note import split_note

ALG_COSIGNATURE_V1 = 0x04
HEADER = "cosignature/v1"
_DASH = "\u2014 "
#: keyid (4) + timestamp (8) + Ed25519 signature (64).
SIGNATURE_BYTES = 76
_MAX_TIMESTAMP = 2**63 - 1


def cosigner_key_id(name: str, public_key: bytes) -> bytes:
    """``SHA-256(name || 0x0A || 0x04 || pubkey)[:4]``."""
    return hashlib.sha256(
        name.encode() + b"\n" + bytes([ALG_COSIGNATURE_V1]) + public_key
    ).digest()[:4]


def signed_message(body: str, timestamp: int) -> bytes:
    """What a ``cosignature/v1`` Ed25519 signature covers for a checkpoint ``body``."""
    if not 0 <= timestamp <= _MAX_TIMESTAMP:
        raise NoteError(f"cosignature timestamp {timestamp} is outside 0..2^63-1")
    return f"{HEADER}\ntime {timestamp}\n{body}".encode()


def _check_name(name: str) -> None:
    if not name or "+" in name or any(c.isspace() for c in name):
        raise NoteError(f"cosigner name {name!r} must be non-empty, with no spaces and no '+'")


@dataclass(frozen=True, slots=True)
class Cosignature:
    """One parsed cosignature line: who, when, and the raw Ed25519 signature."""

    name: str
    key_id: bytes
    timestamp: int
    signature: bytes

    @classmethod
    def from_blob(cls, name: str, blob: bytes) -> Cosignature:
        if len(blob) != SIGNATURE_BYTES:
            raise NoteError(
                f"a cosignature/v1 signature is {SIGNATURE_BYTES} bytes "
                f"(key id, timestamp, Ed25519 signature), not {len(blob)}"
            )
        (timestamp,) = struct.unpack(">Q", blob[4:12])
        if timestamp > _MAX_TIMESTAMP:
            raise NoteError(f"cosignature timestamp {timestamp} exceeds 2^63-1")
        return cls(name, blob[:4], timestamp, blob[12:])


@dataclass(frozen=True, slots=True)
class CosignerKey:
    """A cosigner's public identity: its name and raw 32-byte Ed25519 key."""

    name: str
    public_key: bytes

    def __post_init__(self) -> None:
        _check_name(self.name)
        if len(self.public_key) != 32:
            raise NoteError("an Ed25519 public key is 32 bytes")

    @property
    def key_id(self) -> bytes:
        return cosigner_key_id(self.name, self.public_key)

    def vkey(self) -> str:
        blob = base64.b64encode(bytes([ALG_COSIGNATURE_V1]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{blob}"

    @classmethod
    def from_vkey(cls, text: str) -> CosignerKey:
        parts = text.strip().split("+", 2)
        if len(parts) != 3:
            raise NoteError(
                "a witness verifier key reads NAME+KEYID+BASE64KEY, e.g. "
                "'witness.example/w1+1a2b3c4d+BA...'; got " + repr(text.strip()[:80])
            )
        name, id_hex, blob = parts
        try:
            raw = base64.b64decode(blob.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise NoteError(f"witness verifier key is not standard base64: {blob!r}") from exc
        if len(raw) != 33 or raw[0] != ALG_COSIGNATURE_V1:
            raise NoteError(
                "not a cosignature/v1 verifier key: expected type 0x04 and a 32-byte Ed25519 "
                f"key, got type 0x{raw[0]:02x} and {len(raw) - 1} bytes"
                if raw
                else "the verifier key holds no key"
            )
        key = cls(name, raw[1:])
        if id_hex != key.key_id.hex():
            raise NoteError(f"witness verifier key id {id_hex} does not match its name and key")
        return key

    def cosignatures(self, note: str) -> list[Cosignature]:
        """This key's cosignature lines on ``note`` (others are ignored, as the spec asks)."""
        _, signatures = split_note(note)
        found = []
        for name, blob in signatures:
            if name == self.name and blob[:4] == self.key_id:
                found.append(Cosignature.from_blob(name, blob))
        return found

    def verify(self, note: str) -> int:
        """Check ``note`` carries a valid cosignature by this key; return its timestamp.

        Every line by this key must verify (one that does not makes the note
        malformed, per signed-note); the newest timestamp is returned.
        """
        body, _ = split_note(note)
        found = self.cosignatures(note)
        if not found:
            raise SignatureError(
                f"the checkpoint carries no cosignature by witness {self.name!r} "
                f"(key id {self.key_id.hex()})"
            )
        public = Ed25519PublicKey.from_public_bytes(self.public_key)
        for cosig in found:
            try:
                public.verify(cosig.signature, signed_message(body, cosig.timestamp))
            except InvalidSignature as exc:
                raise SignatureError(
                    f"the cosignature by witness {self.name!r} does not verify: the checkpoint "
                    "was altered or cosigned by another key"
                ) from exc
        return max(c.timestamp for c in found)


@dataclass(frozen=True, slots=True)
class Cosigner:
    """A witness's signing half: name and Ed25519 private key."""

    name: str
    private_key: Ed25519PrivateKey = field(repr=False)

    def __post_init__(self) -> None:
        _check_name(self.name)

    @property
    def key(self) -> CosignerKey:
        raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return CosignerKey(self.name, raw)

    def cosign(self, body: str, timestamp: int) -> str:
        """The cosignature line (ending in newline) on the checkpoint ``body``."""
        if timestamp <= 0:
            raise NoteError("a witness cosignature carries a non-zero timestamp")
        signature = self.private_key.sign(signed_message(body, timestamp))
        blob = self.key.key_id + struct.pack(">Q", timestamp) + signature
        return f"{_DASH}{self.name} {base64.b64encode(blob).decode()}\n"


def add_signature_lines(note: str, lines: str) -> str:
    """``note`` with the signature ``lines`` appended, each line kept once."""
    have = set(note.splitlines())
    extra = [line for line in lines.splitlines() if line and line not in have]
    return note + "".join(f"{line}\n" for line in extra)


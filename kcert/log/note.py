"""C2SP signed notes, tlog checkpoints and Ed25519 verifier keys.

Formats (https://c2sp.org/signed-note, https://c2sp.org/tlog-checkpoint):

- A checkpoint body is ``origin\\nsize\\nbase64(root)\\n`` (optional extension
  lines may follow; we keep them but write none).
- A signed note is the body, a blank line, then one line per signature:
  ``— <name> base64(keyhash[4] || ed25519_signature[64])``.
- ``keyhash`` is the first 4 bytes of ``SHA-256(name || 0x0A || 0x01 || pubkey)``;
  0x01 is the Ed25519 signature type.
- A verifier key is ``<name>+<keyhash as 8 hex>+base64(0x01 || pubkey)``.

Only these bytes are trusted: a verifier needs nothing but the verifier key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kcert.log.errors import LogKeyError, NoteError, SignatureError
from kcert.log.merkle import HASH_SIZE

ALG_ED25519 = 0x01
_DASH = "\u2014 "
_MAX_SIGNATURES = 100
_SIZE = re.compile(r"^(0|[1-9][0-9]{0,19})$")
#: tlog-checkpoint sizes are uint64.
_MAX_SIZE = 2**64 - 1


def _check_name(name: str) -> None:
    if not name or "+" in name or any(c.isspace() for c in name):
        raise NoteError(f"key name {name!r} must be non-empty, with no spaces and no '+'")


def key_hash(name: str, public_key: bytes) -> bytes:
    """The C2SP 4-byte key hash of an Ed25519 key under ``name``."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([ALG_ED25519]) + public_key).digest()[:4]


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise NoteError(f"{what} is not standard base64: {text!r}") from exc


@dataclass(frozen=True, slots=True)
class Verifier:
    """An Ed25519 note verifier: a name and a raw 32-byte public key."""

    name: str
    public_key: bytes

    def __post_init__(self) -> None:
        _check_name(self.name)
        if len(self.public_key) != 32:
            raise NoteError("an Ed25519 public key is 32 bytes")

    @property
    def key_hash(self) -> bytes:
        return key_hash(self.name, self.public_key)

    def vkey(self) -> str:
        """The C2SP verifier key string."""
        blob = base64.b64encode(bytes([ALG_ED25519]) + self.public_key).decode()
        return f"{self.name}+{self.key_hash.hex()}+{blob}"

    @classmethod
    def from_vkey(cls, text: str) -> Verifier:
        parts = text.strip().split("+", 2)  # base64 may itself hold "+"
        if len(parts) != 3:
            raise NoteError(
                "a verifier key reads NAME+KEYHASH+BASE64KEY, e.g. "
                "'example.com/log+1a2b3c4d+AQ...'; got " + repr(text.strip()[:80])
            )
        name, hash_hex, blob = parts
        raw = _b64decode(blob, "verifier key")
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise NoteError("verifier key is not an Ed25519 key (type 0x01 and 32 bytes)")
        verifier = cls(name, raw[1:])
        if hash_hex != verifier.key_hash.hex():
            raise NoteError(f"verifier key hash {hash_hex} does not match its name and key")
        return verifier

    def open(self, note: str) -> str:
        """Check ``note`` carries a valid signature by this key; return its body text."""
        body, signatures = split_note(note)
        message = body.encode()
        found = False
        for name, blob in signatures:
            if name != self.name or blob[:4] != self.key_hash:
                continue  # signatures by other keys are allowed and ignored
            public = Ed25519PublicKey.from_public_bytes(self.public_key)
            try:
                public.verify(blob[4:], message)
            except InvalidSignature as exc:
                raise SignatureError(
                    f"the signature by {name!r} does not verify: the note was altered "
                    "or signed by another key"
                ) from exc
            found = True
        if not found:
            raise SignatureError(
                f"the note carries no signature by the pinned key {self.name!r} "
                f"(key hash {self.key_hash.hex()})"
            )
        return body


@dataclass(frozen=True, slots=True)
class Signer:
    """An Ed25519 note signer."""

    name: str
    private_key: Ed25519PrivateKey = field(repr=False)

    def __post_init__(self) -> None:
        _check_name(self.name)

    @property
    def verifier(self) -> Verifier:
        raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return Verifier(self.name, raw)

    def sign(self, body: str) -> str:
        """The signed note: ``body``, a blank line and this key's signature line."""
        if not body.endswith("\n") or "\n\n" in body:
            raise NoteError("a note body is one or more non-empty lines, each ending in newline")
        signature = self.private_key.sign(body.encode())
        blob = base64.b64encode(self.verifier.key_hash + signature).decode()
        return f"{body}\n{_DASH}{self.name} {blob}\n"


def split_note(note: str) -> tuple[str, list[tuple[str, bytes]]]:
    """A note's body and its ``(name, keyhash || signature)`` lines, well-formedness checked."""
    if any(ord(c) < 0x20 and c != "\n" for c in note):
        raise NoteError("a signed note holds no control characters but newlines")
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise NoteError("not a signed note: expected a body, a blank line and signature lines")
    body, tail = note[: cut + 1], note[cut + 2 :]
    lines = tail[:-1].split("\n")
    if len(lines) > _MAX_SIGNATURES:
        raise NoteError(f"a note carries at most {_MAX_SIGNATURES} signatures")
    signatures: list[tuple[str, bytes]] = []
    for line in lines:
        if not line.startswith(_DASH):
            raise NoteError(f"signature line does not start with an em dash: {line[:60]!r}")
        name, _, blob = line[len(_DASH) :].partition(" ")
        _check_name(name)
        raw = _b64decode(blob, "signature")
        if len(raw) < 5:
            raise NoteError("a signature holds a 4-byte key hash and the signature")
        signatures.append((name, raw))
    return body, signatures


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A tlog checkpoint: the log's origin, its size and its root hash."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        lines = [
            self.origin,
            str(self.size),
            base64.b64encode(self.root).decode(),
            *self.extensions,
        ]
        return "".join(f"{line}\n" for line in lines)

    @classmethod
    def parse(cls, body: str) -> Checkpoint:
        lines = body.split("\n")
        if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
            raise NoteError("a checkpoint body is origin, size and root hash, one per line")
        origin, size, root = lines[0], lines[1], lines[2]
        if not _SIZE.match(size) or int(size) > _MAX_SIZE:
            raise NoteError(f"checkpoint size {size!r} is not a decimal number in 0..2^64-1")
        digest = _b64decode(root, "checkpoint root hash")
        if len(digest) != HASH_SIZE:
            raise NoteError(f"checkpoint root hash is {len(digest)} bytes, not {HASH_SIZE}")
        if base64.b64encode(digest).decode() != root:
            # Other padding bits, same bytes: a cosignature over the re-encoded body would not
            # verify over the note as submitted, so only the canonical encoding is a checkpoint.
            raise NoteError(f"checkpoint root hash {root!r} is not canonical base64")
        return cls(origin, int(size), digest, tuple(lines[3:-1]))

    def sign(self, signer: Signer) -> str:
        if self.origin != signer.name:
            raise NoteError(
                f"checkpoint origin {self.origin!r} is not the key name {signer.name!r}"
            )
        return signer.sign(self.body())


def open_checkpoint(note: str, verifier: Verifier) -> Checkpoint:
    """Verify ``note`` with ``verifier`` and parse it; the origin must be the key's name."""
    checkpoint = Checkpoint.parse(verifier.open(note))
    if checkpoint.origin != verifier.name:
        raise SignatureError(
            f"checkpoint origin {checkpoint.origin!r} is not the pinned log {verifier.name!r}"
        )
    return checkpoint


def load_or_create_signer(path: Path, origin: str | None = None) -> Signer:
    """The log's Ed25519 key from ``path`` (PEM, PKCS#8), made there with mode 600 if absent.

    ``origin`` names the log; by default it is derived from the public key, so
    two registries never share an origin by accident.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            # O_EXCL: two processes starting at once must not each write a key.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(pem)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise LogKeyError(f"cannot read the log key {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LogKeyError(f"the log key {path} is readable by others; run: chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as exc:
        raise LogKeyError(f"{path} is not a PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise LogKeyError(f"{path} is not an Ed25519 key")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Signer(origin or f"kcert.log/{hashlib.sha256(raw).hexdigest()[:16]}", key)

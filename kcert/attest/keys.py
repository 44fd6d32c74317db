"""Ed25519 signing keys: generate, write safely, load, and name them.

A key id is the hex SHA-256 of the raw 32-byte public key (docs/certificate.md). The
private key is PKCS#8 PEM, encrypted when a passphrase is given (the CLI takes
it from ``KCERT_KEY_PASSPHRASE``); the public key beside it, at ``PATH.pub``,
is SubjectPublicKeyInfo PEM so that OpenSSL and securesystemslib read it too.

Nothing here prints, logs or puts key material into an error message.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kcert.attest.errors import KeyFileError
from kcert.attest.files import read_bounded

PASSPHRASE_ENV = "KCERT_KEY_PASSPHRASE"
PUBLIC_SUFFIX = ".pub"

_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")
# Key files are a few hundred bytes; refusing big files keeps a wrong path
# (a dataset, a core dump) from being read whole into memory.
_MAX_KEY_FILE = 64 * 1024


@dataclass(frozen=True, slots=True)
class KeyPair:
    """Where a freshly written key pair lives, and its id."""

    private_path: Path
    public_path: Path
    public_key: Ed25519PublicKey
    keyid: str


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def passphrase_from_env() -> bytes | None:
    """The passphrase in ``KCERT_KEY_PASSPHRASE``, or ``None`` when unset or empty."""
    value = os.environ.get(PASSPHRASE_ENV)
    return value.encode("utf-8") if value else None


def public_key_path(private_path: Path) -> Path:
    return private_path.with_name(private_path.name + PUBLIC_SUFFIX)


def public_key_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey) -> str:
    """Hex SHA-256 of the raw 32-byte public key."""
    return hashlib.sha256(public_key_bytes(public_key)).hexdigest()


def trust_map(public_keys: Iterable[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """The ``{key id: key}`` mapping that ``verify_envelope`` takes."""
    return {key_id(k): k for k in public_keys}


def public_key_hex(public_key: Ed25519PublicKey) -> str:
    return public_key_bytes(public_key).hex()


def public_key_from_hex(text: str) -> Ed25519PublicKey:
    """Parse the hex of a raw 32-byte Ed25519 public key (the API's format)."""
    value = text.strip()
    if not _HEX_KEY.match(value):
        raise KeyFileError(
            "not an Ed25519 public key: expected 64 hex digits (the raw 32-byte key), "
            f"got {len(value)} characters"
        )
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(value))


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def private_key_pem(private_key: Ed25519PrivateKey, *, passphrase: bytes | None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    return private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def write_keypair(
    path: Path,
    *,
    passphrase: bytes | None,
    overwrite: bool = False,
    private_key: Ed25519PrivateKey | None = None,
) -> KeyPair:
    """Write a new (or the given) private key to ``path`` and its public key to ``path.pub``.

    The private file is created with mode 0o600 from its first byte: it is
    written under a temporary name opened with that mode, then linked into
    place, so no reader ever sees it with looser permissions or half written.
    Without ``overwrite`` an existing file at either path is an error.
    """
    key = private_key if private_key is not None else generate_private_key()
    public = key.public_key()
    pub_path = public_key_path(path)
    if not overwrite:
        for target in (path, pub_path):
            if target.exists() or target.is_symlink():
                raise KeyFileError(
                    f"{target} already exists; choose another path or pass --force to replace it"
                )
    _atomic_write(path, private_key_pem(key, passphrase=passphrase), mode=0o600,
                  overwrite=overwrite)  # fmt: skip
    _atomic_write(pub_path, public_key_pem(public), mode=0o644, overwrite=overwrite)
    return KeyPair(private_path=path, public_path=pub_path, public_key=public, keyid=key_id(public))


def load_private_key(path: Path, *, passphrase: bytes | None = None) -> Ed25519PrivateKey:
    """Load a PKCS#8 PEM Ed25519 private key.

    ``passphrase`` defaults to ``KCERT_KEY_PASSPHRASE``. A passphrase given for
    a key that is not encrypted is ignored, so one environment can hold both.
    """
    secret = passphrase if passphrase is not None else passphrase_from_env()
    data = _read_key_file(path, what="private key")
    if b"PRIVATE KEY-----" not in data:
        if b"PUBLIC KEY-----" in data or _looks_like_hex_key(data):
            raise KeyFileError(f"{path} is a public key; signing needs the private key file")
        raise KeyFileError(f"{path} is not a PEM private key (expected '-----BEGIN PRIVATE KEY')")
    encrypted = b"ENCRYPTED PRIVATE KEY-----" in data
    try:
        key = serialization.load_pem_private_key(data, password=secret if encrypted else None)
    except TypeError as exc:
        raise KeyFileError(
            f"{path} is encrypted; set {PASSPHRASE_ENV} to its passphrase"
        ) from exc
    except ValueError as exc:
        if encrypted:
            raise KeyFileError(
                f"cannot decrypt {path}: wrong passphrase in {PASSPHRASE_ENV}"
            ) from exc
        raise KeyFileError(f"{path} is not a readable PEM private key") from exc
    except UnsupportedAlgorithm as exc:
        raise KeyFileError(f"{path} uses an unsupported key algorithm; use Ed25519") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(
            f"{path} holds a {type(key).__name__.removeprefix('_')}, not an Ed25519 key; "
            "make one with 'kcert keys generate'"
        )
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load an Ed25519 public key: SubjectPublicKeyInfo PEM (what ``PATH.pub`` holds) or hex."""
    data = _read_key_file(path, what="public key")
    if b"PRIVATE KEY-----" in data:
        raise KeyFileError(
            f"{path} is a private key; pass the public key ({path.name}{PUBLIC_SUFFIX}) instead"
        )
    if _looks_like_hex_key(data):
        return public_key_from_hex(data.decode("ascii"))
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(
            f"{path} is not a public key: expected PEM ('-----BEGIN PUBLIC KEY') "
            "or 64 hex digits"
        ) from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} is not an Ed25519 public key")
    return key


def _looks_like_hex_key(data: bytes) -> bool:
    return bool(_HEX_KEY.match(data.strip().decode("ascii", "replace")))


def _read_key_file(path: Path, *, what: str) -> bytes:
    return read_bounded(path, limit=_MAX_KEY_FILE, what=what, error=KeyFileError)


def _atomic_write(path: Path, data: bytes, *, mode: int, overwrite: bool) -> None:
    """Create ``path`` with exactly ``mode`` and ``data``, all at once."""
    parent = path.parent
    if not parent.is_dir():
        raise KeyFileError(f"cannot write {path}: folder {parent} does not exist")
    tmp = parent / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    except OSError as exc:
        raise KeyFileError(f"cannot write {path}: {exc.strerror}") from exc
    try:
        try:
            # The umask can only narrow the mode; fchmod makes it exact.
            os.fchmod(fd, mode)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, path)
        else:
            # link() fails when the target exists, so a file that appeared since
            # the existence check is never clobbered.
            os.link(tmp, path)
    except FileExistsError as exc:
        raise KeyFileError(
            f"{path} already exists; choose another path or pass --force to replace it"
        ) from exc
    except OSError as exc:
        raise KeyFileError(f"cannot write {path}: {exc.strerror}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)

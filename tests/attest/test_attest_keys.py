"""Key files: modes, passphrases, formats, ids, and errors that name no key material."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kcert.attest.errors import KeyFileError
from kcert.attest.keys import (
    PASSPHRASE_ENV,
    key_id,
    load_private_key,
    load_public_key,
    public_key_from_hex,
    public_key_hex,
    write_keypair,
)
from kcert.errors import KcertError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_keypair_modes_and_round_trip(tmp_path: Path) -> None:
    pair = write_keypair(tmp_path / "signer", passphrase=None)
    assert pair.public_path == tmp_path / "signer.pub"
    assert _mode(pair.private_path) == 0o600
    private = load_private_key(pair.private_path)
    public = load_public_key(pair.public_path)
    assert public_key_hex(public) == public_key_hex(private.public_key())
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert pair.keyid == key_id(public) == hashlib.sha256(raw).hexdigest()
    assert pair.public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


def test_private_key_is_never_looser_than_600_even_with_umask_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "signer"
    real_write = os.write
    modes_at_write: list[int] = []

    def spying_write(fd: int, data: Any) -> int:
        if b"PRIVATE KEY" in bytes(data):
            modes_at_write.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    old_umask = os.umask(0)
    try:
        monkeypatch.setattr(os, "write", spying_write)
        write_keypair(target, passphrase=None)
    finally:
        os.umask(old_umask)
    # The key bytes were written into a file that was already 0o600.
    assert modes_at_write == [0o600]
    assert _mode(target) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["signer", "signer.pub"]


def test_refuses_to_overwrite_unless_asked(tmp_path: Path) -> None:
    target = tmp_path / "signer"
    target.write_text("precious")
    target.chmod(0o644)
    with pytest.raises(KeyFileError, match="already exists.*--force"):
        write_keypair(target, passphrase=None)
    assert target.read_text() == "precious"
    pair = write_keypair(target, passphrase=None, overwrite=True)
    assert _mode(target) == 0o600
    load_private_key(pair.private_path)


def test_refuses_when_only_the_public_file_exists(tmp_path: Path) -> None:
    (tmp_path / "signer.pub").write_text("x")
    with pytest.raises(KeyFileError, match="signer.pub already exists"):
        write_keypair(tmp_path / "signer", passphrase=None)
    assert not (tmp_path / "signer").exists()


def test_passphrase_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    pair = write_keypair(tmp_path / "signer", passphrase=b"correct horse")
    assert b"ENCRYPTED PRIVATE KEY" in pair.private_path.read_bytes()
    key = load_private_key(pair.private_path, passphrase=b"correct horse")
    assert key_id(key.public_key()) == pair.keyid
    monkeypatch.setenv(PASSPHRASE_ENV, "correct horse")
    assert key_id(load_private_key(pair.private_path).public_key()) == pair.keyid


def test_wrong_or_missing_passphrase_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = write_keypair(tmp_path / "signer", passphrase=b"correct horse")
    monkeypatch.setenv(PASSPHRASE_ENV, "battery staple")
    with pytest.raises(KeyFileError, match=f"wrong passphrase in {PASSPHRASE_ENV}"):
        load_private_key(pair.private_path)
    monkeypatch.delenv(PASSPHRASE_ENV)
    with pytest.raises(KeyFileError, match=f"is encrypted; set {PASSPHRASE_ENV}"):
        load_private_key(pair.private_path)


def test_passphrase_in_env_is_ignored_for_an_unencrypted_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = write_keypair(tmp_path / "signer", passphrase=None)
    monkeypatch.setenv(PASSPHRASE_ENV, "anything")
    assert key_id(load_private_key(pair.private_path).public_key()) == pair.keyid


def test_public_key_formats(tmp_path: Path) -> None:
    pair = write_keypair(tmp_path / "signer", passphrase=None)
    hex_file = tmp_path / "signer.hex"
    hex_file.write_text(public_key_hex(pair.public_key) + "\n")
    assert key_id(load_public_key(hex_file)) == pair.keyid
    assert key_id(public_key_from_hex(public_key_hex(pair.public_key))) == pair.keyid


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello", "not a public key"),
        (b"", "not a public key"),
        (b"ab" * 31, "not a public key"),
    ],
)
def test_bad_public_key_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "k.pub"
    path.write_bytes(content)
    with pytest.raises(KeyFileError, match=message):
        load_public_key(path)


def test_missing_and_directory_key_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist"):
        load_public_key(tmp_path / "absent.pub")
    with pytest.raises(KeyFileError, match="does not exist"):
        load_private_key(tmp_path / "absent")
    with pytest.raises(KeyFileError, match="is a directory"):
        load_public_key(tmp_path)


def test_swapped_key_files_are_named_and_their_bytes_not_shown(tmp_path: Path) -> None:
    pair = write_keypair(tmp_path / "signer", passphrase=None)
    secret_lines = pair.private_path.read_text().splitlines()[1:-1]
    with pytest.raises(KeyFileError) as caught:
        load_public_key(pair.private_path)
    text = caught.value.diagnostics()
    assert "is a private key" in text and "signer.pub" in text
    assert not any(line in text for line in secret_lines)
    with pytest.raises(KeyFileError, match="is a public key"):
        load_private_key(pair.public_path)


def test_non_ed25519_keys_are_refused(tmp_path: Path) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    priv = tmp_path / "ec"
    priv.write_bytes(other.private_bytes(serialization.Encoding.PEM,
                     serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    pub = tmp_path / "ec.pub"
    pub.write_bytes(other.public_key().public_bytes(serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    with pytest.raises(KeyFileError, match="not an Ed25519"):
        load_private_key(priv)
    with pytest.raises(KeyFileError, match="not an Ed25519"):
        load_public_key(pub)


def test_bad_hex_public_key() -> None:
    with pytest.raises(KcertError, match="64 hex digits"):
        public_key_from_hex("zz" * 32)

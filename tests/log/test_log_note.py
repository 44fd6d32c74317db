"""C2SP signed notes, checkpoints and the log key file."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kcert.log.errors import LogKeyError, NoteError, SignatureError
from kcert.log.note import Checkpoint, Signer, Verifier, load_or_create_signer, open_checkpoint

# The example key and note of golang.org/x/mod/sumdb/note (the reference implementation).
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SEED = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT
    + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNX"
    "gKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def _go_signer() -> Signer:
    seed = base64.b64decode(GO_SEED)[1:]
    return Signer("PeterNeumann", Ed25519PrivateKey.from_private_bytes(seed))


def test_interoperates_with_the_go_reference_vectors() -> None:
    verifier = Verifier.from_vkey(GO_VKEY)
    assert verifier.open(GO_NOTE) == GO_TEXT
    signer = _go_signer()
    assert signer.verifier.vkey() == GO_VKEY
    assert signer.sign(GO_TEXT) == GO_NOTE


def test_other_signatures_are_ignored_but_a_bad_one_by_our_key_fails() -> None:
    other = Signer("someone-else", Ed25519PrivateKey.generate()).sign(GO_TEXT)
    both = GO_NOTE + other.split("\n\n")[1]
    assert Verifier.from_vkey(GO_VKEY).open(both) == GO_TEXT
    with pytest.raises(SignatureError):
        Verifier.from_vkey(GO_VKEY).open(other)
    flipped = GO_NOTE.replace("x08go", "x08gp")
    with pytest.raises(SignatureError):
        Verifier.from_vkey(GO_VKEY).open(flipped)
    with pytest.raises(SignatureError):
        Verifier.from_vkey(GO_VKEY).open(GO_NOTE.replace("answer", "Answer"))


@pytest.mark.parametrize(
    "note",
    [
        "no blank line\n\u2014 a AAAA\n",
        GO_TEXT + "\n- PeterNeumann AAAAAAAA\n",
        GO_TEXT + "\n\u2014 PeterNeumann not*base64\n",
        GO_TEXT + "\n\u2014 PeterNeumann AAAA\n",
        GO_TEXT.replace("\n", "\r\n") + "\n\u2014 PeterNeumann AAAAAAAA\n",
        GO_NOTE.rstrip("\n"),
    ],
)
def test_malformed_notes_are_refused(note: str) -> None:
    with pytest.raises(NoteError):
        Verifier.from_vkey(GO_VKEY).open(note)


@pytest.mark.parametrize(
    "vkey",
    ["PeterNeumann+c74f20a3", "PeterNeumann+00000000+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
     "PeterNeumann+c74f20a3+AhpjZA==", "+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"],
)  # fmt: skip
def test_malformed_verifier_keys_are_refused(vkey: str) -> None:
    with pytest.raises(NoteError):
        Verifier.from_vkey(vkey)


def test_checkpoint_body_is_the_tlog_format() -> None:
    cp = Checkpoint("example.com/log", 42, bytes(range(32)))
    assert cp.body() == f"example.com/log\n42\n{base64.b64encode(bytes(range(32))).decode()}\n"
    assert Checkpoint.parse(cp.body()) == cp
    ext = Checkpoint.parse(cp.body() + "extra line\n")
    assert ext.extensions == ("extra line",)


@pytest.mark.parametrize(
    "body",
    ["example\n042\n" + "A" * 43 + "=\n", "example\n-1\n" + "A" * 43 + "=\n",
     "example\n1\nAAAA\n", "example\n1\n", "\n1\n" + "A" * 43 + "=\n"],
)  # fmt: skip
def test_malformed_checkpoints_are_refused(body: str) -> None:
    with pytest.raises(NoteError):
        Checkpoint.parse(body)


def test_a_checkpoint_must_name_the_pinned_log() -> None:
    key = Ed25519PrivateKey.generate()
    note = Signer("log-a", key).sign(Checkpoint("log-b", 1, bytes(32)).body())
    with pytest.raises(SignatureError, match="origin"):
        open_checkpoint(note, Signer("log-a", key).verifier)


def test_the_log_key_is_made_once_with_mode_600(tmp_path: Path) -> None:
    path = tmp_path / "home" / "log-key.pem"
    first = load_or_create_signer(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_signer(path)
    assert again.verifier == first.verifier
    assert first.name.startswith("kcert.log/")
    assert load_or_create_signer(path, "registry.example/log").name == "registry.example/log"


def test_a_readable_log_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log-key.pem"
    load_or_create_signer(path)
    os.chmod(path, 0o644)
    with pytest.raises(LogKeyError, match="chmod 600"):
        load_or_create_signer(path)
    path.write_text("not a key")
    os.chmod(path, 0o600)
    with pytest.raises(LogKeyError, match="not a PEM"):
        load_or_create_signer(path)

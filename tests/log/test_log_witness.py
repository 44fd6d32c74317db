"""C2SP cosignature/v1 and tlog-witness: the specs' own examples, then the witness's rules.

The examples are quoted from c2sp.org/signed-note, c2sp.org/tlog-cosignature
and c2sp.org/tlog-witness. Their private keys are not published (nor the
witness example's public key), so what can be checked of them is checked:
the signed-note verifier key verifies its note, the cosignature line's framing
and timestamp match the spec's signed-message example, our signed message is
that example byte for byte, and the add-checkpoint request parses and
re-encodes to the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from kcert.api.witness_app import create_witness_app
from kcert.log.cosignature import (
    Cosignature,
    Cosigner,
    CosignerKey,
    add_signature_lines,
    signed_message,
)
from kcert.log.errors import NoteError, SignatureError
from kcert.log.merkle import MemoryTree, consistency_proof, leaf_hash
from kcert.log.note import Checkpoint, Signer, Verifier, split_note
from kcert.log.witness import AddCheckpoint, Witness, WitnessState, origin_hash

# --- the specs' examples ---------------------------------------------------------------------

NOTE_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3m"
    "FXmRKuwHjG1Yu72IneyaQM=\n"
)
BODY = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
LOG_SIG = (
    "\u2014 example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5"
    "/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)
COSIGNED = (
    BODY + "\n" + LOG_SIG + "\u2014 witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXc"
    "rtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
)
SIGNED_MESSAGE = (
    "cosignature/v1\ntime 1679315147\nexample.com/behind-the-sofa\n20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
)
REQUEST = (
    "old 20852014\n"
    "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n"
    "jrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=\n"
    "5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=\n"
    "/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=\n"
    "\n" + BODY + "\n" + LOG_SIG + "\u2014 example.com/behind-the-sofa opLqBQsREYCgu6xQkYQwJr9fo45a"
    "62DN9EdmHXnZdXNqlcVGlCum2Wks+49/V6267UEjw6QUXTS5Rovnzv++qbSzm9Q=\n"
)


def test_the_signed_note_example_verifies_under_its_vkey() -> None:
    verifier = Verifier.from_vkey(NOTE_VKEY)
    assert verifier.vkey() == NOTE_VKEY
    assert verifier.open(NOTE) == "This is an example message.\n"
    with pytest.raises(SignatureError):
        verifier.open(NOTE.replace("example message", "exampel message"))


def test_the_cosignature_example_is_keyid_timestamp_and_signature() -> None:
    body, signatures = split_note(COSIGNED)
    assert body == BODY
    name, blob = signatures[1]
    cosig = Cosignature.from_blob(name, blob)
    assert (cosig.name, cosig.key_id.hex()) == ("witness.example.com/w1", "8d66cf3f")
    assert cosig.timestamp == 1679315147 and len(cosig.signature) == 64
    # ... and that timestamp is the one of the spec's signed-message example.
    assert signed_message(body, cosig.timestamp) == SIGNED_MESSAGE.encode()


def test_the_add_checkpoint_example_parses_and_reencodes() -> None:
    request = AddCheckpoint.parse(REQUEST.encode())
    assert request.old_size == 20852014 and len(request.proof) == 4
    assert request.proof[0] == base64.b64decode("PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=")
    body, signatures = split_note(request.note)
    assert Checkpoint.parse(body) == Checkpoint(
        "example.com/behind-the-sofa", 20852163,
        base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="),
    )  # fmt: skip
    assert len(signatures) == 2
    assert request.encode() == REQUEST.encode()


def test_cosigner_vkeys_are_type_0x04_with_their_own_key_id() -> None:
    public = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    key = CosignerKey("witness.example.com/w1", public)
    expected_id = hashlib.sha256(b"witness.example.com/w1\n\x04" + public).digest()[:4]
    assert key.key_id == expected_id
    name, id_hex, blob = key.vkey().split("+", 2)
    assert (name, id_hex) == ("witness.example.com/w1", expected_id.hex())
    assert base64.b64decode(blob) == b"\x04" + public
    assert CosignerKey.from_vkey(key.vkey()) == key
    # The same key as a log's (type 0x01) key has another id, and is not a cosigner key.
    assert Verifier("witness.example.com/w1", public).key_hash != key.key_id
    with pytest.raises(NoteError, match="type 0x04"):
        CosignerKey.from_vkey(NOTE_VKEY)
    with pytest.raises(NoteError, match="does not match"):
        CosignerKey.from_vkey(key.vkey().replace(id_hex, "00000000"))


def test_a_cosignature_verifies_and_is_bound_to_the_checkpoint_and_time() -> None:
    cosigner = Cosigner("witness.example/w1", Ed25519PrivateKey.generate())
    line = cosigner.cosign(BODY, 1679315147)
    note = add_signature_lines(BODY + "\n" + LOG_SIG, line)
    assert cosigner.key.verify(note) == 1679315147
    blob = base64.b64decode(line.split(" ")[2])
    assert len(blob) == 76 and blob[:4] == cosigner.key.key_id
    assert int.from_bytes(blob[4:12], "big") == 1679315147
    with pytest.raises(SignatureError, match="does not verify"):
        cosigner.key.verify(note.replace("20852163", "20852164"))
    moved = base64.b64encode(blob[:4] + (1679315148).to_bytes(8, "big") + blob[12:]).decode()
    with pytest.raises(SignatureError, match="does not verify"):
        cosigner.key.verify(note.replace(line.split(" ")[2].strip(), moved))
    other = Cosigner("witness.example/w2", Ed25519PrivateKey.generate())
    with pytest.raises(SignatureError, match="no cosignature by witness"):
        other.key.verify(note)


# --- the witness -----------------------------------------------------------------------------


class Log:
    """A log in memory: leaves, a signer, and checkpoints of any prefix."""

    def __init__(self, origin: str = "example.org/log", key: Ed25519PrivateKey | None = None):
        self.signer = Signer(origin, key or Ed25519PrivateKey.generate())
        self.tree = MemoryTree()

    def grow(self, n: int, tag: str = "a") -> Log:
        for _ in range(n):
            self.tree.append(leaf_hash(f"{tag}{self.tree.size}".encode()))
        return self

    def note(self, size: int | None = None) -> str:
        size = self.tree.size if size is None else size
        return Checkpoint(self.signer.name, size, self.tree.root(size)).sign(self.signer)

    def request(self, old: int, size: int | None = None) -> bytes:
        size = self.tree.size if size is None else size
        proof = consistency_proof(old, size, self.tree) if 0 < old < size else []
        return AddCheckpoint(old, tuple(proof), self.note(size)).encode()


@pytest.fixture
def log() -> Log:
    return Log().grow(5)


@pytest.fixture
def witness(tmp_path: Path, log: Log) -> Witness:
    cosigner = Cosigner("witness.example/w1", Ed25519PrivateKey.generate())
    return Witness(cosigner, [log.signer.verifier], WitnessState(tmp_path / "state.json"))


@pytest.fixture
def client(witness: Witness) -> TestClient:
    return TestClient(create_witness_app(witness))


def _post(client: TestClient, body: bytes) -> tuple[int, str, str]:
    response = client.post("/add-checkpoint", content=body)
    return response.status_code, response.headers["content-type"], response.text


def test_cosigns_a_first_checkpoint_then_a_consistent_extension(
    client: TestClient, witness: Witness, log: Log, tmp_path: Path
) -> None:
    status, media, text = _post(client, log.request(0))
    assert status == 200 and media.startswith("text/plain")
    assert witness.cosigner.key.verify(add_signature_lines(log.note(), text)) > 1_600_000_000
    log.grow(4)
    status, _, text = _post(client, log.request(5))
    assert status == 200
    assert witness.cosigner.key.verify(add_signature_lines(log.note(), text))
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["logs"][log.signer.name]["size"] == 9  # persisted before the answer
    latest = client.get(f"/{origin_hash(log.signer.name)}/checkpoint")
    assert latest.status_code == 200
    assert log.signer.verifier.open(latest.text) and witness.cosigner.key.verify(latest.text)
    assert client.get(f"/{origin_hash('example.org/other')}/checkpoint").status_code == 404


def test_an_old_size_that_is_not_the_latest_is_409_with_the_size(
    client: TestClient, log: Log
) -> None:
    assert _post(client, log.request(0))[0] == 200
    log.grow(3)
    assert _post(client, log.request(0)) == (409, "text/x.tlog.size", "5\n")
    assert _post(client, log.request(2)) == (409, "text/x.tlog.size", "5\n")
    assert _post(client, log.request(5))[0] == 200
    # A checkpoint older than what was cosigned, offered from the old size: 409 too.
    assert _post(client, log.request(5, 6)) == (409, "text/x.tlog.size", "8\n")


@pytest.mark.parametrize(
    "case", ["same-size-fork", "longer-fork", "bad-proof", "proof-with-old-0", "empty-root"]
)
def test_inconsistent_checkpoints_are_422(
    client: TestClient, witness: Witness, log: Log, case: str
) -> None:
    assert _post(client, log.request(0))[0] == 200
    other = Log(log.signer.name, log.signer.private_key)
    if case == "same-size-fork":
        body = other.grow(5, "b").request(0, 5).replace(b"old 0\n", b"old 5\n")
    elif case == "longer-fork":
        fork = other.grow(9, "b")
        body = fork.request(5)  # a true proof, but of a tree that does not hold ours
    elif case == "bad-proof":
        log.grow(4)
        request = AddCheckpoint.parse(log.request(5))
        body = AddCheckpoint(5, (bytes(32),) * len(request.proof), request.note).encode()
    elif case == "proof-with-old-0":
        fresh = Log("example.org/fresh").grow(3)
        witness.logs["example.org/fresh"] = [fresh.signer.verifier]
        body = AddCheckpoint(0, (bytes(32),), fresh.note()).encode()
    else:
        fresh = Log("example.org/empty")
        witness.logs["example.org/empty"] = [fresh.signer.verifier]
        note = Checkpoint("example.org/empty", 0, bytes(32)).sign(fresh.signer)
        body = AddCheckpoint(0, (), note).encode()
    status, _, text = _post(client, body)
    assert status == 422, text
    assert witness.state.read()[log.signer.name].size == 5  # nothing recorded


def test_authentication_and_format_errors(client: TestClient, log: Log) -> None:
    stranger = Log("example.org/unknown").grow(2)
    assert _post(client, stranger.request(0))[0] == 404
    impostor = Log(log.signer.name).grow(5)  # right origin, another key
    status, _, text = _post(client, impostor.request(0))
    assert status == 403 and "no signature by a key trusted" in text
    request = AddCheckpoint.parse(log.request(0))
    body, sigs = split_note(request.note)
    name, blob = sigs[0]
    bad = blob[:4] + bytes(64)  # the trusted key's id, a signature that fails
    forged = f"{body}\n\u2014 {name} {base64.b64encode(bad).decode()}\n"
    assert _post(client, AddCheckpoint(0, (), forged).encode())[0] == 403
    assert _post(client, log.request(0).replace(b"old 0", b"old 6"))[0] == 400
    assert _post(client, b"old 01\n\n" + log.note().encode())[0] == 400
    assert _post(client, b"no blank line")[0] == 400
    many = AddCheckpoint(4, (bytes(32),) * 64, log.note()).encode()
    assert _post(client, many)[0] == 400
    assert _post(client, b"old 0\n\n\xff\xfe")[0] == 400


def test_concurrent_submissions_never_roll_the_record_back(
    witness: Witness, log: Log
) -> None:
    assert witness.add_checkpoint(log.request(0))
    log.grow(8)
    bodies = [log.request(5, size) for size in range(6, 14)]
    results: dict[int, str] = {}
    barrier = threading.Barrier(len(bodies))

    def submit(size: int, body: bytes) -> None:
        barrier.wait()
        try:
            witness.add_checkpoint(body)
            results[size] = "200"
        except Exception as exc:  # the refusals are what is counted
            results[size] = type(exc).__name__

    threads = [threading.Thread(target=submit, args=(6 + i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [size for size, r in results.items() if r == "200"]
    assert len(won) == 1, results
    assert sorted(r for r in results.values() if r != "200") == ["StaleOldSize"] * 7
    assert witness.state.read()[log.signer.name].size == won[0]


def test_a_size_above_uint64_or_a_non_canonical_root_is_not_cosigned(
    client: TestClient, witness: Witness, log: Log
) -> None:
    huge = Checkpoint(log.signer.name, 2**64, b"\1" * 32).sign(log.signer)
    status, _, text = _post(client, AddCheckpoint(0, (), huge).encode())
    assert status == 400 and "0..2^64-1" in text
    root = base64.b64encode(log.tree.root(5)).decode()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    other = root[:-2] + alphabet[alphabet.index(root[-2]) ^ 1] + "="  # other padding bits
    assert base64.b64decode(other, validate=True) == log.tree.root(5) and other != root
    note = log.signer.sign(f"{log.signer.name}\n5\n{other}\n")
    status, _, text = _post(client, AddCheckpoint(0, (), note).encode())
    assert status == 400 and "not canonical base64" in text
    assert witness.state.read() == {}  # nothing recorded

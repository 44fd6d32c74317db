"""The auditor catches each kind of tampering and names the first bad index."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kcert.log import merkle
from kcert.log.errors import LogRangeError
from kcert.log.leaf import build_leaf
from kcert.log.merkle import MemoryTree
from kcert.log.monitor import AuditResult, AuditState, audit_log
from kcert.log.note import Checkpoint, Signer

ORIGIN = "test.example/log"
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _leaf(i: int, note: str = "") -> bytes:
    return build_leaf(index=i, kind="key.trusted", payload={"keyid": f"k{i}", "n": note}, time=WHEN)


class FakeLog:
    """A log served from memory: ``served`` leaves, tree nodes from ``committed`` leaves.

    When the two differ, that is a database whose leaf rows were edited behind
    the tree's back; when ``signer`` differs from the pinned key, a forger.
    """

    def __init__(self, leaves: list[bytes], signer: Signer) -> None:
        self.label = "fake"
        self.served = list(leaves)
        self.signer = signer
        self.tree = MemoryTree()
        for leaf in leaves:
            self.tree.append(merkle.leaf_hash(leaf))
        self.note_override: str | None = None

    def checkpoint(self) -> str:
        if self.note_override is not None:
            return self.note_override
        return Checkpoint(ORIGIN, self.tree.size, self.tree.root()).sign(self.signer)

    def verifier_key(self) -> str:
        return self.signer.verifier.vkey()

    def entries(self, start: int, end: int) -> list[tuple[int, bytes]]:
        if start >= len(self.served):
            raise LogRangeError("past the end")
        return list(enumerate(self.served))[start : min(end, start + 7)]

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        return merkle.inclusion_proof(index, size, self.tree)

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        return merkle.consistency_proof(first, second, self.tree)


@pytest.fixture
def signer() -> Signer:
    return Signer(ORIGIN, Ed25519PrivateKey.generate())


def _log(n: int, signer: Signer) -> FakeLog:
    return FakeLog([_leaf(i) for i in range(n)], signer)


def _audit(log: FakeLog, signer: Signer, **kw: object) -> AuditResult:
    return audit_log(log, signer.verifier, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 2, 5, 37, 64])
def test_an_untouched_log_verifies(signer: Signer, n: int) -> None:
    result = _audit(_log(n, signer), signer)
    assert result.ok, result.findings
    assert result.checkpoint is not None and result.checkpoint.size == n
    assert len(result.leaf_hashes) == n


@pytest.mark.parametrize("n,bad", [(1, 0), (2, 1), (37, 0), (37, 17), (37, 36), (64, 63)])
def test_a_tampered_leaf_is_named(signer: Signer, n: int, bad: int) -> None:
    log = _log(n, signer)
    log.served[bad] = _leaf(bad, note="edited")  # still canonical, still says its index
    result = _audit(log, signer)
    assert not result.ok
    assert result.first_bad_index == bad


@pytest.mark.parametrize("bad", [0, 9, 36])
def test_a_dropped_leaf_is_named(signer: Signer, bad: int) -> None:
    log = _log(37, signer)
    del log.served[bad]
    result = _audit(log, signer)
    assert result.first_bad_index == bad


@pytest.mark.parametrize("bad", [0, 12, 35])
def test_a_reordered_pair_is_named(signer: Signer, bad: int) -> None:
    log = _log(37, signer)
    log.served[bad], log.served[bad + 1] = log.served[bad + 1], log.served[bad]
    result = _audit(log, signer)
    assert result.first_bad_index == bad


def test_a_leaf_rewritten_to_claim_its_slot_is_still_caught(signer: Signer) -> None:
    log = _log(20, signer)
    # Swapped and each re-indexed: the leaves alone look fine, only the root knows.
    log.served[4] = _leaf(4, note="was 5")
    log.served[5] = _leaf(5, note="was 4")
    assert _audit(log, signer).first_bad_index == 4


def test_a_checkpoint_signed_by_another_key_is_refused(signer: Signer) -> None:
    log = _log(10, signer)
    log.signer = Signer(ORIGIN, Ed25519PrivateKey.generate())
    result = _audit(log, signer)
    assert not result.ok and result.checkpoint is None
    assert "no signature by the pinned key" in result.findings[0].message


@pytest.mark.parametrize("edit", ["root", "size"])
def test_an_edited_checkpoint_is_refused(signer: Signer, edit: str) -> None:
    log = _log(10, signer)
    note = log.checkpoint()
    lines = note.split("\n")
    if edit == "size":
        lines[1] = "9"
    else:
        lines[2] = Checkpoint(ORIGIN, 10, bytes(32)).body().split("\n")[2]
    log.note_override = "\n".join(lines)
    result = _audit(log, signer)
    assert not result.ok and result.checkpoint is None
    assert "does not verify" in result.findings[0].message


def test_consistency_with_an_older_checkpoint(signer: Signer) -> None:
    log = _log(10, signer)
    old = log.checkpoint()
    for i in range(10, 25):
        log.served.append(_leaf(i))
        log.tree.append(merkle.leaf_hash(log.served[-1]))
    result = _audit(log, signer, previous=[("old", old)])
    assert result.ok and result.consistent_with == ("old",)


def test_an_edited_leaf_is_named_against_an_older_checkpoint(signer: Signer) -> None:
    log = _log(10, signer)
    old = log.checkpoint()
    for i in range(10, 16):
        log.served.append(_leaf(i))
        log.tree.append(merkle.leaf_hash(log.served[-1]))
    log.served[6] = _leaf(6, note="edited")
    result = _audit(log, signer, previous=[("old", old)])
    assert result.first_bad_index == 6
    assert any("old (size 10)" in f.message for f in result.findings)


def test_history_rewritten_behind_an_older_checkpoint_is_caught(signer: Signer) -> None:
    old = _log(10, signer).checkpoint()
    # A fully consistent new log whose entry 6 differs: its own checkpoint verifies,
    # and nothing it serves can say which entry changed, so no index is guessed.
    leaves = [_leaf(i, note="rewritten" if i == 6 else "") for i in range(16)]
    result = _audit(FakeLog(leaves, signer), signer, previous=[("old", old)])
    assert not result.ok
    assert result.first_bad_index is None
    assert "rewrote its history" in result.findings[0].message


def test_history_rewritten_is_named_from_saved_leaf_hashes(signer: Signer) -> None:
    first = _audit(_log(10, signer), signer)
    leaves = [_leaf(i, note="rewritten" if i == 3 else "") for i in range(12)]
    result = _audit(FakeLog(leaves, signer), signer, known_leaf_hashes=first.leaf_hashes)
    assert result.first_bad_index == 3


def test_a_shrunk_log_is_caught(signer: Signer) -> None:
    old = _log(12, signer).checkpoint()
    result = _audit(_log(10, signer), signer, previous=[("old", old)])
    assert not result.ok and result.first_bad_index == 10


def test_a_forged_older_checkpoint_is_reported(signer: Signer) -> None:
    forged = Checkpoint(ORIGIN, 5, bytes(32)).sign(Signer(ORIGIN, Ed25519PrivateKey.generate()))
    result = _audit(_log(10, signer), signer, previous=[("given", forged)])
    assert not result.ok
    assert result.findings[0].message.startswith("given:")


def test_state_round_trip(tmp_path: object, signer: Signer) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    state = AuditState(tmp_path / "s")
    assert state.pinned() is None and state.last_checkpoint() is None
    state.pin(signer.verifier)
    assert state.pinned() == signer.verifier
    result = _audit(_log(9, signer), signer)
    state.save(result)
    assert state.leaf_hashes() == list(result.leaf_hashes)
    assert state.last_checkpoint() == result.note
    failed = _audit(_log(0, signer), Signer(ORIGIN, Ed25519PrivateKey.generate()))
    with pytest.raises(ValueError):
        state.save(failed)

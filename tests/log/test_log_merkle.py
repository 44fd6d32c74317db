"""The Merkle library against the RFC's own definitions, for every small tree."""

from __future__ import annotations

import hashlib

import pytest
import rfc6962_reference as ref

from kcert.log import merkle
from kcert.log.errors import LogRangeError, ProofError
from kcert.log.merkle import CompactRange, MemoryTree
from kcert.log.proofs import verify_consistency, verify_inclusion

MAX = 200


def _leaves(n: int) -> tuple[bytes, ...]:
    return tuple(f"leaf {i}".encode() for i in range(n))


@pytest.fixture(scope="module")
def tree() -> MemoryTree:
    t = MemoryTree()
    for leaf in _leaves(MAX):
        t.append(merkle.leaf_hash(leaf))
    return t


def test_hashing_is_rfc6962() -> None:
    assert merkle.leaf_hash(b"x") == hashlib.sha256(b"\x00x").digest()
    assert (
        merkle.node_hash(b"a" * 32, b"b" * 32)
        == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()
    )
    assert merkle.EMPTY_ROOT == hashlib.sha256(b"").digest()


def test_known_answer_from_the_ct_test_vectors() -> None:
    # The RFC 6962 test vector used by certificate-transparency-go and Trillian:
    # leaves "", 0x00, 0x10, 0x2021, 0x3031, 0x40414243, ... (first 8).
    leaves = [bytes.fromhex(x) for x in
              ["", "00", "10", "2021", "3031", "40414243", "5051525354555657",
               "606162636465666768696a6b6c6d6e6f"]]  # fmt: skip
    t = MemoryTree()
    for leaf in leaves:
        t.append(merkle.leaf_hash(leaf))
    assert t.root().hex() == "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"
    assert t.root(1).hex() == "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"


def test_roots_match_the_reference_for_every_size(tree: MemoryTree) -> None:
    leaves = _leaves(MAX)
    for n in range(MAX + 1):
        assert tree.root(n) == ref.mth(leaves[:n]), n


def test_inclusion_proofs_match_the_reference_and_verify(tree: MemoryTree) -> None:
    leaves = _leaves(MAX)
    for n in range(1, MAX + 1):
        root = ref.mth(leaves[:n])
        for m in range(n):
            got = merkle.inclusion_proof(m, n, tree)
            assert got == ref.path(m, leaves[:n]), (m, n)
            verify_inclusion(m, n, merkle.leaf_hash(leaves[m]), got, root)


def test_consistency_proofs_match_the_reference_and_verify(tree: MemoryTree) -> None:
    leaves = _leaves(MAX)
    roots = [ref.mth(leaves[:n]) for n in range(MAX + 1)]
    for n in range(1, MAX + 1):
        for m in range(1, n + 1):
            got = merkle.consistency_proof(m, n, tree)
            assert got == ref.proof(m, leaves[:n]), (m, n)
            verify_consistency(m, n, roots[m], roots[n], got)


def test_wrong_inclusion_proofs_are_rejected(tree: MemoryTree) -> None:
    leaves = _leaves(64)
    for n in (1, 2, 7, 8, 33, 64):
        root = tree.root(n)
        for m in range(n):
            good = merkle.inclusion_proof(m, n, tree)
            h = merkle.leaf_hash(leaves[m])
            with pytest.raises(ProofError):
                verify_inclusion(m, n, merkle.leaf_hash(b"other"), good, root)
            for i in range(len(good)):
                bad = list(good)
                bad[i] = bytes(32)
                with pytest.raises(ProofError):
                    verify_inclusion(m, n, h, bad, root)
            if n > 1:
                with pytest.raises(ProofError):
                    verify_inclusion((m + 1) % n, n, h, good, root)
                with pytest.raises(ProofError):
                    verify_inclusion(m, n, h, good[:-1], root)
            with pytest.raises(ProofError):
                verify_inclusion(m, n, h, [*good, bytes(32)], root)


def test_wrong_consistency_proofs_are_rejected(tree: MemoryTree) -> None:
    for n in (2, 3, 8, 9, 31, 64, 100):
        for m in range(1, n):
            good = merkle.consistency_proof(m, n, tree)
            r1, r2 = tree.root(m), tree.root(n)
            with pytest.raises(ProofError):
                verify_consistency(m, n, tree.root(m - 1) if m > 1 else bytes(32), r2, good)
            with pytest.raises(ProofError):
                verify_consistency(m, n, r1, tree.root(n - 1), good)
            for i in range(len(good)):
                bad = list(good)
                bad[i] = bytes(32)
                with pytest.raises(ProofError):
                    verify_consistency(m, n, r1, r2, bad)
            with pytest.raises(ProofError):
                verify_consistency(m, n, r1, r2, good[:-1])
            with pytest.raises(ProofError):
                verify_consistency(m, n, r1, r2, [*good, bytes(32)])
    with pytest.raises(ProofError):
        verify_consistency(5, 5, tree.root(5), tree.root(4), [])
    with pytest.raises(ProofError):
        verify_consistency(0, 5, merkle.EMPTY_ROOT, tree.root(5), [])


def test_bad_ranges_are_refused(tree: MemoryTree) -> None:
    for index, size in ((0, 0), (5, 5), (-1, 3)):
        with pytest.raises(LogRangeError):
            merkle.inclusion_proof(index, size, tree)
    for first, second in ((0, 5), (6, 5)):
        with pytest.raises(LogRangeError):
            merkle.consistency_proof(first, second, tree)


def test_compact_range_resumes_from_its_edge(tree: MemoryTree) -> None:
    leaves = _leaves(MAX)
    for start in (0, 1, 5, 64, 127, 150):
        keys = CompactRange.edge_keys(start)
        edge = tree.nodes(keys)
        resumed = CompactRange(start, [edge[k] for k in keys])
        for i in range(start, MAX):
            made = resumed.append(merkle.leaf_hash(leaves[i]))
            for key, value in made:
                assert tree.nodes([key])[key] == value
        assert resumed.root() == tree.root()


def test_proof_cost_is_logarithmic() -> None:
    t = MemoryTree()
    n = 1 << 14
    for i in range(n + 123):
        t.append(merkle.leaf_hash(i.to_bytes(4, "big")))
    size = t.size
    depth = size.bit_length()
    worst = 0
    for m in range(0, size, 97):
        t.reads = 0
        merkle.inclusion_proof(m, size, t)
        worst = max(worst, t.reads)
        t.reads = 0
        merkle.consistency_proof(m + 1, size, t)
        worst = max(worst, t.reads)
    # One node per level, plus at most one right-edge subtree split into its set bits.
    assert worst <= 2 * depth + 1

"""Verification of RFC 9162 inclusion and consistency proofs.

These follow the RFC's own algorithms (sections 2.1.3.2 and 2.1.4.2) step by
step, so they can be compared with the text; they need no tree, only hashes.
Each raises :class:`ProofError` with the reason rather than returning a bool,
so a caller cannot forget to look.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from kcert.log.errors import ProofError
from kcert.log.merkle import HASH_SIZE, node_hash


def _check_hashes(proof: Sequence[bytes]) -> None:
    if any(len(h) != HASH_SIZE for h in proof):
        raise ProofError(f"a proof holds {HASH_SIZE}-byte hashes only")


def root_from_inclusion_proof(
    index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes]
) -> bytes:
    """The root that ``proof`` implies for leaf ``index`` of a tree of ``size``."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not in a tree of size {size}")
    _check_hashes(proof)
    fn, sn, r = index, size - 1, leaf_hash
    for p in proof:
        if sn == 0:
            raise ProofError("inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("inclusion proof is shorter than the tree is deep")
    return r


def verify_inclusion(
    index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """RFC 9162 2.1.3.2: raise unless ``proof`` shows leaf ``index`` is in the tree ``root``."""
    if not hmac.compare_digest(root_from_inclusion_proof(index, size, leaf_hash, proof), root):
        raise ProofError(f"leaf {index} is not in the tree of size {size} with that root")


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 2.1.4.2: raise unless the tree ``second_root`` extends ``first_root``."""
    if not 0 < first <= second:
        raise ProofError(f"no consistency proof exists from size {first} to size {second}")
    _check_hashes(proof)
    if first == second:
        if proof or not hmac.compare_digest(first_root, second_root):
            raise ProofError(f"two different roots for the same size {first}")
        return
    if not proof:
        raise ProofError("consistency proof is empty")
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_root)  # a perfect first tree is its own first proof node
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("consistency proof is shorter than the tree is deep")
    if not hmac.compare_digest(fr, first_root):
        raise ProofError(
            f"the tree of size {second} does not extend the given tree of size {first}"
        )
    if not hmac.compare_digest(sr, second_root):
        raise ProofError(f"consistency proof does not lead to the root of size {second}")

"""An independent RFC 6962 / RFC 9162 implementation, written from the RFC text.

Deliberately naive (plain recursion over sequences of leaves, no stored nodes,
no shared code with ``kcert.log``), so that the library's proofs are checked
against the definitions themselves, not against a copy of the same idea. The
only concession to speed is memoizing MTH, which changes no result.
"""

from __future__ import annotations

import functools
import hashlib


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _k(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


@functools.cache
def mth(leaves: tuple[bytes, ...]) -> bytes:
    """RFC 6962 2.1: MTH(D[n])."""
    n = len(leaves)
    if n == 0:
        return _h(b"")
    if n == 1:
        return _h(b"\x00" + leaves[0])
    k = _k(n)
    return _h(b"\x01" + mth(leaves[:k]) + mth(leaves[k:]))


def path(m: int, leaves: tuple[bytes, ...]) -> list[bytes]:
    """RFC 6962 2.1.1: PATH(m, D[n])."""
    n = len(leaves)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return path(m, leaves[:k]) + [mth(leaves[k:])]
    return path(m - k, leaves[k:]) + [mth(leaves[:k])]


def _subproof(m: int, leaves: tuple[bytes, ...], b: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if b else [mth(leaves)]
    k = _k(n)
    if m <= k:
        return _subproof(m, leaves[:k], b) + [mth(leaves[k:])]
    return _subproof(m - k, leaves[k:], False) + [mth(leaves[:k])]


def proof(m: int, leaves: tuple[bytes, ...]) -> list[bytes]:
    """RFC 6962 2.1.2: PROOF(m, D[n]) for 0 < m <= n."""
    return _subproof(m, leaves, True)

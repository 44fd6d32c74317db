"""RFC 6962 Merkle tree hashing over stored perfect subtrees.

A log of ``n`` leaves is kept as the hashes of its *complete perfect
subtrees*: ``NodeKey(level, index)`` is the root of leaves
``[index * 2**level, (index + 1) * 2**level)``. Once written such a node never
changes, so a store can keep them all, and every hash the RFC asks for, ``MTH``
of any range that its recursion reaches, is a right fold over at most
``log2(n) + 1`` of them. That makes an append and a proof cost O(log n) reads.

The module is pure: proofs are first *planned* (which ranges, hence which
nodes) and then *assembled* from whatever :class:`NodeReader` holds the nodes,
a database or the in-memory :class:`MemoryTree`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kcert.log.errors import LogRangeError

HASH_SIZE = 32
#: RFC 6962: the hash of an empty tree is the hash of the empty string.
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(leaf: bytes) -> bytes:
    """``SHA-256(0x00 || leaf)``: the domain byte keeps leaves and nodes apart."""
    return hashlib.sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + left + right).digest()


@dataclass(frozen=True, slots=True, order=True)
class NodeKey:
    """The root of the perfect subtree over ``[index << level, (index + 1) << level)``."""

    level: int
    index: int

    @property
    def start(self) -> int:
        return self.index << self.level

    @property
    def end(self) -> int:
        return (self.index + 1) << self.level


class NodeReader(Protocol):
    """Anything that can hand out stored perfect-subtree hashes."""

    def nodes(self, keys: Collection[NodeKey]) -> Mapping[NodeKey, bytes]:
        """The hash of each key; every key asked for must be present."""
        ...


def split_point(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (``n >= 2``), as in RFC 6962."""
    return 1 << ((n - 1).bit_length() - 1)


def subtree_keys(start: int, end: int) -> list[NodeKey]:
    """The perfect subtrees, left to right, whose right fold is ``MTH(D[start:end])``.

    Valid for the ranges the RFC recursion reaches: ``start`` is a multiple of a
    power of two at least ``end - start``. Each set bit of the width, from the
    highest, is one aligned perfect subtree.
    """
    width = end - start
    if width <= 0:
        raise ValueError(f"empty range [{start}, {end})")
    if start & ((1 << (width - 1).bit_length()) - 1):
        raise ValueError(f"range [{start}, {end}) is not a subtree of any RFC 6962 tree")
    keys: list[NodeKey] = []
    at = start
    for level in range(width.bit_length() - 1, -1, -1):
        if width >> level & 1:
            keys.append(NodeKey(level, at >> level))
            at += 1 << level
    return keys


def fold(hashes: Sequence[bytes]) -> bytes:
    """Right fold ``H(h0, H(h1, ... H(h_{k-2}, h_{k-1})))`` of a subtree decomposition."""
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = node_hash(h, acc)
    return acc


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """RFC 9162 2.1.3.1 ``PATH(index, D[size])`` as leaf ranges, leaf side first."""
    if not 0 <= index < size:
        raise LogRangeError(f"leaf index {index} is not in a tree of size {size}")
    path: list[tuple[int, int]] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = split_point(hi - lo)
        if index < lo + k:
            path.append((lo + k, hi))
            hi = lo + k
        else:
            path.append((lo, lo + k))
            lo += k
    path.reverse()
    return path


def consistency_ranges(first: int, second: int) -> list[tuple[int, int]]:
    """RFC 9162 2.1.4.1 ``PROOF(first, D[second])`` as leaf ranges, in proof order."""
    if not 0 < first <= second:
        raise LogRangeError(
            f"a consistency proof needs 0 < first <= second; got first={first}, second={second}"
        )
    out: list[tuple[int, int]] = []
    lo, hi, m, whole = 0, second, first, True
    while m != hi - lo:
        k = split_point(hi - lo)
        if m <= k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            m -= k
            lo += k
            whole = False
    if not whole:
        out.append((lo, hi))
    out.reverse()
    return out


def assemble(ranges: Sequence[tuple[int, int]], reader: NodeReader) -> list[bytes]:
    """``MTH`` of each range, fetching every node they need in one read."""
    plans = [subtree_keys(lo, hi) for lo, hi in ranges]
    wanted = {key for plan in plans for key in plan}
    got = reader.nodes(wanted) if wanted else {}
    return [fold([got[key] for key in plan]) for plan in plans]


def root(size: int, reader: NodeReader) -> bytes:
    """``MTH(D[0:size])``."""
    if size == 0:
        return EMPTY_ROOT
    return assemble([(0, size)], reader)[0]


def inclusion_proof(index: int, size: int, reader: NodeReader) -> list[bytes]:
    return assemble(inclusion_ranges(index, size), reader)


def consistency_proof(first: int, second: int, reader: NodeReader) -> list[bytes]:
    return assemble(consistency_ranges(first, second), reader)


class CompactRange:
    """The right edge of a growing tree: one perfect subtree per set bit of its size.

    Appending a leaf merges equal-sized neighbours and reports every perfect
    subtree that became complete, which is exactly what a store must write.
    """

    def __init__(self, size: int = 0, edge: Iterable[bytes] = ()) -> None:
        keys = subtree_keys(0, size) if size else []
        hashes = list(edge)
        if len(hashes) != len(keys):
            raise ValueError(f"a tree of size {size} has {len(keys)} edge nodes, not {len(hashes)}")
        self.size = size
        self._edge: list[tuple[NodeKey, bytes]] = list(zip(keys, hashes, strict=True))

    @staticmethod
    def edge_keys(size: int) -> list[NodeKey]:
        """The nodes a store must read to resume appending at ``size``."""
        return subtree_keys(0, size) if size else []

    def append(self, leaf_hash_: bytes) -> list[tuple[NodeKey, bytes]]:
        """Add one leaf hash; return the new complete nodes, the leaf's own first."""
        key, value = NodeKey(0, self.size), leaf_hash_
        made = [(key, value)]
        while self._edge and self._edge[-1][0].level == key.level:
            left_key, left = self._edge.pop()
            key, value = NodeKey(key.level + 1, left_key.index >> 1), node_hash(left, value)
            made.append((key, value))
        self._edge.append((key, value))
        self.size += 1
        return made

    def root(self) -> bytes:
        if not self._edge:
            return EMPTY_ROOT
        return fold([h for _, h in self._edge])

    def edge(self) -> list[bytes]:
        """The right edge's hashes, to resume with ``CompactRange(size, edge)``."""
        return [h for _, h in self._edge]


class MemoryTree:
    """Every perfect subtree of a log held in memory: a :class:`NodeReader` for auditors."""

    def __init__(self) -> None:
        self._levels: list[list[bytes]] = [[]]
        self._range = CompactRange()
        #: Nodes handed out by :meth:`nodes`, so tests can count the work a proof costs.
        self.reads = 0

    @property
    def size(self) -> int:
        return len(self._levels[0])

    def append(self, leaf_hash_: bytes) -> None:
        for key, value in self._range.append(leaf_hash_):
            if key.level == len(self._levels):
                self._levels.append([])
            self._levels[key.level].append(value)

    def leaf_hash_at(self, index: int) -> bytes:
        return self._levels[0][index]

    def nodes(self, keys: Collection[NodeKey]) -> dict[NodeKey, bytes]:
        self.reads += len(keys)
        try:
            return {key: self._levels[key.level][key.index] for key in keys}
        except IndexError as exc:
            raise LogRangeError(f"tree of size {self.size} has no such node") from exc

    def root(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        if not 0 <= size <= self.size:
            raise LogRangeError(f"size {size} exceeds the tree's {self.size} leaves")
        return root(size, self)

"""Auditing a log with nothing but its public key.

:func:`audit_log` takes the current checkpoint from a :class:`LogSource`,
checks its signature with the pinned :class:`Verifier`, reads every entry,
checks each leaf names its own position and is canonical, recomputes the root,
and proves the current tree extends every older checkpoint it is given. When
something differs it names the *first bad index*:

- a leaf that is malformed, or names another position (dropped, reordered),
  is named directly;
- a leaf that hashes differently from what a trusted root commits to is found
  by bisection: the prefix of ``m`` leaves is good exactly when the log can
  prove its root consistent with the trusted root, and a log cannot forge such
  a proof (RFC 9162's binding), so the largest good ``m`` is the bad index;
- a leaf that differs from the leaf hashes saved at the last successful audit
  is named by comparing those hashes.

The state an auditor keeps between runs lives in :class:`AuditState`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kcert.log.errors import LogError, LogRangeError, NoteError, ProofError, SignatureError
from kcert.log.leaf import LeafError, parse_leaf
from kcert.log.merkle import HASH_SIZE, MemoryTree, leaf_hash
from kcert.log.note import Checkpoint, Verifier, open_checkpoint
from kcert.log.proofs import verify_consistency, verify_inclusion
from kcert.log.source import LogSource

Progress = Callable[[int, int], None]


class ProofSource(Protocol):
    """What proving leaves against a checkpoint needs from a log: its consistency proofs."""

    def consistency_proof(self, first: int, second: int) -> list[bytes]: ...


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that does not hold; ``index`` is the entry it concerns, when one does."""

    index: int | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "message": self.message}


@dataclass(frozen=True)
class AuditResult:
    source: str
    checkpoint: Checkpoint | None
    note: str | None
    findings: tuple[Finding, ...]
    #: Checkpoints (by label) the current one was proved to extend.
    consistent_with: tuple[str, ...] = ()
    leaf_hashes: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return not self.findings and self.checkpoint is not None

    @property
    def first_bad_index(self) -> int | None:
        indices = [f.index for f in self.findings if f.index is not None]
        return min(indices) if indices else None

    def to_json(self) -> dict[str, Any]:
        cp = self.checkpoint
        return {
            "ok": self.ok,
            "log": self.source,
            "origin": cp.origin if cp else None,
            "size": cp.size if cp else None,
            "root": base64.b64encode(cp.root).decode() if cp else None,
            "first_bad_index": self.first_bad_index,
            "findings": [f.to_json() for f in self.findings],
            "consistent_with": list(self.consistent_with),
        }


def audit_log(
    source: LogSource,
    verifier: Verifier,
    *,
    previous: Sequence[tuple[str, str]] = (),
    known_leaf_hashes: Sequence[bytes] = (),
    progress: Progress | None = None,
) -> AuditResult:
    """Audit ``source`` against its current checkpoint and each ``(label, note)`` in ``previous``.

    ``known_leaf_hashes`` are the leaf hashes this auditor saw last time, in order.
    """
    findings: list[Finding] = []
    try:
        note = source.checkpoint()
    except LogError as exc:
        # A registry that refuses to sign (its log guard found a rollback or fork) is audited
        # against the last checkpoint it did sign, when the source can read it: the finding
        # fails the audit, and the entries are still checked, naming the first bad one.
        last_signed = getattr(source, "last_signed", None)
        signed = last_signed() if exc.kind == "log-inconsistent" and last_signed else None
        if not isinstance(signed, str):
            raise
        note = signed
        findings.append(Finding(None, f"the registry refuses to sign its current tree: {exc}"))
    try:
        current = open_checkpoint(note, verifier)
    except (SignatureError, NoteError) as exc:
        return AuditResult(source.label, None, note, (Finding(None, f"current checkpoint: {exc}"),))
    olds: list[tuple[str, Checkpoint]] = []
    for label, text in previous:
        try:
            olds.append((label, open_checkpoint(text, verifier)))
        except (SignatureError, NoteError) as exc:
            findings.append(Finding(None, f"{label}: {exc}"))

    tree = _read_leaves(source, current.size, findings, progress)
    complete = tree.size == current.size
    if complete and tree.root() != current.root:
        bad = _first_divergence(source, tree, current.size, current.root)
        findings.append(
            Finding(
                bad, f"entry {bad} is not the leaf the checkpoint of size {current.size} commits to"
            )
        )
    for position, known in enumerate(known_leaf_hashes[: tree.size]):
        if tree.leaf_hash_at(position) != known:
            findings.append(Finding(position, f"entry {position} changed since the last audit"))
            break
    if len(known_leaf_hashes) > current.size:
        findings.append(
            Finding(
                current.size,
                f"the log shrank: {len(known_leaf_hashes)} entries were seen "
                f"before, the checkpoint has {current.size}",
            )  # fmt: skip
        )

    consistent: list[str] = []
    for label, old in olds:
        if _check_older(source, tree, old, current, label, findings):
            consistent.append(label)
    if complete and current.size and not findings:
        _spot_check_inclusion(source, tree, current, findings)
    hashes = tuple(tree.leaf_hash_at(i) for i in range(tree.size)) if not findings else ()
    return AuditResult(source.label, current, note, tuple(findings), tuple(consistent), hashes)


def prove_leaves(
    tree: MemoryTree, checkpoints: Sequence[tuple[str, Checkpoint]], proofs: ProofSource
) -> list[Finding]:
    """Leaves already read (their hashes in ``tree``) against each ``(label, checkpoint)``.

    Each checkpoint must have been opened with the log's key. A tree that does not
    hash to what one commits to has its first bad leaf named, by bisection over
    ``proofs`` (which cannot place a leaf they do not hold: a log that rewrote its
    nodes too is named with the first prefix it cannot prove).
    """
    findings: list[Finding] = []
    for label, checkpoint in checkpoints:
        if checkpoint.size > tree.size:
            findings.append(
                Finding(
                    tree.size,
                    f"entry {tree.size} is missing: {label} commits to {checkpoint.size} "
                    f"entries, the log holds {tree.size}",
                )  # fmt: skip
            )
        elif checkpoint.size and tree.root(checkpoint.size) != checkpoint.root:
            bad = _first_divergence(proofs, tree, checkpoint.size, checkpoint.root)
            findings.append(
                Finding(
                    bad,
                    f"entry {bad} is not the leaf {label} (size {checkpoint.size}) commits to",
                )
            )
    return findings


def _read_leaves(
    source: LogSource, size: int, findings: list[Finding], progress: Progress | None
) -> MemoryTree:
    tree = MemoryTree()
    structural = False
    while tree.size < size:
        position = tree.size
        try:
            batch = source.entries(position, size)
        except LogRangeError:
            batch = []  # the log counts more entries than it will serve
        if not batch:
            findings.append(
                Finding(
                    position,
                    f"entry {position} is missing: the log serves {position} "
                    f"of the {size} entries its checkpoint counts",
                )  # fmt: skip
            )
            break
        for served, leaf in batch:
            position = tree.size
            if position >= size:
                break
            if not structural:
                problem = None
                if served != position:
                    problem = (
                        f"entry {position} is missing: the log serves entry {served} in its place"
                    )
                else:
                    try:
                        parse_leaf(position, leaf)
                    except LeafError as exc:
                        problem = str(exc)
                if problem is not None:
                    # Every later position would disagree too; the first is what matters.
                    findings.append(Finding(position, problem))
                    structural = True
            tree.append(leaf_hash(leaf))
        if progress is not None:
            progress(tree.size, size)
    return tree


def _prefix_consistent(
    source: ProofSource, tree: MemoryTree, m: int, size: int, root: bytes
) -> bool:
    """Does the log prove our first ``m`` leaves are the first ``m`` of the tree ``root``?"""
    try:
        proof = source.consistency_proof(m, size)
        verify_consistency(m, size, tree.root(m), root, proof)
    except LogError:
        return False
    return True


def _first_divergence(source: ProofSource, tree: MemoryTree, size: int, root: bytes) -> int:
    """The first leaf of ours that the tree ``root`` of ``size`` leaves does not hold."""
    good, bad = 0, size  # the empty prefix always agrees; the whole tree does not
    while bad - good > 1:
        mid = (good + bad) // 2
        if _prefix_consistent(source, tree, mid, size, root):
            good = mid
        else:
            bad = mid
    return good


def _check_older(
    source: LogSource, tree: MemoryTree, old: Checkpoint, current: Checkpoint, label: str,
    findings: list[Finding],
) -> bool:  # fmt: skip
    if old.size > current.size:
        findings.append(
            Finding(
                current.size,
                f"the log shrank: {label} has {old.size} entries, "
                f"the current checkpoint {current.size}",
            )  # fmt: skip
        )
        return False
    if old.size == 0:
        return True
    why = ""
    try:
        proof = source.consistency_proof(old.size, current.size)
        verify_consistency(old.size, current.size, old.root, current.root, proof)
    except LogError as exc:
        why = exc.diagnostics()
    if old.size <= tree.size and tree.root(old.size) != old.root:
        if not why:
            # The log's tree still extends the old one: its proofs can place the bad leaf.
            bad = _first_divergence(source, tree, old.size, old.root)
            findings.append(
                Finding(
                    bad, f"entry {bad} differs from what {label} (size {old.size}) committed to"
                )
            )
        else:
            # Rewritten history: no proof from this log can say which entry changed.
            findings.append(
                Finding(
                    None,
                    f"the log rewrote its history: its first {old.size} entries no longer hash "
                    f"to the root of {label}, and it cannot prove it extends that ({why}); "
                    "which entry changed cannot be told without the leaf hashes of that audit",
                )
            )
        return False
    if why:
        findings.append(Finding(None, f"the log cannot prove it extends {label}: {why}"))
        return False
    return True


def _spot_check_inclusion(
    source: LogSource, tree: MemoryTree, current: Checkpoint, findings: list[Finding]
) -> None:
    """The log's own proofs must agree with the leaves it served (first and last)."""
    for index in sorted({0, current.size - 1}):
        try:
            proof = source.inclusion_proof(index, current.size)
            verify_inclusion(index, current.size, tree.leaf_hash_at(index), proof, current.root)
        except (LogError, ProofError) as exc:
            findings.append(
                Finding(index, f"the log's inclusion proof of entry {index} fails: {exc}")
            )


# --- what an auditor keeps between runs ------------------------------------------------------


def state_dir_name(source_label: str) -> str:
    """A stable, file-system-safe folder name for one audited log."""
    readable = re.sub(r"[^A-Za-z0-9.-]+", "_", source_label)[-48:].strip("_") or "log"
    return f"{readable}-{hashlib.sha256(source_label.encode()).hexdigest()[:12]}"


class AuditState:
    """Pinned key, last verified checkpoint and its leaf hashes, under one folder.

    Files: ``log.vkey`` (the pinned C2SP verifier key), ``checkpoint`` (the
    last note that verified), ``leaf-hashes`` (its leaves' hashes, 32 bytes each).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @property
    def key_file(self) -> Path:
        return self.folder / "log.vkey"

    @property
    def checkpoint_file(self) -> Path:
        return self.folder / "checkpoint"

    @property
    def hashes_file(self) -> Path:
        return self.folder / "leaf-hashes"

    def pinned(self) -> Verifier | None:
        if not self.key_file.exists():
            return None
        return Verifier.from_vkey(self.key_file.read_text(encoding="utf-8"))

    def pin(self, verifier: Verifier) -> None:
        self._write(self.key_file, (verifier.vkey() + "\n").encode())

    def last_checkpoint(self) -> str | None:
        if not self.checkpoint_file.exists():
            return None
        return self.checkpoint_file.read_text(encoding="utf-8")

    def leaf_hashes(self) -> list[bytes]:
        if not self.hashes_file.exists():
            return []
        data = self.hashes_file.read_bytes()
        if len(data) % HASH_SIZE:
            raise LogError(f"{self.hashes_file} is damaged; delete it to start over")
        return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]

    def save(self, result: AuditResult) -> None:
        """Remember a successful audit (never a failed one)."""
        if not result.ok or result.note is None:
            raise ValueError("only a successful audit is saved")
        self._write(self.hashes_file, b"".join(result.leaf_hashes))
        self._write(self.checkpoint_file, result.note.encode())

    def _write(self, path: Path, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a crash leaves the old file, never half a new one

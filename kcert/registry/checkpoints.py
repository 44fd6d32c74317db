"""The log guards itself: it signs only trees that extend the last checkpoint it signed.

The database is not trusted to remember what the log promised. The last
checkpoint the registry signed lives beside its log key, outside the database,
in ``$KCERT_HOME/log-checkpoint`` (the C2SP signed note, with any witness
cosignatures after the log's signature; written atomically). Before signing,
the registry reads the tree from the database and proves it consistent with
that checkpoint (RFC 9162). A database restored from an older copy (fewer
entries: a *rollback*), or one whose tree differs at the same size or cannot
be proved to extend it (a *fork*), is refused: nothing is signed, and the
registry reports :class:`LogInconsistent` (problem type ``log-inconsistent``,
HTTP 503) from the checkpoint route and ``/v1/log/health``, denies every gate
answer and refuses writes until the database holds a tree that extends the
checkpoint again.

Signing runs under an exclusive ``flock`` on ``log-checkpoint.lock`` and reads
the database only after taking it, so workers sign one after another and each
sees every tree signed before it. Each new checkpoint goes to the configured
witnesses (C2SP tlog-witness); their cosignatures are kept in the file and
served with the checkpoint. A witness that *shows* a checkpoint signed by this
log's key that the database's tree does not extend is evidence of a rollback
or fork too, and is treated the same; a bare ``409``/``422`` is only a witness
failure. The signed root must also be the hash of the entries (each process
hashes every entry once, then the new ones), and the gate proves any tree
larger than the last proved before it allows.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from kcert.errors import KcertError
from kcert.log import merkle
from kcert.log.cosignature import CosignerKey
from kcert.log.errors import (
    LogError,
    NoteError,
    ProofError,
    SignatureError,
    WitnessSawOtherTree,
    WitnessSubmitError,
)
from kcert.log.merkle import CompactRange, leaf_hash
from kcert.log.note import Checkpoint, Signer, open_checkpoint
from kcert.log.proofs import verify_consistency
from kcert.log.witness_client import WitnessEndpoint, held_checkpoint, submit, with_cosignature
from kcert.registry import audit
from kcert.registry.config import WitnessConfig
from kcert.registry.db import read_session
from kcert.registry.errors import LogInconsistent

#: The last signed checkpoint, beside the log key in ``KCERT_HOME``.
CHECKPOINT_FILE = "log-checkpoint"
#: Seconds before a witness that failed is asked again.
WITNESS_RETRY_S = 30.0
#: Seconds after which a tree that did not grow is shown to its witnesses again, for a
#: fresh cosignature (so ``kcert audit verify --witness-max-age`` can ask for one).
WITNESS_REFRESH_S = 60.0
#: Seconds after which a process hashes every entry again, not only the new ones: an
#: entries-only rewrite below the signed size is found within this, without a restart.
FULL_REHASH_S = 300.0

log = logging.getLogger("kcert.log")


def witness_endpoints(configs: Sequence[WitnessConfig]) -> list[WitnessEndpoint]:
    """Parse the configured witnesses (a bad verifier key is a configuration error)."""
    endpoints = []
    for config in configs:
        try:
            endpoints.append(WitnessEndpoint(config.url, CosignerKey.from_vkey(config.vkey)))
        except NoteError as exc:
            raise LogError(f"KCERT_WITNESSES: witness at {config.url}: {exc}") from exc
    return endpoints


class CheckpointGuard:
    """Signs the log's checkpoints for one ``KCERT_HOME``; see the module docstring."""

    def __init__(
        self, home: Path, signer: Signer, *, witnesses: Sequence[WitnessEndpoint] = (),
        client: httpx.Client | None = None, witness_timeout: float = 5.0,
    ) -> None:  # fmt: skip
        self.path = home / CHECKPOINT_FILE
        self.signer = signer
        for endpoint in witnesses:
            if endpoint.key.name == signer.name:
                raise LogError(
                    f"KCERT_WITNESSES: {endpoint.label} is named like this log's origin "
                    f"{signer.name!r}; a witness needs a name of its own"
                )
        self.witnesses = tuple(witnesses)
        self._client = client
        self._timeout = witness_timeout
        self._mutex = threading.Lock()
        self._retry_at: dict[str, float] = {}
        #: (witness url, size, root) each witness has cosigned for this process: a reused
        #: note is submitted again until its witnesses confirm it (see :meth:`_cosign`).
        self._confirmed: dict[tuple[str, int, bytes], float] = {}
        #: Why the log is unhealthy, as last found by this process; ``None`` when it is not.
        self.alarm: LogInconsistent | None = None
        #: The largest tree size this process knows was signed (never above the truth).
        self.signed_size = 0
        #: The largest database tree this process proved to extend the signed checkpoint;
        #: the gate allows from no larger tree before :meth:`verify` has proved it.
        self.verified_size = 0
        #: The database :meth:`verify` reads (set by :meth:`startup`).
        self._engine: Engine | None = None
        #: (mtime, inode, size) of the checkpoint file when :meth:`floor` last read it.
        self._stamp: tuple[int, int, int] | None = None
        #: (size, root, right edge) of the last tree whose entries this process hashed.
        self._hashed: tuple[int, bytes, list[bytes]] | None = None
        self._full_hash_at = 0.0

    # --- the checks --------------------------------------------------------------------------

    def last(self) -> tuple[Checkpoint, str] | None:
        """The last signed checkpoint and its note, verified with the log's own key."""
        try:
            note = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise LogInconsistent(f"cannot read the checkpoint file {self.path}: {exc}") from exc
        try:
            checkpoint = open_checkpoint(note, self.signer.verifier)
        except (NoteError, SignatureError) as exc:
            raise LogInconsistent(
                f"the checkpoint file {self.path} is not a checkpoint signed by this log's key "
                f"({exc}); it was altered, or the log key was replaced"
            ) from exc
        self.signed_size = max(self.signed_size, checkpoint.size)
        return checkpoint, note

    def _current(self, session: Session, last: Checkpoint | None) -> Checkpoint:
        """The database's tree, proved to extend ``last``; :class:`LogInconsistent` if not."""
        session.rollback()  # a snapshot taken now, after the lock, not before it
        current = audit.checkpoint(session, self.signer)
        if current.size < self.signed_size:  # e.g. the file was swapped for an older one
            raise LogInconsistent(
                f"rollback: the database holds {current.size} log entries, but this log "
                f"signed a checkpoint of {self.signed_size}; the database was restored "
                "from an older copy or entries were deleted. Refusing to sign."
            )
        if last is None:
            self._hash_leaves(session, 0, None, current)
            return current
        if current.size < last.size:
            raise LogInconsistent(
                f"rollback: the database holds {current.size} log entries, but this log "
                f"signed a checkpoint of {last.size} ({self.path}); the database was restored "
                "from an older copy or entries were deleted. Refusing to sign."
            )
        if current.size == last.size:
            if current.root != last.root:
                raise LogInconsistent(
                    f"fork: the database's tree of {current.size} entries has another root than "
                    f"the checkpoint this log signed at that size ({self.path}). Refusing to sign."
                )
            if self._full_hash_due():  # the first proof, and every FULL_REHASH_S
                self._hash_leaves(session, 0, None, current)
            return current
        if last.size > 0:
            try:
                proof = audit.consistency_proof(session, last.size, current.size)
                verify_consistency(last.size, current.size, last.root, current.root, proof)
            except (ProofError, LogError) as exc:
                raise LogInconsistent(
                    f"fork: the database's tree of {current.size} entries does not extend the "
                    f"checkpoint of {last.size} this log signed ({self.path}): {exc}. "
                    "Refusing to sign."
                ) from exc
        if self._full_hash_due():  # the first proof, and every FULL_REHASH_S
            self._hash_leaves(session, 0, None, current)
        else:
            self._hash_leaves(session, last.size, last.root, current)
        return current

    def _full_hash_due(self) -> bool:
        return self._hashed is None or time.monotonic() >= self._full_hash_at + FULL_REHASH_S

    def _hash_leaves(
        self, session: Session, start: int, start_root: bytes | None, current: Checkpoint
    ) -> None:
        """Prove ``current.root`` is the hash of the entries, not only of the stored nodes.

        The roots above come from ``log_node``; a rewrite of ``log_entry`` alone
        would leave them as they were. So the entries beyond the signed tree
        (``start``) are hashed here and appended to that tree's right edge
        (stored nodes that must fold to ``start_root``); the result must be
        ``current.root``. What was hashed is remembered, so each entry is hashed
        once per process; a process's first proof, and one every
        ``FULL_REHASH_S``, hashes every entry (``start`` 0). So entries below
        the signed size rewritten after this process hashed them (nodes
        untouched) are found within ``FULL_REHASH_S``, at the next start, and by
        auditors (``kcert audit verify`` recomputes every root from the
        entries); a rewrite of entries *and* nodes there changes the root,
        which the consistency proof finds.
        """
        if current.size == start:
            return
        try:
            nodes = audit.NodeStore(session.connection())
            tree: CompactRange | None = None
            if start and self._hashed is not None and start <= self._hashed[0] <= current.size:
                size, root, edge = self._hashed
                if merkle.root(size, nodes) == root:
                    tree = CompactRange(size, edge)
            if tree is None:
                keys = CompactRange.edge_keys(start)
                found = nodes.nodes(keys)
                tree = CompactRange(start, [found[key] for key in keys])
                if start_root is not None and tree.root() != start_root:
                    raise LogError(f"the stored nodes of the signed tree of {start} do not fold "
                                   "to its root")  # fmt: skip
            while tree.size < current.size:
                for record in audit.read_entries(session, tree.size, current.size):
                    if record.index != tree.size:
                        raise LogError(f"entry {tree.size} is missing")
                    tree.append(leaf_hash(record.leaf))
        except LogError as exc:
            raise LogInconsistent(
                f"fork: the database's entries do not hash to its tree of {current.size} "
                f"({exc}). Refusing to sign."
            ) from exc
        if tree.root() != current.root:
            raise LogInconsistent(
                f"fork: the database's entries {start}..{current.size - 1} do not hash to the "
                f"root its stored tree of {current.size} has: log entries were rewritten. "
                "Refusing to sign."
            )
        self._hashed = (tree.size, tree.root(), tree.edge())
        if start == 0:
            self._full_hash_at = time.monotonic()

    def _raise(self, exc: LogInconsistent) -> LogInconsistent:
        if self.alarm is None or str(self.alarm) != str(exc):
            log.error("the audit log is unhealthy: %s", exc)
        self.alarm = exc
        return exc

    def check(self, session: Session) -> Checkpoint:
        """Prove the database's tree extends the last signed checkpoint, signing nothing."""
        with self._locked():
            try:
                last = self.last()
                current = self._current(session, last[0] if last else None)
            except LogInconsistent as exc:
                raise self._raise(exc) from None
        self.alarm = None
        self.verified_size = max(self.verified_size, current.size)
        return current

    def verify(self) -> None:
        """Prove the database's tree now (the gate, before allowing from a larger tree)."""
        if self._engine is None:
            return
        try:
            with read_session(self._engine) as session:
                self.check(session)
        except LogInconsistent:
            pass  # alarm set and logged: the gate denies
        except (KcertError, SQLAlchemyError) as exc:
            log.warning("could not check the audit log for the gate: %s", type(exc).__name__)

    def startup(self, engine: Engine) -> None:
        """Check once when a server starts; an inconsistency is reported, not raised."""
        self._engine = engine
        try:
            with read_session(engine) as session:
                # With witnesses, sign: the checkpoint file is shown to them at once, so an
                # older cosigned file put back with the database is found at start.
                _ = self.sign(session) if self.witnesses else self.check(session)
        except LogInconsistent:
            pass  # alarm set and logged: the server starts, unhealthy, and says so
        except (KcertError, SQLAlchemyError) as exc:
            # A database that cannot be read now is the routes' 503 to report, not a
            # reason to refuse to start; the check runs again at every signing.
            log.warning("could not check the audit log at start: %s", type(exc).__name__)

    # --- signing -----------------------------------------------------------------------------

    def sign(self, session: Session) -> str:
        """The checkpoint of the database's tree, signed (with cosignatures) or refused."""
        with self._locked():
            try:
                known = self.signed_size  # before last() raises it to the file's size
                last = self.last()
                self.signed_size = known
                current = self._current(session, last[0] if last else None)
                if last is not None and last[0].size == current.size:
                    note = last[1]  # reused: still shown to every witness (see _cosign)
                    fresh = False
                else:
                    note = current.sign(self.signer)
                    fresh = True
                note, gained = self._cosign(session, note, current, last[0] if last else None)
            except LogInconsistent as exc:
                raise self._raise(exc) from None
            if fresh or gained:
                self._write(note)
            self.signed_size = max(self.signed_size, current.size)
        self.alarm = None
        self.verified_size = max(self.verified_size, current.size)
        return note

    def _cosign(
        self, session: Session, note: str, current: Checkpoint, last: Checkpoint | None
    ) -> tuple[str, bool]:
        """Ask each witness that has not cosigned ``note`` for this process; the note with theirs.

        A note read back from the file (the tree did not grow) is submitted too,
        at a process's first signing and every ``WITNESS_REFRESH_S`` after, even
        when it already carries the witness's cosignature: a file swapped for an
        older cosigned note, with the database rolled back to its size, is then
        answered by a witness that holds a larger tree, and the rollback is
        found; and the cosignature served stays fresh.
        """
        now = time.monotonic()
        due = [
            endpoint for endpoint in self.witnesses
            if now >= self._confirmed.get((endpoint.url, current.size, current.root), -1e18)
            + WITNESS_REFRESH_S
            and now >= self._retry_at.get(endpoint.url, 0.0)
        ]  # fmt: skip
        if not due:
            return note, False
        if self._client is not None:
            return self._ask(session, note, current, last, due, self._client)
        # A client per signing, not per process: signing is rare, and nothing is left open.
        with httpx.Client(timeout=self._timeout) as client:
            return self._ask(session, note, current, last, due, client)

    def _ask(
        self, session: Session, note: str, current: Checkpoint, last: Checkpoint | None,
        due: Sequence[WitnessEndpoint], client: httpx.Client,
    ) -> tuple[str, bool]:  # fmt: skip
        gained = False
        for endpoint in due:
            try:
                lines = submit(
                    endpoint, note, current, old_size=last.size if last else 0,
                    proof=lambda first, second: audit.consistency_proof(session, first, second),
                    client=client,
                )  # fmt: skip
            except WitnessSawOtherTree as exc:
                self._weigh(session, endpoint, client, current, exc)  # raises on evidence
                exc_text: str = f"{exc}, but it shows no checkpoint of this log that proves it"
            except WitnessSubmitError as exc:
                exc_text = str(exc)
            else:
                self._retry_at.pop(endpoint.url, None)
                self._confirmed[(endpoint.url, current.size, current.root)] = time.monotonic()
                note = with_cosignature(note, endpoint.key, lines)
                gained = True
                continue
            # A witness failure: logged and retried, never a reason to stop the log.
            log.error("no cosignature for the checkpoint of size %d: %s", current.size, exc_text)
            self._retry_at[endpoint.url] = time.monotonic() + WITNESS_RETRY_S
        return note, gained

    def _weigh(
        self, session: Session, endpoint: WitnessEndpoint, client: httpx.Client,
        current: Checkpoint, claim: WitnessSawOtherTree,
    ) -> None:  # fmt: skip
        """Raise :class:`LogInconsistent` when the witness *proves* its claim, else return.

        A ``409``/``422`` is unsigned; proof is the checkpoint the witness holds
        for this log, signed by the log's own key, that the database's tree does
        not extend (larger, another root at the same size, or no consistency).
        """
        note = held_checkpoint(endpoint, self.signer.name, client)
        if note is None:
            return
        try:
            held = open_checkpoint(note, self.signer.verifier)
        except (NoteError, SignatureError):
            return
        where = f"{endpoint.label} holds a checkpoint of {held.size} entries signed by this log"
        if held.size > current.size:
            raise LogInconsistent(
                f"rollback: {where}, but the database holds {current.size}; the database was "
                "restored from an older copy or entries were deleted. Refusing to sign."
            )
        if held.size == current.size:
            if held.root != current.root:
                raise LogInconsistent(
                    f"fork: {where}, with another root than the database's tree of that size. "
                    "Refusing to sign."
                )
            return
        if held.size > 0:
            try:
                proof = audit.consistency_proof(session, held.size, current.size)
                verify_consistency(held.size, current.size, held.root, current.root, proof)
            except (ProofError, LogError) as exc:
                raise LogInconsistent(
                    f"fork: {where}, which the database's tree of {current.size} does not "
                    f"extend: {exc}. Refusing to sign."
                ) from exc

    # --- files -------------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(CHECKPOINT_FILE + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield

    def _write(self, note: str) -> None:
        tmp = self.path.with_name(CHECKPOINT_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(note)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)  # a crash leaves the old checkpoint, never half a new one

    # --- what the gate asks, per request (no I/O) ----------------------------------------------

    def floor(self) -> int:
        """A size this log has signed; read it *before* reading the database's size.

        One ``stat`` per call: when the checkpoint file changed (another worker
        of this home signed), it is read again, so every worker's floor follows
        the newest checkpoint, not the one it read at start.
        """
        try:
            st = os.stat(self.path)
        except OSError:
            return self.signed_size
        stamp = (st.st_mtime_ns, st.st_ino, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self.last()
            except LogInconsistent as exc:
                self._raise(exc)
        return self.signed_size

    def needs_verifying(self, version: int) -> bool:
        """Whether the database's tree at ``version`` is larger than any proved (no I/O)."""
        return self._engine is not None and version > self.verified_size

    def refusal(self, version: int, floor: int) -> str | None:
        """Why no gate may allow at log size ``version`` (read after ``floor``), or ``None``."""
        if version < floor:
            self._raise(
                LogInconsistent(
                    f"rollback: the database holds {version} log entries, but this log signed "
                    f"a checkpoint of {floor}; the database was restored from an older copy "
                    "or entries were deleted"
                )
            )
        if self.alarm is not None:
            return f"the registry's audit log is unhealthy (log-inconsistent): {self.alarm}"
        if self.needs_verifying(version):  # verify() ran and could not prove it
            return (
                f"the registry's audit log could not be checked at {version} entries "
                "(log-unverified): the gate allows only from a tree proved to extend the last "
                "signed checkpoint"
            )
        return None

    def close(self) -> None:
        """Nothing is held open between signings; kept for the app's shutdown hook."""


class CheckpointPublisher:
    """Signs each new tree within ``interval`` seconds, so every change is checkpointed.

    A server runs one per process: every ``interval`` it signs through the guard,
    which reads the tree's root, proves it consistent with the checkpoint file,
    and only when the tree grew writes a new checkpoint and submits it to the
    witnesses (a few indexed reads and a file read when nothing changed).
    So a revocation is in a signed checkpoint (and a witness's record) within
    seconds, whether or not anyone asks for one, and a rollback or fork is found
    and fails the gate closed in every process, not only the one asked to sign.
    """

    def __init__(self, guard: CheckpointGuard, engine: Engine, interval: float) -> None:
        self.guard = guard
        self._engine = engine
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._interval <= 0 or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kcert-checkpoints", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.publish()

    def publish(self) -> None:
        """One round: check the tree (its root, not only its size) and sign it; never raises."""
        try:
            with read_session(self._engine) as session:
                # Every round, even at an unchanged size: a fork can keep the size.
                self.guard.sign(session)
        except LogInconsistent:
            pass  # the guard raised the alarm and logged it
        except (KcertError, SQLAlchemyError) as exc:
            log.warning("could not publish a checkpoint: %s", type(exc).__name__)

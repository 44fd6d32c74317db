"""A C2SP tlog-witness: keep each log's latest checkpoint, check consistency, cosign.

Protocol (https://c2sp.org/tlog-witness), ``POST <prefix>/add-checkpoint``:
the body is an ``old <size>`` line, zero to 63 base64 consistency-proof lines,
an empty line, then the log's signed checkpoint. The witness answers

- ``200`` with its ``cosignature/v1`` line(s), after persisting the checkpoint;
- ``400`` for a malformed body or an old size above the checkpoint's size;
- ``403`` when no signature by a trusted key of the origin verifies (or one
  by a trusted key fails);
- ``404`` for an origin it is not configured for;
- ``409`` when the old size is not the size it last cosigned, with that size
  and a newline as the body, ``Content-Type: text/x.tlog.size``;
- ``422`` when the proof does not verify, a same-size root differs, an empty
  tree has a non-empty root, or a proof accompanies old size 0.

State: the latest cosigned checkpoint per origin, in one JSON file written
atomically (temporary file, fsync, rename). Check-and-update of an origin runs
under a process lock and an exclusive ``flock`` on ``<state>.lock``, so two
requests (threads or processes) cannot roll the record back (the race the spec
describes). A file, not a database: the state is one small record per log,
read and replaced whole, and needs no schema.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kcert.log.cosignature import Cosigner, add_signature_lines
from kcert.log.errors import (
    BadSubmission,
    InconsistentCheckpoint,
    LogError,
    NoteError,
    ProofError,
    StaleOldSize,
    UnauthenticatedCheckpoint,
    UnknownLog,
)
from kcert.log.merkle import EMPTY_ROOT, HASH_SIZE
from kcert.log.note import Checkpoint, Verifier, split_note
from kcert.log.proofs import verify_consistency

SIZE_MEDIA_TYPE = "text/x.tlog.size"
MAX_PROOF_LINES = 63
#: A request larger than this is not a checkpoint submission.
MAX_BODY_BYTES = 64 * 1024
_OLD = re.compile(r"^old (0|[1-9][0-9]{0,19})$")


@dataclass(frozen=True, slots=True)
class AddCheckpoint:
    """A parsed ``add-checkpoint`` request."""

    old_size: int
    proof: tuple[bytes, ...]
    note: str

    def encode(self) -> bytes:
        lines = [f"old {self.old_size}", *(base64.b64encode(h).decode() for h in self.proof)]
        return ("".join(f"{line}\n" for line in lines) + "\n" + self.note).encode()

    @classmethod
    def parse(cls, body: bytes) -> AddCheckpoint:
        if len(body) > MAX_BODY_BYTES:
            raise BadSubmission(f"an add-checkpoint body is at most {MAX_BODY_BYTES} bytes")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadSubmission("the body is not UTF-8") from exc
        head, sep, note = text.partition("\n\n")
        if not sep:
            raise BadSubmission("expected an old size line, proof lines, an empty line and a note")
        lines = head.split("\n")
        match = _OLD.match(lines[0])
        if match is None:
            raise BadSubmission(f"the first line must be 'old <size>', got {lines[0][:40]!r}")
        if len(lines) - 1 > MAX_PROOF_LINES:
            raise BadSubmission(f"at most {MAX_PROOF_LINES} consistency proof lines")
        proof = []
        for line in lines[1:]:
            try:
                digest = base64.b64decode(line.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise BadSubmission(f"proof line {line[:60]!r} is not base64") from exc
            if len(digest) != HASH_SIZE:
                raise BadSubmission(f"proof line {line[:60]!r} is not a {HASH_SIZE}-byte hash")
            proof.append(digest)
        return cls(int(match.group(1)), tuple(proof), note)


def origin_hash(origin: str) -> str:
    """The monitoring path segment: lowercase hex SHA-256 of the origin."""
    return hashlib.sha256(origin.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LogRecord:
    """What the witness keeps per log: the latest cosigned checkpoint and its note."""

    size: int
    root: bytes
    note: str


class WitnessState:
    """The witness's records, one JSON file; see the module docstring for the locking."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    @contextmanager
    def locked(self) -> Iterator[dict[str, LogRecord]]:
        """The records, exclusively; what the caller leaves in the dict is written back."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                records = self.read()
                before = dict(records)
                yield records
                if records != before:
                    self._write(records)

    def read(self) -> dict[str, LogRecord]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise LogError(f"the witness state {self.path} cannot be read: {exc}") from exc
        try:
            return {
                origin: LogRecord(int(r["size"]), base64.b64decode(r["root"]), str(r["note"]))
                for origin, r in raw["logs"].items()
            }
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise LogError(f"the witness state {self.path} is damaged") from exc

    def _write(self, records: Mapping[str, LogRecord]) -> None:
        value = {
            "logs": {
                origin: {"size": r.size, "root": base64.b64encode(r.root).decode(), "note": r.note}
                for origin, r in sorted(records.items())
            }
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(value, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)  # a crash leaves the old state, never half a new one


class Witness:
    """Checks submissions against the logs it trusts and its state, and cosigns."""

    def __init__(
        self, cosigner: Cosigner, logs: Sequence[Verifier], state: WitnessState,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.cosigner = cosigner
        self.logs: dict[str, list[Verifier]] = {}
        for verifier in logs:
            self.logs.setdefault(verifier.name, []).append(verifier)
        self.state = state
        self._clock = clock

    def add_checkpoint(self, body: bytes) -> str:
        """One ``add-checkpoint`` body: the cosignature line, or a :class:`WitnessError`."""
        request = AddCheckpoint.parse(body)
        checkpoint = self._authenticate(request.note)
        if request.old_size > checkpoint.size:
            raise BadSubmission(
                f"old size {request.old_size} is above the checkpoint's size {checkpoint.size}"
            )
        if checkpoint.size == 0 and checkpoint.root != EMPTY_ROOT:
            raise InconsistentCheckpoint("a checkpoint of size 0 must have the empty tree's root")
        with self.state.locked() as records:
            held = records.get(checkpoint.origin)
            held_size = held.size if held else 0
            if request.old_size != held_size:
                raise StaleOldSize(
                    f"old size {request.old_size} is not the latest size cosigned for "
                    f"{checkpoint.origin!r} ({held_size})",
                    held_size,
                )
            self._check_consistent(request, held, checkpoint)
            timestamp = max(1, int(self._clock()))
            line = self.cosigner.cosign(checkpoint.body(), timestamp)
            records[checkpoint.origin] = LogRecord(
                checkpoint.size, checkpoint.root, add_signature_lines(request.note, line)
            )
        return line

    def _authenticate(self, note: str) -> Checkpoint:
        try:
            body, signatures = split_note(note)
            checkpoint = Checkpoint.parse(body)
        except NoteError as exc:
            raise BadSubmission(f"not a checkpoint: {exc}") from exc
        verifiers = self.logs.get(checkpoint.origin)
        if not verifiers:
            raise UnknownLog(f"this witness does not follow the log {checkpoint.origin!r}")
        message = body.encode()
        verified = False
        for verifier in verifiers:
            public = Ed25519PublicKey.from_public_bytes(verifier.public_key)
            for name, blob in signatures:
                if name != verifier.name or blob[:4] != verifier.key_hash:
                    continue  # unknown keys are ignored
                try:
                    public.verify(blob[4:], message)
                except InvalidSignature as exc:
                    raise UnauthenticatedCheckpoint(
                        f"the signature by the trusted key {name!r} does not verify"
                    ) from exc
                verified = True
        if not verified:
            raise UnauthenticatedCheckpoint(
                f"the checkpoint carries no signature by a key trusted for {checkpoint.origin!r}"
            )
        return checkpoint

    @staticmethod
    def _check_consistent(
        request: AddCheckpoint, held: LogRecord | None, checkpoint: Checkpoint
    ) -> None:
        if held is None or held.size == 0:
            if request.proof:
                raise InconsistentCheckpoint("old size 0 takes no consistency proof")
            return
        if held.size == checkpoint.size:
            if held.root != checkpoint.root or request.proof:
                raise InconsistentCheckpoint(
                    f"a different root for size {checkpoint.size}, which this witness cosigned "
                    "with another root: the log forked"
                )
            return
        try:
            verify_consistency(held.size, checkpoint.size, held.root, checkpoint.root,
                               request.proof)  # fmt: skip
        except ProofError as exc:
            raise InconsistentCheckpoint(
                f"the checkpoint of size {checkpoint.size} is not proved to extend the one of "
                f"size {held.size} this witness cosigned: {exc}"
            ) from exc

    def latest(self, origin_digest: str) -> str | None:
        """The latest cosigned checkpoint of the log whose origin hashes to ``origin_digest``."""
        for origin, record in self.state.read().items():
            if origin_hash(origin) == origin_digest:
                return record.note
        return None

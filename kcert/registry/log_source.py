"""The audit log of a registry database, read as a :class:`kcert.log.source.LogSource`.

``kcert audit`` reads the embedded registry through this, and a remote one
over HTTP (:mod:`kcert.log.source`). It sits above the modules that write the
log (:mod:`kcert.registry.audit`, the certificate and observation stores) so
that none of them has to import the others back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from kcert.errors import KcertError
from kcert.log.errors import LogError
from kcert.registry.audit import consistency_proof, inclusion_proof, log_signer, read_entries
from kcert.registry.certificates import get_envelope
from kcert.registry.checkpoints import CheckpointGuard
from kcert.registry.db import read_session
from kcert.registry.observations import get_evidence


class DatabaseLogSource:
    """A :class:`kcert.log.source.LogSource` over a registry database (the embedded registry).

    It goes through the same functions as the public routes, so auditing the
    embedded registry checks exactly what a remote auditor would be served.
    """

    def __init__(
        self, engine: Engine, home: Path, *, label: str | None = None,
        guard: CheckpointGuard | None = None,
    ) -> None:  # fmt: skip
        self._engine = engine
        self._home = home
        self.label = label or f"embedded registry {engine.url.render_as_string(hide_password=True)}"
        #: Made without witnesses on first use when none is given.
        self._guard = guard

    def _session(self) -> Session:
        return read_session(self._engine)

    def checkpoint(self) -> str:
        """The current checkpoint, signed only if it extends the last one signed (the guard)."""
        if self._guard is None:
            self._guard = CheckpointGuard(self._home, log_signer(self._home))
        with self._session() as session:
            note: str = self._guard.sign(session)
            return note

    def last_signed(self) -> str | None:
        """The last checkpoint this registry signed (its file, verified), or ``None``."""
        try:
            last = CheckpointGuard(self._home, log_signer(self._home)).last()
        except LogError:
            return None
        return last[1] if last else None

    def verifier_key(self) -> str:
        return log_signer(self._home).verifier.vkey()

    def entries(self, start: int, end: int) -> list[tuple[int, bytes]]:
        with self._session() as session:
            return [(r.index, r.leaf) for r in read_entries(session, start, end)]

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        with self._session() as session:
            return inclusion_proof(session, index, size)

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        with self._session() as session:
            return consistency_proof(session, first, second)

    def mismatch_evidence(self, mismatch_id: int) -> dict[str, Any] | None:
        """A runtime mismatch's evidence, as ``GET .../mismatches/{id}/evidence`` serves it."""
        with read_session(self._engine) as session:
            try:
                return get_evidence(session=session, mismatch_id=int(mismatch_id))
            except KcertError:
                return None

    def certificate_envelope(self, certificate: str) -> dict[str, Any] | None:
        """The stored envelope of ``certificate``, or ``None`` when there is none."""
        with read_session(self._engine) as session:
            try:
                return get_envelope(session=session, certificate=certificate)
            except KcertError:  # not found, or not a certificate id at all
                return None

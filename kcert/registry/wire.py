"""The registry's answers that a client needs before it needs a database.

``Scope`` and ``GateDecision`` live here, in plain pydantic, because a deploy
script's ``kcert gate`` against a server reads nothing else: importing
:mod:`kcert.registry.models` would load SQLModel and SQLAlchemy (most of a
second) for one boolean. ``models`` re-exports both, so every other caller
keeps importing them from there.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel


class Scope(StrEnum):
    CERTIFICATES_WRITE = "certificates:write"
    PROMOTE = "promote"
    GATE_READ = "gate:read"
    TARGETS_WRITE = "targets:write"
    ADMIN = "admin"
    #: Runtime reports and latency samples (``kcert.guard``, ``kcert perf ingest``).
    OBSERVATIONS_WRITE = "observations:write"


class GateDecision(BaseModel):
    allow: bool
    reasons: list[str]
    certificate: str | None

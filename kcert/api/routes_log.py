"""Public routes of the audit log: checkpoint, key, entries and proofs (no auth).

- ``GET /v1/log/checkpoint`` answers ``text/plain``: the C2SP signed note
  itself, byte for byte what was signed, so any tlog tool can check it.
- ``GET /v1/log/key`` answers ``text/plain``: the C2SP verifier key.
- ``GET /v1/log/entries?start=&end=`` answers JSON; each leaf's exact bytes
  are base64 in ``leaf``. At most 1000 entries come back; page on from the
  last index received.
- ``GET /v1/log/proofs/inclusion?index=&size=`` and
  ``GET /v1/log/proofs/consistency?first=&second=`` answer JSON with the
  proof's base64 hashes in ``hashes``, in RFC 9162 order.

Range checks are left to the library, so every bad range (negative, empty,
past the end) raises :class:`kcert.log.errors.LogRangeError`, which the app's
one exception handler turns into ``application/problem+json`` 400; only a
parameter that is not an integer at all is FastAPI's 422.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from kcert.api.deps import ReadSessionDep, SettingsDep
from kcert.log.note import Signer
from kcert.registry import audit
from kcert.registry.checkpoints import CheckpointGuard

router = APIRouter(prefix="/v1/log", tags=["log"])

_NOTE = "text/plain; charset=utf-8"


@functools.lru_cache(maxsize=4)
def _signer(home: Path) -> Signer:
    # Read (or make) the key once per process, not once per request.
    return audit.log_signer(home)


class LogEntryPublic(BaseModel):
    index: int
    #: The leaf's exact bytes (RFC 8785 JSON), base64.
    leaf: str


class LogEntriesPublic(BaseModel):
    tree_size: int
    entries: list[LogEntryPublic]


class InclusionProofPublic(BaseModel):
    index: int
    tree_size: int
    #: RFC 9162 audit path, leaf side first, base64.
    hashes: list[str]


class ConsistencyProofPublic(BaseModel):
    first: int
    second: int
    hashes: list[str]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@router.get(
    "/checkpoint",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {_NOTE: {}}, "description": "C2SP signed checkpoint note"},
        503: {
            "content": {"application/problem+json": {}},
            "description": "log-inconsistent: the tree does not extend the last checkpoint signed",
        },
    },
)
def get_checkpoint(request: Request, session: ReadSessionDep) -> PlainTextResponse:
    """The current checkpoint, a C2SP signed note with any witness cosignatures.

    Signed only when the tree extends the last checkpoint signed; otherwise 503
    ``log-inconsistent`` (see :mod:`kcert.registry.checkpoints`).
    """
    guard: CheckpointGuard = request.app.state.log_guard
    note = guard.sign(session)
    return PlainTextResponse(note, media_type=_NOTE)


@router.get(
    "/key",
    response_class=PlainTextResponse,
    responses={200: {"content": {_NOTE: {}}, "description": "C2SP verifier key"}},
)
def get_key(settings: SettingsDep) -> PlainTextResponse:
    """The log's public key as a C2SP verifier key (``name+keyhash+base64``)."""
    return PlainTextResponse(_signer(settings.home).verifier.vkey() + "\n", media_type=_NOTE)


@router.get("/entries")
def get_entries(
    session: ReadSessionDep,
    start: int = Query(description="first index"),
    end: int = Query(description="one past the last index; cut to 1000 entries"),
) -> LogEntriesPublic:
    records = audit.read_entries(session, start, end)
    return LogEntriesPublic(
        tree_size=audit.log_size(session),
        entries=[LogEntryPublic(index=r.index, leaf=_b64(r.leaf)) for r in records],
    )


@router.get("/proofs/inclusion")
def get_inclusion_proof(
    session: ReadSessionDep, index: int = Query(), size: int = Query()
) -> InclusionProofPublic:
    hashes = audit.inclusion_proof(session, index, size)
    return InclusionProofPublic(index=index, tree_size=size, hashes=[_b64(h) for h in hashes])


@router.get("/proofs/consistency")
def get_consistency_proof(
    session: ReadSessionDep, first: int = Query(), second: int = Query()
) -> ConsistencyProofPublic:
    hashes = audit.consistency_proof(session, first, second)
    return ConsistencyProofPublic(first=first, second=second, hashes=[_b64(h) for h in hashes])

"""The witness's HTTP door: C2SP tlog-witness ``POST /add-checkpoint`` and the monitoring read.

Bodies are the spec's text, not JSON: a ``200`` is the cosignature line(s),
a ``409`` the witness's size and a newline as ``text/x.tlog.size``, any other
refusal a one-line reason as ``text/plain`` with the spec's status. The work is
:meth:`kcert.log.witness.Witness.add_checkpoint`; this module only maps it.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from kcert import __version__
from kcert.api.problems import BodyLimitMiddleware, LastResortMiddleware
from kcert.log.errors import LogError, StaleOldSize, WitnessError
from kcert.log.witness import MAX_BODY_BYTES, SIZE_MEDIA_TYPE, Witness

_TEXT = "text/plain; charset=utf-8"
log = logging.getLogger("kcert.witness")


def create_witness_app(witness: Witness) -> FastAPI:
    app = FastAPI(
        title="kcert witness",
        version=__version__,
        description="A C2SP tlog-witness: cosigns checkpoints that extend what it saw before.",
    )
    app.state.witness = witness

    @app.post(
        "/add-checkpoint",
        response_class=PlainTextResponse,
        responses={
            200: {"content": {_TEXT: {}}, "description": "cosignature/v1 line(s)"},
            409: {"content": {SIZE_MEDIA_TYPE: {}}, "description": "the size the witness holds"},
        },
    )
    async def add_checkpoint(request: Request) -> PlainTextResponse:
        body = await request.body()
        try:
            # Off the event loop: it waits for the state file's lock and fsyncs.
            line = await run_in_threadpool(witness.add_checkpoint, body)
        except StaleOldSize as exc:
            # The spec's exact media type: Starlette would append a charset to a text/ one.
            return PlainTextResponse(
                f"{exc.size}\n", status_code=409, headers={"content-type": SIZE_MEDIA_TYPE}
            )
        except WitnessError as exc:
            if exc.status == 422:
                log.warning("refused an inconsistent checkpoint: %s", exc)
            return PlainTextResponse(f"{exc}\n", status_code=exc.status, media_type=_TEXT)
        except LogError as exc:
            log.error("cannot record the checkpoint: %s", exc)
            return PlainTextResponse(
                "the witness cannot record checkpoints now\n", status_code=503, media_type=_TEXT
            )
        return PlainTextResponse(line, media_type=_TEXT)

    @app.get("/{origin_hash}/checkpoint", response_class=PlainTextResponse)
    def latest(origin_hash: str) -> PlainTextResponse:
        note = witness.latest(origin_hash.lower())
        if note is None:
            return PlainTextResponse("no checkpoint cosigned for that log\n", status_code=404,
                                     media_type=_TEXT)  # fmt: skip
        return PlainTextResponse(note, media_type=_TEXT)

    app.add_middleware(BodyLimitMiddleware, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(LastResortMiddleware)
    return app

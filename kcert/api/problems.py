"""RFC 9457 problem details: the API's only error format.

Every :class:`~kcert.errors.KcertError` maps to one problem ``type`` (a stable
URI built from its ``kind``) and one status, in :func:`kcert_error_handler`.
Validation errors, unknown routes, oversized bodies and (as a last resort)
anything unexpected are problems too; a problem never carries a traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kcert.api.serve import MAX_REQUEST_HEAD_BYTES
from kcert.digest import DigestError
from kcert.errors import KcertError
from kcert.registry import errors as reg
from kcert.registry.errors import LogInconsistent

PROBLEM_BASE = "https://kcert.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"

log = logging.getLogger("kcert.api")

#: Status of each error class; the most specific class listed wins.
STATUS: Mapping[type[KcertError], int] = {
    reg.NotFound: 404,
    reg.InvalidInput: 422,
    reg.TooLarge: 413,
    reg.CertificateRejected: 422,
    reg.KeyConflict: 409,
    reg.Unauthenticated: 401,
    reg.Forbidden: 403,
    reg.PromotionDenied: 409,
    reg.PolicyError: 422,
    reg.RegistryUnavailable: 503,
    LogInconsistent: 503,
    DigestError: 422,
}

TITLES: Mapping[int, str] = {
    400: "Bad request",
    401: "Unauthenticated",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    415: "Unsupported media type",
    431: "Request header fields too large",
    422: "Unprocessable request",
    500: "Internal error",
    503: "Service unavailable",
}


def problem(
    status: int, kind: str, detail: str, *, instance: str | None = None,
    extensions: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
) -> JSONResponse:  # fmt: skip
    body: dict[str, Any] = {
        "type": PROBLEM_BASE + kind,
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    for key, value in (extensions or {}).items():
        body.setdefault(key, value)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def status_of(exc: KcertError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


async def kcert_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KcertError)
    status = status_of(exc)
    extensions = exc.extensions() if isinstance(exc, reg.RegistryError) else {}
    headers = {"WWW-Authenticate": 'Bearer realm="kcert"'} if status == 401 else None
    detail = str(exc) if isinstance(exc, reg.PromotionDenied) else exc.diagnostics()
    return problem(
        status, exc.kind, detail, instance=request.url.path, extensions=extensions,
        headers=headers,
    )  # fmt: skip


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
         "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]  # fmt: skip
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    detail = f"{'.'.join(first['loc']) or 'request'}: {first['msg']}"
    return problem(
        422, "validation-error", detail, instance=request.url.path, extensions={"errors": errors}
    )


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
    return problem(
        exc.status_code, kind, str(exc.detail), instance=request.url.path,
        headers=dict(exc.headers) if exc.headers else None,
    )  # fmt: skip


async def database_error_handler(request: Request, exc: Exception) -> JSONResponse:
    # The driver's message may quote SQL and values: keep it in the server log only.
    log.error("database error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return problem(
        503, "registry-unavailable", "the registry database could not complete the request; "
        "try again", instance=request.url.path,
    )  # fmt: skip


EXCEPTION_HANDLERS = {
    KcertError: kcert_error_handler,
    RequestValidationError: validation_error_handler,
    StarletteHTTPException: http_error_handler,
    DBAPIError: database_error_handler,
    # Every pooled connection stayed busy for the pool's timeout: overload, not a bug.
    PoolTimeout: database_error_handler,
}


async def _send_problem(
    send: Send, status: int, kind: str, detail: str, extensions: Mapping[str, Any] | None = None
) -> None:
    body = json.dumps(
        {"type": PROBLEM_BASE + kind, "title": TITLES.get(status, "Error"), "status": status,
         "detail": detail, **(extensions or {})}
    ).encode()  # fmt: skip
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_validation_problem(
    send: Send, loc: Sequence[str | int], msg: str, kind: str
) -> None:
    """The 422 a middleware answers, shaped as :func:`validation_error_handler` shapes
    FastAPI's: ``errors`` with ``loc``, ``msg`` and ``type``."""
    where = [str(part) for part in loc]
    error = {"loc": where, "msg": msg, "type": kind}
    await _send_problem(
        send, 422, "validation-error", f"{'.'.join(where)}: {msg}", {"errors": [error]}
    )


class HeadLimitMiddleware:
    """Refuse a request whose line and headers take over ``max_bytes`` with a 431 problem.

    The parser bounds what it buffers (``kcert serve`` sets h11's cap on an
    incomplete head), but a head that arrives whole in one read is parsed at
    any size up to that read; this holds every request to the same cap.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_REQUEST_HEAD_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or scope["path"].encode()) + len(
                scope.get("query_string", b"")
            )
            size += sum(len(name) + len(value) for name, value in scope.get("headers", ()))
            if size > self.max_bytes:
                await _send_problem(
                    send, 431, "request-head-too-large",
                    f"the request line and headers take more than {self.max_bytes} bytes; "
                    "send less",
                )  # fmt: skip
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, before anything parses them.

    A declared ``Content-Length`` over the cap is refused at once; a chunked body
    is counted as it arrives and refused when it crosses the cap.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, per_path: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        #: Exact paths with a cap of their own (``POST /v1/observations`` carries evidence).
        self.per_path = dict(per_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.per_path.get(scope.get("path", ""), self.max_bytes)
        too_big = f"request bodies are limited to {max_bytes} bytes"
        framed = False
        for name, value in scope.get("headers", ()):
            if name == b"transfer-encoding":
                framed = True
            elif name == b"content-length":
                framed = True
                try:
                    declared = int(value)
                except ValueError:
                    await _send_problem(send, 400, "bad-request", "invalid Content-Length")
                    return
                if declared > max_bytes:
                    await _send_problem(send, 413, "body-too-large", too_big)
                    return
        if not framed:
            # Neither Content-Length nor Transfer-Encoding: the request has no body
            # (RFC 9112, 6.3), so there is nothing to count (every GET of the gate).
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away; nothing to answer.
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                await _send_problem(send, 413, "body-too-large", too_big)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class LastResortMiddleware:
    """Turn anything unexpected into a 500 problem without a traceback.

    Tests assert that no hostile request reaches this; it exists so that a bug
    shows a client a problem document, never a stack.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            # The path, never the headers: they carry the bearer token.
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await _send_problem(
                    send, 500, "internal-error",
                    "the registry hit an unexpected error; it has been logged",
                )  # fmt: skip

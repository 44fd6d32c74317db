"""Request bodies and URLs checked before any route reads them.

FastAPI decodes a JSON body with :func:`json.loads` on its bytes, which also
takes UTF-16 and UTF-32 (detected from the first bytes), skips a UTF-8
byte-order mark, accepts ``NaN`` and ``Infinity``, and recurses as deep as the
body nests. :class:`JsonBodyMiddleware` refuses all of that with a 422
problem before routing:

- a JSON body (no ``Content-Type``, ``application/json`` or ``*/*+json``)
  must be UTF-8 without a byte-order mark, declare no other charset, and be
  RFC 8259 JSON (no ``NaN``/``Infinity``) nested at most
  :data:`MAX_JSON_DEPTH` deep;
- no string in it, and nothing in the URL's path or query, may hold a NUL:
  PostgreSQL cannot store one, and no field of the API has a use for it.

The models then bound every field (types, sizes, no unknown fields); this
layer is what they cannot see, because it is gone once the body is parsed.
"""

from __future__ import annotations

import json
from email.message import Message as MimeMessage
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kcert.api.problems import send_validation_problem

#: Arrays and objects inside one another in a request body; the API's own bodies need 3.
MAX_JSON_DEPTH = 32


class BodyError(ValueError):
    """What is wrong with a request body, as a client should read it, and where."""

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.loc = loc


def check_json(body: bytes, content_type: str | None) -> None:
    """Raise :class:`BodyError` unless ``body`` is UTF-8 JSON that the API may parse."""
    if content_type:
        mime = MimeMessage()
        mime["content-type"] = content_type
        charset = mime.get_content_charset()
        if charset not in (None, "utf-8", "utf8"):
            raise BodyError(f"request bodies are UTF-8 JSON; this one declares charset={charset}")
    if body.startswith(b"\xef\xbb\xbf"):
        raise BodyError("request bodies are UTF-8 JSON without a byte-order mark")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            f"request bodies are UTF-8 JSON; byte {exc.start} is not UTF-8 (UTF-16 or Latin-1?)"
        ) from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BodyError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BodyError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
    _check_value(value)


def _no_constant(name: str) -> Any:
    raise BodyError(f"{name} is not JSON (RFC 8259 has no non-finite numbers)")


def _check_value(value: Any) -> None:
    """Depth and NUL, without recursion (so a deep value cannot exhaust the stack)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, loc = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                raise BodyError("a string holds a NUL character", loc)
        elif isinstance(node, dict | list):
            if len(loc) >= MAX_JSON_DEPTH:
                raise BodyError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep", loc)
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, item in items:
                if isinstance(key, str) and "\x00" in key:
                    raise BodyError("a key holds a NUL character", loc)
                stack.append((item, (*loc, key)))


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI would parse a body of ``content_type`` as JSON (none counts)."""
    if not content_type:
        return True
    mime = MimeMessage()
    mime["content-type"] = content_type
    subtype = mime.get_content_subtype()
    return mime.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class JsonBodyMiddleware:
    """Refuse, with a 422 problem, URLs holding a NUL and JSON bodies :func:`check_json` refuses.

    Sits inside :class:`kcert.api.problems.BodyLimitMiddleware`, so a body it
    reads is already known to be within the size cap.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope.get("path", ""):
            await send_validation_problem(
                send, ["path"], "the path holds a NUL character", "value_error"
            )
            return
        query: bytes = scope.get("query_string", b"")
        if b"\x00" in query or b"%00" in query:
            await send_validation_problem(
                send, ["query"], "the query holds a NUL character", "value_error"
            )
            return
        headers = dict(scope.get("headers", ()))
        if b"content-length" not in headers and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body (RFC 9112, 6.3): every GET
            return
        content_type = headers.get(b"content-type", b"").decode("latin-1") or None
        if not is_json(content_type):
            await self.app(scope, receive, send)  # not parsed as JSON: the route refuses it
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body:
            try:
                check_json(body, content_type)
            except BodyError as exc:
                kind = "value_error" if exc.loc else "json_invalid"
                await send_validation_problem(send, ["body", *exc.loc], str(exc), kind)
                return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

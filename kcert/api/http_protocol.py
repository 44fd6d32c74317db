"""uvicorn's httptools protocol with a cap on the request head (request line and headers).

uvicorn's other parser, h11, refuses a request head over 16 KiB; httptools has
no cap at all, so without this a client could make a worker buffer a header
of any size. Two counts, each refused past :data:`MAX_REQUEST_HEAD_BYTES` with
a 431 problem before the app sees the request:

- the URL and header bytes as the parser hands them over (exact, but
  httptools hands a header over only once it is complete);
- the bytes of every chunk received wholly inside a request head, so a client
  that trickles an endless header is cut off too.
"""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kcert.api.problems import PROBLEM_BASE, PROBLEM_MEDIA_TYPE

#: Bytes a request's line and headers may take together.
MAX_REQUEST_HEAD_BYTES = 32 * 1024


class RequestHeadTooLarge(Exception):
    """Raised in a parser callback to stop parsing; answered with a 431."""


class CappedHttpToolsProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` refusing request heads over :data:`MAX_REQUEST_HEAD_BYTES`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # until the first request's headers are complete
        self._parsed = 0
        self._received = 0
        self._began = False
        self._too_large = False

    def data_received(self, data: bytes) -> None:
        head_before = self._in_head
        self._began = False
        super().data_received(data)
        if self._too_large or not (head_before and self._in_head and not self._began):
            return  # refused already, or the chunk was not wholly inside one request head
        self._received += len(data)
        if self._received > MAX_REQUEST_HEAD_BYTES and not self.transport.is_closing():
            self._too_large = True
            self.send_400_response("")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._began = True, True
        self._parsed = self._received = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def _count(self, size: int) -> None:
        self._parsed += size
        if self._parsed > MAX_REQUEST_HEAD_BYTES:
            self._too_large = True
            raise RequestHeadTooLarge  # httptools stops; uvicorn calls send_400_response

    def send_400_response(self, msg: str) -> None:
        if not self._too_large:
            super().send_400_response(msg)
            return
        body = json.dumps({
            "type": PROBLEM_BASE + "request-head-too-large",
            "title": "Request header fields too large",
            "status": 431,
            "detail": f"the request line and headers take more than {MAX_REQUEST_HEAD_BYTES} "
                      "bytes; send less",
        }).encode()  # fmt: skip
        head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: " + PROBLEM_MEDIA_TYPE.encode() + b"\r\n")
        head.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)
        self.transport.close()

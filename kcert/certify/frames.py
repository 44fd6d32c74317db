"""Reading what a sandboxed child sends: bounded sizes, a deadline, no trust in its lengths.

The child writes with :meth:`multiprocessing.connection.Connection.send_bytes`
(a 4-byte big-endian length, or -1 and an 8-byte length, then the body). The
child runs kernel code, so everything it sends is hostile: a length far over
what the parent expects, a body that never comes, a JSON header nested a
hundred thousand deep. :class:`Frames` reads from the pipe's file descriptor
with ``poll`` under one deadline, refuses a length over the caller's limit
before reading a byte of the body, and turns every way of breaking the
protocol into :class:`ProtocolError` or :class:`FrameTimeout`; the caller then
kills the sandbox.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

#: The most a JSON header may take; real headers are a few hundred bytes.
MAX_HEADER_BYTES = 1 << 20
_CHUNK = 1 << 20


class ProtocolError(Exception):
    """The child broke the protocol (or died): its answer cannot be used."""


class FrameTimeout(ProtocolError):
    """The child did not send what it owed before the deadline."""


class Frames:
    """Frames from one pipe (``fd``, the parent's read end), each under a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def ready(self, deadline: float) -> bool:
        """Whether something (data, or end-of-file) can be read before ``deadline``."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            remaining = deadline - time.monotonic()
            try:
                return bool(poller.poll(max(0, int(remaining * 1000) + 1)))
            except InterruptedError:
                continue

    def _exact(self, n: int, deadline: float, into: memoryview | None = None) -> bytes:
        """Exactly ``n`` bytes (into ``into`` when given, then b"")."""
        parts: list[bytes] = []
        got = 0
        while got < n:
            if time.monotonic() >= deadline or not self.ready(deadline):
                raise FrameTimeout(f"the child sent {got} of {n} bytes before its deadline")
            try:
                chunk = os.read(self.fd, min(n - got, _CHUNK))
            except OSError as exc:
                raise ProtocolError(f"reading from the child failed: {exc}") from exc
            if not chunk:
                raise ProtocolError("the child closed its pipe in the middle of a frame")
            if into is not None:
                into[got : got + len(chunk)] = chunk
            else:
                parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def _length(self, deadline: float) -> int:
        (size,) = struct.unpack("!i", self._exact(4, deadline))
        if size == -1:
            (size,) = struct.unpack("!Q", self._exact(8, deadline))
        if size < 0:
            raise ProtocolError(f"the child sent a frame of negative length {size}")
        return int(size)

    def read(self, max_bytes: int, deadline: float) -> bytes:
        """One frame of at most ``max_bytes``."""
        size = self._length(deadline)
        if size > max_bytes:
            raise ProtocolError(f"the child sent a frame of {size} bytes (at most {max_bytes})")
        return self._exact(size, deadline)

    def read_into(self, view: memoryview, deadline: float) -> None:
        """One frame of exactly ``len(view)`` bytes, straight into ``view``."""
        size = self._length(deadline)
        if size != view.nbytes:
            raise ProtocolError(f"the child sent {size} bytes where {view.nbytes} were due")
        self._exact(size, deadline, view.cast("B"))

    def header(self, deadline: float) -> dict[str, Any]:
        """One JSON object (a header), bounded in size; anything else is a protocol error."""
        raw = self.read(MAX_HEADER_BYTES, deadline)
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(f"the child sent a header that is not JSON: {exc}") from exc
        if not isinstance(header, dict):
            raise ProtocolError("the child sent a header that is not a JSON object")
        return header

"""A small HTTP/1.1 load generator for the benches, run in its own process.

    python bench/loadgen.py SPEC.json        # prints one JSON object (a LoadResult) on stdout

Two modes, both over keep-alive connections to one loopback host:

- ``closed``: every connection sends its next request as soon as the last
  answer arrived (saturation throughput; used only when wrk is not installed);
- ``open``: requests are *scheduled* at a fixed rate, whatever the server does,
  and each latency is measured from the request's scheduled time, not from
  when a connection became free. A slow server therefore shows up as latency
  instead of silently lowering the offered load ("coordinated omission").

It speaks just enough HTTP for the benches: GET, ``Content-Length`` answers.
It runs on uvloop when installed, with one protocol object per connection, so
that at a few thousand requests per second it still uses a small share of a
CPU and its own delays do not pass for the server's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast


@dataclass(frozen=True, slots=True)
class LoadSpec:
    host: str
    port: int
    paths: list[str]
    headers: dict[str, str]
    mode: str  # "closed" or "open"
    duration_s: float
    connections: int
    rate_per_s: float = 0.0  # open mode only


@dataclass(frozen=True, slots=True)
class LoadResult:
    requests: int
    errors: int
    non_2xx: int
    elapsed_s: float
    rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    offered_rps: float


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight.

    A protocol rather than a stream, and each answer handed to ``done`` from
    ``data_received`` itself: the client's own cost per request stays a small
    fraction of the server's, so its delays do not show up as the server's
    latency.
    """

    def __init__(self, done: Callable[[_Connection, int, float], None],
                 lost: Callable[[_Connection], None]) -> None:  # fmt: skip
        self._done, self._lost = done, lost
        self._buffer = bytearray()
        self._since = 0.0
        self._busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def send(self, request: bytes, since: float) -> None:
        """Send ``request``; its latency will count from ``since`` (a perf_counter time)."""
        assert self.transport is not None and not self._busy
        self._busy, self._since = True, since
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0 or not self._busy:  # chunked answers and unasked-for bytes are not spoken here
            self._fail()
            return
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + len(b"\r\ncontent-length:") : stop if stop >= 0 else len(head)])
        if len(self._buffer) < end + 4 + length:
            return
        status = int(head[9:12])
        del self._buffer[: end + 4 + length]
        self._busy = False
        self._done(self, status, self._since)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail()

    def _fail(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None
            self._lost(self)


def _requests(spec: LoadSpec) -> list[bytes]:
    extra = "".join(f"{k}: {v}\r\n" for k, v in spec.headers.items())
    return [
        f"GET {p} HTTP/1.1\r\nHost: {spec.host}:{spec.port}\r\n{extra}\r\n".encode()
        for p in spec.paths
    ]


class _Run:
    """The state of one load run: what was sent, answered and lost."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.requests = _requests(spec)
        self.latencies: list[float] = []
        self.errors = 0
        self.non_2xx = 0
        self.sent = 0
        self.idle: list[_Connection] = []
        self.backlog: deque[float] = deque()  # open loop: scheduled times not yet sent
        self.deadline = 0.0
        self.finished = asyncio.get_running_loop().create_future()
        self.live = 0

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.spec.connections):
            _, conn = await loop.create_connection(
                lambda: _Connection(self.answered, self.lost), self.spec.host, self.spec.port
            )
            self.idle.append(conn)
        self.live = len(self.idle)

    def send(self, conn: _Connection, since: float) -> None:
        conn.send(self.requests[self.sent % len(self.requests)], since)
        self.sent += 1

    def answered(self, conn: _Connection, status: int, since: float) -> None:
        now = time.perf_counter()
        self.latencies.append(now - since)
        if not 200 <= status < 300:
            self.non_2xx += 1
        if self.spec.mode == "closed":
            if now < self.deadline:
                self.send(conn, now)
                return
        elif self.backlog:
            self.send(conn, self.backlog.popleft())
            return
        self.idle.append(conn)
        self.check_finished()

    def lost(self, conn: _Connection) -> None:
        self.errors += 1
        self.live -= 1
        if conn in self.idle:
            self.idle.remove(conn)
        self.check_finished()

    def check_finished(self) -> None:
        done_sending = (self.spec.mode == "closed" or self.sent >= self.total) and not self.backlog
        if done_sending and len(self.idle) == self.live and not self.finished.done():
            self.finished.set_result(None)

    @property
    def total(self) -> int:
        return int(self.spec.rate_per_s * self.spec.duration_s)


async def _closed(spec: LoadSpec) -> LoadResult:
    run = _Run(spec)
    await run.connect()
    start = time.perf_counter()
    run.deadline = start + spec.duration_s
    while run.idle:
        run.send(run.idle.pop(), start)
    await asyncio.wait_for(run.finished, timeout=spec.duration_s + 30)
    elapsed = time.perf_counter() - start
    return _result(run, elapsed, offered=0.0)


async def _open(spec: LoadSpec) -> LoadResult:
    """Requests *scheduled* at a fixed rate; each latency counts from its scheduled time."""
    run = _Run(spec)
    await run.connect()
    interval = 1.0 / spec.rate_per_s
    start = time.perf_counter() + 0.01
    for i in range(run.total):
        scheduled = start + i * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if run.idle:
            run.send(run.idle.pop(), scheduled)
        else:
            # Every connection is waiting for an answer: the request waits too, and its
            # latency still counts from `scheduled`, not from when it could be sent.
            run.backlog.append(scheduled)
    run.check_finished()
    try:
        await asyncio.wait_for(run.finished, timeout=30)
    except TimeoutError:
        run.errors += len(run.backlog) + run.live - len(run.idle)
    elapsed = time.perf_counter() - start
    return _result(run, elapsed, offered=spec.rate_per_s)


def _result(run: _Run, elapsed: float, *, offered: float) -> LoadResult:
    ordered = sorted(run.latencies)
    return LoadResult(
        requests=len(ordered), errors=run.errors, non_2xx=run.non_2xx, elapsed_s=elapsed,
        rps=len(ordered) / elapsed if elapsed > 0 else 0.0,
        p50_ms=percentile(ordered, 50) * 1e3, p99_ms=percentile(ordered, 99) * 1e3,
        max_ms=(ordered[-1] if ordered else float("nan")) * 1e3, offered_rps=offered,
    )  # fmt: skip


def run(spec: LoadSpec) -> LoadResult:
    main = _closed(spec) if spec.mode == "closed" else _open(spec)
    try:
        import uvloop
    except ImportError:  # Windows: asyncio's own loop, slower but the same figures' meaning
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: list[str]) -> int:
    data: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    result = run(LoadSpec(**data))
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

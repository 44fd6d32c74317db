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
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


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


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, request: bytes) -> int:
        """Send one request and read its whole answer; return the status code."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length:
            await self.reader.readexactly(length)
        return status


def _requests(spec: LoadSpec) -> list[bytes]:
    extra = "".join(f"{k}: {v}\r\n" for k, v in spec.headers.items())
    return [
        f"GET {p} HTTP/1.1\r\nHost: {spec.host}:{spec.port}\r\n{extra}\r\n".encode()
        for p in spec.paths
    ]


async def _connect(spec: LoadSpec) -> list[_Connection]:
    conns = []
    for _ in range(spec.connections):
        reader, writer = await asyncio.open_connection(spec.host, spec.port)
        conns.append(_Connection(reader, writer))
    return conns


async def _closed(spec: LoadSpec) -> LoadResult:
    requests = _requests(spec)
    conns = await _connect(spec)
    latencies: list[float] = []
    counts = {"errors": 0, "non_2xx": 0, "next": 0}
    start = time.perf_counter()
    deadline = start + spec.duration_s

    async def drive(conn: _Connection) -> None:
        while time.perf_counter() < deadline:
            i = counts["next"]
            counts["next"] = i + 1
            sent = time.perf_counter()
            try:
                status = await conn.get(requests[i % len(requests)])
            except (OSError, asyncio.IncompleteReadError, ValueError):
                counts["errors"] += 1
                return
            latencies.append(time.perf_counter() - sent)
            if not 200 <= status < 300:
                counts["non_2xx"] += 1

    await asyncio.gather(*(drive(c) for c in conns))
    elapsed = time.perf_counter() - start
    for c in conns:
        c.writer.close()
    return _result(latencies, counts["errors"], counts["non_2xx"], elapsed, offered=0.0)


async def _open(spec: LoadSpec) -> LoadResult:
    requests = _requests(spec)
    conns = await _connect(spec)
    idle: asyncio.Queue[_Connection] = asyncio.Queue()
    for c in conns:
        idle.put_nowait(c)
    latencies: list[float] = []
    counts = {"errors": 0, "non_2xx": 0}
    total = int(spec.rate_per_s * spec.duration_s)
    interval = 1.0 / spec.rate_per_s
    tasks: set[asyncio.Task[None]] = set()

    async def one(conn: _Connection, request: bytes, scheduled: float) -> None:
        try:
            status = await conn.get(request)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            counts["errors"] += 1
            return  # a broken connection is not put back
        latencies.append(time.perf_counter() - scheduled)
        if not 200 <= status < 300:
            counts["non_2xx"] += 1
        idle.put_nowait(conn)

    start = time.perf_counter() + 0.01
    for i in range(total):
        scheduled = start + i * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        # Waiting here for a free connection delays the send, not the clock:
        # the latency still counts from ``scheduled``.
        conn = await idle.get()
        task = asyncio.create_task(one(conn, requests[i % len(requests)], scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    elapsed = time.perf_counter() - start
    for c in conns:
        c.writer.close()
    return _result(latencies, counts["errors"], counts["non_2xx"], elapsed,
                   offered=spec.rate_per_s)  # fmt: skip


def _result(
    latencies: list[float], errors: int, non_2xx: int, elapsed: float, *, offered: float
) -> LoadResult:
    ordered = sorted(latencies)
    return LoadResult(
        requests=len(ordered), errors=errors, non_2xx=non_2xx, elapsed_s=elapsed,
        rps=len(ordered) / elapsed if elapsed > 0 else 0.0,
        p50_ms=percentile(ordered, 50) * 1e3, p99_ms=percentile(ordered, 99) * 1e3,
        max_ms=(ordered[-1] if ordered else float("nan")) * 1e3, offered_rps=offered,
    )  # fmt: skip


def run(spec: LoadSpec) -> LoadResult:
    return asyncio.run(_closed(spec) if spec.mode == "closed" else _open(spec))


def main(argv: list[str]) -> int:
    data: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    result = run(LoadSpec(**data))
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""HttpReporter: the contract's body on POST /v1/observations, bounded retries, never a raise."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from guard_factory import pair, saxpy_wrong_when_large

from kcert.certify.anchors import anchor
from kcert.guard import BOUNDS_US, Guard, HttpReporter, LatencyHistogram, ObservationReport
from kcert.guard.check import Mismatch

REPORT_KEYS = {"kernel", "target", "certificate", "window", "calls_seen", "calls_checked",
               "dropped", "out_of_scope", "latency", "mismatches"}  # fmt: skip
MISMATCH_KEYS = {"at", "dims", "inputs", "outputs", "reference", "max_error", "max_ratio",
                 "in_scope", "evidence"}  # fmt: skip
DIGEST = "sha256:" + "ab" * 32


class Registry:
    """A stand-in for the route: records each request, answers from a script of statuses."""

    def __init__(self, *statuses: int | Exception) -> None:
        self.statuses = list(statuses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status = self.statuses.pop(0) if self.statuses else 201
        if isinstance(status, Exception):
            raise status
        if status == 201:
            body = json.loads(request.content)
            return httpx.Response(201, json={"accepted": len(body["reports"]),
                                             "mismatches_logged": 0, "suspended": []})
        return httpx.Response(status, json={"type": "about:blank", "detail": "no"})

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]


def reporter(registry: Registry, **options: Any) -> HttpReporter:
    options.setdefault("backoff_s", 0.0)
    return HttpReporter("http://registry.test/", "secret-token", "prod-a",
                        transport=httpx.MockTransport(registry), **options)  # fmt: skip


def window(mismatches: tuple[Mismatch, ...] = (), seen: int = 3) -> ObservationReport:
    return ObservationReport(kernel=DIGEST, certificate=DIGEST, start="2026-11-23T17:00:00Z",
                             end="2026-11-23T17:00:05Z", calls_seen=seen, calls_checked=1,
                             dropped=0, out_of_scope=0, latency=LatencyHistogram(),
                             mismatches=mismatches)  # fmt: skip


def test_a_guard_posts_exactly_the_contracts_body(
    make_guard: Callable[..., Guard],
) -> None:
    registry = Registry()
    guard = make_guard(sample_rate=1.0, seed=0, reporter=reporter(registry))
    wrapped = guard.wrap(saxpy_wrong_when_large)
    x, y = pair(9000, 1)
    x0, y0 = x.copy(), y.copy()
    wrapped(x, y, 2.5, 9000)
    assert guard.flush(30)
    request = registry.requests[-1]
    assert request.method == "POST" and request.url == "http://registry.test/v1/observations"
    assert request.headers["authorization"] == "Bearer secret-token"
    assert request.headers["content-type"] == "application/json"
    reports = [r for b in registry.bodies() for r in b["reports"]]
    assert all(set(r) == REPORT_KEYS for r in reports)
    [report] = [r for r in reports if r["mismatches"]]
    contents = guard.kernel.contents
    assert report["kernel"] == str(contents.source_digest)
    assert report["certificate"] == str(contents.id)
    assert report["target"] == "prod-a"
    assert set(report["window"]) == {"start", "end"}
    assert report["latency"]["unit"] == "us" and report["latency"]["bounds"] == list(BOUNDS_US)
    assert len(report["latency"]["counts"]) == len(BOUNDS_US) + 1
    assert sum(r["calls_seen"] for r in reports) == 1
    [m] = report["mismatches"]
    assert set(m) == MISMATCH_KEYS and m["dims"] == {"n": 9000} and m["in_scope"] is False
    for name, original in (("x_ptr", x0), ("y_ptr", y0)):
        ev = m["evidence"][name]
        assert ev["dtype"] == "float32" and ev["shape"] == [9000]
        data = np.frombuffer(base64.b64decode(ev["data"]), dtype=ev["dtype"]).reshape(ev["shape"])
        assert str(anchor(data)) == m["inputs"][name] == str(anchor(original))
    assert isinstance(m["max_error"], float) and isinstance(m["max_ratio"], float)


def mismatch(size: int, error: float = 0.5) -> Mismatch:
    x = np.arange(size, dtype=np.float32)
    return Mismatch(at="2026-11-23T17:00:03Z", dims={"n": size}, inputs={"x": str(anchor(x))},
                    outputs={}, reference={}, max_error=error, max_ratio=float("inf"),
                    in_scope=True, reasons=(), evidence={"x": x})  # fmt: skip


def test_evidence_over_the_cap_is_null_and_non_finite_numbers_are_strings() -> None:
    registry = Registry()
    r = reporter(registry, max_evidence_bytes=4 * 100)
    r.submit(window((mismatch(100), mismatch(101, error=float("nan")))))
    assert r.flush()
    [a, b] = registry.bodies()[0]["reports"][0]["mismatches"]
    assert a["evidence"] is not None and b["evidence"] is None
    assert (a["max_ratio"], b["max_error"]) == ("inf", "nan")


def test_server_errors_are_retried_a_bounded_number_of_times() -> None:
    registry = Registry(503, 429, 201)
    r = reporter(registry, retries=3)
    r.submit(window())
    assert r.flush() and r.sent == 1 and len(registry.requests) == 3


def test_an_unreachable_registry_keeps_the_reports_for_the_next_flush() -> None:
    registry = Registry(*[httpx.ConnectError("refused")] * 3)
    r = reporter(registry, retries=2)
    r.submit(window())
    assert r.flush() is False  # three attempts, no raise
    assert len(registry.requests) == 3 and r.sent == 0
    assert r.flush() and r.sent == 1
    assert registry.bodies()[-1]["reports"][0]["calls_seen"] == 3


def test_a_refusal_is_not_retried_and_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    registry = Registry(422)
    r = reporter(registry, retries=3)
    r.submit(window())
    assert r.flush() and r.rejected == 1 and len(registry.requests) == 1
    assert "secret-token" not in caplog.text


def test_a_request_carries_at_most_a_hundred_reports() -> None:
    registry = Registry()
    r = reporter(registry)
    for i in range(250):
        r.submit(window(seen=i))
    assert r.flush()
    assert [len(b["reports"]) for b in registry.bodies()] == [100, 100, 50]
    seen = [rep["calls_seen"] for b in registry.bodies() for rep in b["reports"]]
    assert seen == list(range(250))


def test_a_stub_server_over_real_http_receives_the_body() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            length = int(self.headers["Content-Length"])
            received.append({"path": self.path, "auth": self.headers["Authorization"],
                             "body": json.loads(self.rfile.read(length))})  # fmt: skip
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"accepted": 1, "mismatches_logged": 0, "suspended": []}')

        def log_message(self, *args: Any) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        r = HttpReporter(f"http://127.0.0.1:{server.server_port}", "tok", "prod-b")
        r.submit(window((mismatch(8),)))
        assert r.flush()
        r.close()
    finally:
        server.shutdown()
        server.server_close()
    [got] = received
    assert got["path"] == "/v1/observations" and got["auth"] == "Bearer tok"
    [report] = got["body"]["reports"]
    assert report["target"] == "prod-b" and report["mismatches"][0]["dims"] == {"n": 8}

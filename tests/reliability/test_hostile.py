"""Oversized, malformed and hostile requests get a 4xx from a real server, never a 5xx.

Each case goes over a raw socket, so nothing in a client library tidies it
up first (non-UTF-8 bytes, bad ``Content-Length``, ``..`` in paths). The
server must answer every one with a 4xx, and when the answer comes from kcert
(not from uvicorn's HTTP parser) it is ``application/problem+json`` without a
traceback. At the end the server is still up and logged no unhandled error.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from reliability_server import RegistryServer

from kcert.registry.testing import gpu_environment

DIGEST = "sha256:" + "ab" * 32
#: The server is started with this body cap (KCERT_MAX_BODY_BYTES).
MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class Case:
    name: str
    method: bytes
    target: bytes
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    auth: bool = True
    content_type: bytes = b"application/json"
    #: False for chunked bodies (no Content-Length header at all).
    length: bool = True
    #: A well-formed request that is merely large may be served; it must still not be a 5xx.
    may_succeed: bool = False


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _envelope_with(extra: bytes) -> bytes:
    return (b'{"payloadType":"application/vnd.in-toto+json","payload":"e30=",'
            b'"signatures":[{"sig":"AAAA"}],"x":' + extra + b"}")  # fmt: skip


CASES = [
    # sizes
    Case("body over the cap", b"POST", b"/v1/certificates", b"{" + b" " * (MAX_BODY + 10) + b"}"),
    Case("chunked body over the cap", b"POST", b"/v1/certificates",
         b"[" + b"0," * MAX_BODY + b"0]", length=False),
    Case("huge header", b"GET", b"/v1/keys", headers=((b"X-Pad", b"a" * 200_000),)),
    Case("ten thousand headers", b"GET", b"/v1/keys",
         headers=tuple((b"X-H%d" % i, b"v") for i in range(10_000)), may_succeed=True),
    Case("very long URL", b"GET", b"/v1/gate?kernel=" + b"a" * 100_000 + b"&target=t"),
    Case("long target name", b"GET", b"/v1/targets/" + b"a" * 5000),
    Case("too many signatures", b"POST", b"/v1/certificates",
         json.dumps({"payloadType": "x", "payload": "e30=",
                     "signatures": [{"sig": "AAAA"}] * 1000}).encode()),
    # malformed
    Case("invalid JSON", b"POST", b"/v1/certificates", b'{"payloadType": '),
    Case("JSON with trailing garbage", b"POST", b"/v1/promotions", b'{"kernel":1}}}'),
    Case("wrong types", b"POST", b"/v1/certificates",
         b'{"payloadType": 5, "payload": [], "signatures": "x"}'),
    Case("wrong types in promotion", b"POST", b"/v1/promotions",
         b'{"kernel": {"$gt": ""}, "target": ["prod"]}'),
    Case("deep nesting", b"POST", b"/v1/certificates", _deep(20_000)),
    Case("deep nesting inside an envelope", b"POST", b"/v1/certificates",
         _envelope_with(_deep(5_000))),
    Case("moderately deep nesting inside an envelope", b"POST", b"/v1/certificates",
         _envelope_with(_deep(900))),
    Case("NaN and huge numbers", b"POST", b"/v1/tokens",
         b'{"scopes": ["admin"], "expires_in": 1e400}'),
    Case("negative lifetime", b"POST", b"/v1/tokens", b'{"scopes": ["admin"], "expires_in": -5}'),
    Case("unknown scope", b"POST", b"/v1/tokens", b'{"scopes": ["root"]}'),
    Case("payload not base64", b"POST", b"/v1/certificates",
         b'{"payloadType":"application/vnd.in-toto+json","payload":"%%%","signatures":[{"sig":"!"}]}'),
    Case("unsigned garbage envelope", b"POST", b"/v1/certificates",
         b'{"payloadType":"application/vnd.in-toto+json","payload":"AAAA",'
         b'"signatures":[{"keyid":"k","sig":"AAAA"}]}'),
    Case("environment with ten thousand fields", b"PUT", b"/v1/targets/t1",
         json.dumps({"hw_class": "H100",
                     "environment": {f"f{i}": i for i in range(10_000)}}).encode()),
    Case("bad Content-Length", b"POST", b"/v1/promotions", b"{}",
         headers=((b"Content-Length", b"abc"),), length=False),
    Case("text/plain body", b"POST", b"/v1/promotions",
         b'{"kernel": "' + DIGEST.encode() + b'", "target": "t"}', content_type=b"text/plain"),
    Case("empty body", b"POST", b"/v1/keys", b""),
    # paths and ids
    Case("path traversal in a certificate id", b"GET", b"/v1/certificates/../../etc/passwd"),
    Case("encoded path traversal", b"GET", b"/v1/certificates/..%2F..%2Fetc%2Fpasswd"),
    Case("traversal in a target name", b"PUT", b"/v1/targets/..%2F..%2Fregistry.db",
         b'{"hw_class": "H100", "environment": {}}'),
    Case("traversal in a kernel digest", b"GET", b"/v1/kernels/sha256:..%2F..%2F/certificates"),
    Case("NUL in a target name", b"GET", b"/v1/targets/a%00b"),
    Case("unknown route", b"GET", b"/v1/../../../../etc/passwd"),
    Case("wrong method", b"DELETE", b"/v1/gate"),
    # SQL-ish strings
    Case("SQL in a target name", b"GET", b"/v1/targets/x'%20OR%201=1--"),
    Case("SQL in the gate", b"GET",
         b"/v1/gate?kernel=sha256:'%20OR%20'1'='1&target=x';DROP%20TABLE%20target;--"),
    Case("SQL in a key name", b"POST", b"/v1/keys",
         json.dumps({"name": "'; DROP TABLE trusted_key;--", "public_key": "ab" * 32}).encode()),
    Case("SQL in a promotion", b"POST", b"/v1/promotions",
         json.dumps({"kernel": DIGEST, "target": "prod' OR '1'='1"}).encode()),
    Case("SQL in a certificate id", b"GET", b"/v1/certificates/sha256:1'%20UNION%20SELECT%201--"),
    # not UTF-8
    Case("non-UTF-8 body", b"POST", b"/v1/promotions", b'{"kernel": "\xff\xfe", "target": "\xc0"}'),
    Case("non-UTF-8 in the path", b"GET", b"/v1/targets/\xff\xfe\xfd"),
    Case("percent-encoded non-UTF-8 in the path", b"GET", b"/v1/targets/%FF%FE"),
    Case("non-UTF-8 in the query", b"GET", b"/v1/gate?kernel=%FF&target=%C0%AF"),
    Case("non-UTF-8 bearer token", b"GET", b"/v1/keys", auth=False,
         headers=((b"Authorization", b"Bearer \xff\xfe\xfd"),)),
    Case("UTF-16 body", b"POST", b"/v1/promotions",
         '{"kernel": "x", "target": "y"}'.encode("utf-16")),
    # log indexes (public routes)
    Case("negative log start", b"GET", b"/v1/log/entries?start=-1&end=5", auth=False),
    Case("huge log start", b"GET", b"/v1/log/entries?start=" + b"9" * 40 + b"&end=" + b"9" * 41,
         auth=False),
    Case("empty log range", b"GET", b"/v1/log/entries?start=3&end=3", auth=False),
    Case("non-integer log index", b"GET", b"/v1/log/entries?start=1e400&end=x", auth=False),
    Case("negative inclusion index", b"GET", b"/v1/log/proofs/inclusion?index=-1&size=1",
         auth=False),
    Case("huge inclusion size", b"GET",
         b"/v1/log/proofs/inclusion?index=0&size=" + b"9" * 30, auth=False),
    Case("huge inclusion index", b"GET",
         b"/v1/log/proofs/inclusion?index=" + b"9" * 30 + b"&size=1", auth=False),
    Case("backwards consistency", b"GET", b"/v1/log/proofs/consistency?first=5&second=1",
         auth=False),
    Case("negative consistency", b"GET", b"/v1/log/proofs/consistency?first=-3&second=-1",
         auth=False),
    Case("huge consistency", b"GET",
         b"/v1/log/proofs/consistency?first=1&second=" + b"9" * 25, auth=False),
]  # fmt: skip


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    home = tmp_path_factory.mktemp("hostile") / "home"
    home.mkdir()
    server = RegistryServer(home, f"sqlite:///{home / 'registry.db'}",
                            extra_env={"KCERT_MAX_BODY_BYTES": str(MAX_BODY)})  # fmt: skip
    server.start()
    try:
        # One real entry, so the log routes have a tree to range over.
        with server.client() as c:
            body = {"hw_class": "H100", "environment": gpu_environment()}
            r = c.put("/v1/targets/t1", json=body)
            assert r.status_code == 201, r.text
        yield server
    finally:
        server.stop()


def send_raw(server: RegistryServer, case: Case) -> tuple[int, bytes, bytes]:
    """Send ``case`` byte for byte; return (status, headers, body) of the answer."""
    lines = [case.method + b" " + case.target + b" HTTP/1.1", b"Host: 127.0.0.1",
             b"Connection: close"]  # fmt: skip
    if case.auth:
        lines.append(b"Authorization: Bearer " + server.admin_token.encode())
    if case.body or case.method in (b"POST", b"PUT"):
        lines.append(b"Content-Type: " + case.content_type)
    body = case.body
    if case.length:
        lines.append(b"Content-Length: %d" % len(body))
    elif not any(name.lower() == b"content-length" for name, _ in case.headers):
        lines.append(b"Transfer-Encoding: chunked")
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    lines += [name + b": " + value for name, value in case.headers]
    request = b"\r\n".join(lines) + b"\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        try:
            s.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before it has read everything
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"no HTTP answer to {case.name!r}: {data[:200]!r}"
    return int(head[9:12]), head, rest


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request_gets_a_4xx(hostile_server: RegistryServer, case: Case) -> None:
    status, head, body = send_raw(hostile_server, case)
    low = 200 if case.may_succeed else 400
    assert low <= status < 500, f"{case.name}: {status} {body[:500]!r}"
    assert b"Traceback" not in body and b'File "' not in body
    if b"application/problem+json" in head.lower():
        problem = json.loads(body)
        assert problem["status"] == status and problem["type"].startswith("https://")


def test_server_survived_without_unhandled_errors(hostile_server: RegistryServer) -> None:
    for case in CASES:  # in case this test runs alone
        send_raw(hostile_server, case)
    with hostile_server.client() as c:
        assert c.get("/v1/keys").status_code == 200
    log = Path(hostile_server.log).read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "unhandled error" not in log, log[-3000:]


def _answer(s: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    return data


def test_a_header_trickled_without_end_is_cut_off(hostile_server: RegistryServer) -> None:
    """The server stops reading at the cap (h11's, set by kcert serve) and answers a 400."""
    from kcert.api.serve import MAX_REQUEST_HEAD_BYTES

    sent = 0
    with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=30) as s:
        s.sendall(b"GET /v1/keys HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
        try:
            while sent < 8 * MAX_REQUEST_HEAD_BYTES:  # never ends the header
                s.sendall(b"a" * 1024)
                sent += 1024
                time.sleep(0.001)
        except (BrokenPipeError, ConnectionResetError):
            pass  # cut off, as it should be
        data = _answer(s)
    assert data.startswith(b"HTTP/1.1 400"), data[:300]
    assert b"Traceback" not in data


def test_a_complete_request_head_over_the_cap_is_refused(hostile_server: RegistryServer) -> None:
    from kcert.api.serve import MAX_REQUEST_HEAD_BYTES

    pad = b"a" * (MAX_REQUEST_HEAD_BYTES + 1024)
    case = Case("head over the cap", b"GET", b"/v1/keys", headers=((b"X-Pad", pad),))
    status, head, body = send_raw(hostile_server, case)
    assert status == 431, body[:300]
    assert b"application/problem+json" in head.lower()


def test_a_request_head_under_the_cap_is_served(hostile_server: RegistryServer) -> None:
    case = Case("20 KB of headers", b"GET", b"/v1/keys", headers=((b"X-Pad", b"a" * 20_000),))
    status, _, body = send_raw(hostile_server, case)
    assert status == 200, body[:300]

"""Expired, revoked, unknown, missing and wrong-scope tokens on every route of the OpenAPI document.

The table is driven by ``/openapi.json`` as the server serves it: every
operation outside the public log routes must appear in :data:`SCOPES` (a new
route fails this test until someone says which scope guards it), and every
one is called with each bad token. A right-scope call is the control: it must
get past authentication, so a route that refused everybody would fail too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from reliability_server import RegistryServer

DIGEST = "sha256:" + "ab" * 32
KEYID = "cd" * 32
#: The scope each protected operation needs (``admin`` passes everywhere).
SCOPES: dict[tuple[str, str], str] = {
    ("POST", "/v1/certificates"): "certificates:write",
    ("GET", "/v1/certificates/{certificate_id}"): "gate:read",
    ("GET", "/v1/certificates/{certificate_id}/envelope"): "gate:read",
    ("POST", "/v1/certificates/{certificate_id}/revoke"): "admin",
    ("GET", "/v1/kernels/{digest}/certificates"): "gate:read",
    ("GET", "/v1/keys"): "gate:read",
    ("POST", "/v1/keys"): "admin",
    ("DELETE", "/v1/keys/{keyid}"): "admin",
    ("PUT", "/v1/targets/{name}"): "targets:write",
    ("GET", "/v1/targets/{name}"): "gate:read",
    ("POST", "/v1/promotions"): "promote",
    ("GET", "/v1/promotions"): "gate:read",
    ("GET", "/v1/gate"): "gate:read",
    ("POST", "/v1/tokens"): "admin",
    ("DELETE", "/v1/tokens/{token_id}"): "admin",
    ("POST", "/v1/observations"): "observations:write",
    ("GET", "/v1/observations/mismatches/{mismatch_id}"): "gate:read",
    ("GET", "/v1/observations/mismatches/{mismatch_id}/evidence"): "gate:read",
    ("GET", "/v1/targets/{name}/policy"): "gate:read",
    ("PUT", "/v1/targets/{name}/policy"): "targets:write",
    ("POST", "/v1/perf"): "observations:write",
    ("GET", "/v1/perf/compare"): "gate:read",
}
NON_ADMIN = ("certificates:write", "promote", "gate:read", "targets:write", "observations:write")
#: Bodies that would be accepted, so only the token decides the answer.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/certificates"): {"payloadType": "application/vnd.in-toto+json",
                                   "payload": "e30=", "signatures": [{"sig": "AAAA"}]},
    ("POST", "/v1/certificates/{certificate_id}/revoke"): {"reason": "test"},
    ("POST", "/v1/keys"): {"name": "k", "public_key": KEYID},
    ("PUT", "/v1/targets/{name}"): {"hw_class": "H100", "environment": {"gpu_name": "x"}},
    ("POST", "/v1/promotions"): {"kernel": DIGEST, "target": "t1"},
    ("POST", "/v1/tokens"): {"scopes": ["gate:read"]},
    ("POST", "/v1/observations"): {"reports": [{
        "kernel": DIGEST, "target": "t1", "certificate": DIGEST,
        "window": {"start": "2026-11-23T17:00:00Z", "end": "2026-11-23T17:00:05Z"},
        "calls_seen": 1, "calls_checked": 0, "dropped": 0, "out_of_scope": 0}]},
    ("PUT", "/v1/targets/{name}/policy"): {"on_mismatch": "suspend"},
    ("POST", "/v1/perf"): {"kernel": DIGEST, "target": "t1",
                           "samples": [{"name": "k", "start_us": 0, "dur_us": 1}]},
}  # fmt: skip
PATH_VALUES = {"certificate_id": DIGEST, "digest": DIGEST, "keyid": KEYID, "name": "t1",
               "token_id": "tok_" + "ef" * 8, "mismatch_id": "1"}  # fmt: skip
QUERY_VALUES = {"kernel": DIGEST, "target": "t1", "reason": "test", "before": DIGEST,
                "after": DIGEST}  # fmt: skip


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    ]


def call(server: RegistryServer, method: str, path: str, op: dict[str, Any],
         token: str | None) -> httpx.Response:  # fmt: skip
    url = re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m.group(1)], path)
    query = {
        p["name"]: QUERY_VALUES[p["name"]]
        for p in op.get("parameters", [])
        if p["in"] == "query" and p["name"] in QUERY_VALUES
    }
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = BODIES.get((method, path))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        return client.request(method, url, params=query, json=body, headers=headers)


@pytest.fixture(params=["sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    # Authentication does not depend on the backend; one is enough here.
    yield f"sqlite:///{tmp_path / 'home' / 'registry.db'}"


def revoke_token(server: RegistryServer, token_id: str) -> None:
    """Revoke a token through the API, as an admin would."""
    with server.client() as c:
        r = c.delete(f"/v1/tokens/{token_id}")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == token_id and r.json()["revoked_at"] is not None


def test_every_protected_operation_refuses_bad_tokens(server: RegistryServer) -> None:
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    ops = operations(spec)
    protected = [(m, p, op) for m, p, op in ops if op.get("security")]
    public = {(m, p) for m, p, op in ops if not op.get("security")}
    # Only the audit log is public; everything else declares the bearer scheme.
    assert public and all(p.startswith("/v1/log/") for _, p in public), public
    assert {(m, p) for m, p, _ in protected} == set(SCOPES), "update SCOPES for new routes"

    # Expired: a real admin token that lived one second.
    with server.client() as c:
        made = c.post("/v1/tokens", json={"scopes": ["admin"], "expires_in": 1}).json()
        expires = time.monotonic() + 1
        revoked = c.post("/v1/tokens", json={"scopes": ["admin"]}).json()
    revoke_token(server, revoked["id"])
    lacking = {s: server.token(*[x for x in NON_ADMIN if x != s]) for s in NON_ADMIN}
    lacking["admin"] = server.token(*NON_ADMIN)
    right = {s: server.token(s) for s in NON_ADMIN}
    right["admin"] = server.admin_token
    time.sleep(max(0.0, expires + 0.2 - time.monotonic()))

    bad_tokens = {
        "missing": None,
        "unknown": "kcert_" + "x" * 43,
        "oversized": "kcert_" + "y" * 700,
        "expired": made["token"],
        "revoked": revoked["token"],
    }
    failures: list[str] = []
    for method, path, op in protected:
        scope = SCOPES[(method, path)]
        for label, token in bad_tokens.items():
            r = call(server, method, path, op, token)
            if r.status_code != 401:
                failures.append(f"{label} token: {method} {path} -> {r.status_code} {r.text[:200]}")
            elif not r.headers.get("content-type", "").startswith("application/problem+json"):
                failures.append(f"{label} token: {method} {path} answered 401 without a problem")
        r = call(server, method, path, op, lacking[scope])
        if r.status_code != 403:
            failures.append(f"token without {scope}: {method} {path} -> {r.status_code}")
        r = call(server, method, path, op, right[scope])
        if r.status_code in (401, 403) or r.status_code >= 500:
            failures.append(f"control with {scope}: {method} {path} -> {r.status_code} {r.text}")
    assert not failures, "\n".join(failures)


def test_public_log_routes_need_no_token(server: RegistryServer) -> None:
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    for method, path, op in operations(spec):
        if op.get("security"):
            continue
        query = {p["name"]: 0 if p["name"] in ("start", "first") else 1
                 for p in op.get("parameters", []) if p["in"] == "query"}  # fmt: skip
        r = httpx.request(method, f"{server.url}{path}", params=query, timeout=30)
        # An empty log may refuse a range (400), but never asks who is calling.
        assert r.status_code in (200, 400), (path, r.status_code, r.text)

"""Bearer tokens: scopes, expiry, hashing, and which routes need them."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import select

from kcert.registry.db import read_session
from kcert.registry.models import ApiToken

DIGEST = "sha256:" + "a" * 64
KEYID = "b" * 64
TOKEN_ID = "tok_" + "c" * 16

#: One request per protected operation, with a body that would pass validation.
PROTECTED: list[tuple[str, str, dict[str, Any], str]] = [
    ("POST", "/v1/certificates", {"json": {"payloadType": "x", "payload": "",
                                           "signatures": [{"sig": ""}]}}, "certificates:write"),
    ("GET", f"/v1/certificates/{DIGEST}", {}, "gate:read"),
    ("GET", f"/v1/certificates/{DIGEST}/envelope", {}, "gate:read"),
    ("POST", f"/v1/certificates/{DIGEST}/revoke", {"json": {"reason": "x"}}, "admin"),
    ("GET", f"/v1/kernels/{DIGEST}/certificates", {}, "gate:read"),
    ("POST", "/v1/keys", {"json": {"name": "k", "public_key": "c" * 64}}, "admin"),
    ("GET", "/v1/keys", {}, "gate:read"),
    ("DELETE", f"/v1/keys/{KEYID}", {}, "admin"),
    ("PUT", "/v1/targets/prod", {"json": {"hw_class": "H100", "environment": {}}},
     "targets:write"),
    ("GET", "/v1/targets/prod", {}, "gate:read"),
    ("POST", "/v1/promotions", {"json": {"kernel": DIGEST, "target": "prod"}}, "promote"),
    ("GET", "/v1/promotions", {}, "gate:read"),
    ("GET", "/v1/gate", {"params": {"kernel": DIGEST, "target": "prod"}}, "gate:read"),
    ("POST", "/v1/tokens", {"json": {"scopes": ["gate:read"]}}, "admin"),
    ("DELETE", f"/v1/tokens/{TOKEN_ID}", {}, "admin"),
    ("POST", "/v1/observations", {"json": {"reports": [{
        "kernel": DIGEST, "target": "prod", "certificate": DIGEST,
        "window": {"start": "2026-11-23T17:00:00Z", "end": "2026-11-23T17:00:05Z"},
        "calls_seen": 1, "calls_checked": 0, "dropped": 0, "out_of_scope": 0}]}},
     "observations:write"),
    ("GET", "/v1/observations/mismatches/1", {}, "gate:read"),
    ("GET", "/v1/observations/mismatches/1/evidence", {}, "gate:read"),
    ("GET", "/v1/targets/prod/policy", {}, "gate:read"),
    ("PUT", "/v1/targets/prod/policy", {"json": {"on_mismatch": "suspend"}}, "targets:write"),
    ("POST", "/v1/perf", {"json": {"kernel": DIGEST, "target": "prod", "samples": [
        {"name": "k", "start_us": 0, "dur_us": 1}]}}, "observations:write"),
    ("GET", "/v1/perf/compare", {"params": {"target": "prod", "before": DIGEST,
                                            "after": DIGEST}}, "gate:read"),
]  # fmt: skip


def make_token(client: TestClient, admin: dict[str, str], *scopes: str, **extra: Any) -> str:
    response = client.post("/v1/tokens", json={"scopes": list(scopes), **extra}, headers=admin)
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_every_protected_route_is_in_the_table(client: TestClient) -> None:
    """A new route must be added to PROTECTED (and so get these tests) or be the log's."""
    spec = client.get("/openapi.json").json()
    listed = {(m, p.replace(DIGEST, "{x}").replace(KEYID, "{x}").replace("prod", "{x}")
                  .replace(TOKEN_ID, "{x}").replace("/mismatches/1", "/mismatches/{x}"))
              for m, p, _, _ in PROTECTED}  # fmt: skip
    for path, ops in spec["paths"].items():
        if path.startswith("/v1/log/"):
            continue
        for method in ops:
            shape = path
            for name in ("{certificate_id}", "{digest}", "{keyid}", "{name}", "{token_id}",
                         "{mismatch_id}"):
                shape = shape.replace(name, "{x}")
            assert (method.upper(), shape) in listed, (method, path)


@pytest.mark.parametrize(("method", "path", "kwargs", "scope"), PROTECTED)
def test_no_token_is_401_as_a_problem(
    client: TestClient, method: str, path: str, kwargs: dict[str, Any], scope: str
) -> None:
    response = client.request(method, path, **kwargs)
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["www-authenticate"].startswith("Bearer")
    bad = client.request(method, path, headers=bearer("kcert_not_a_token"), **kwargs)
    assert bad.status_code == 401
    basic = client.request(method, path, headers={"Authorization": "Basic eDp5"}, **kwargs)
    assert basic.status_code == 401


@pytest.mark.parametrize(("method", "path", "kwargs", "scope"), PROTECTED)
def test_the_wrong_scope_is_403_and_the_right_one_passes_auth(
    client: TestClient, admin: dict[str, str], method: str, path: str, kwargs: dict[str, Any],
    scope: str,
) -> None:  # fmt: skip
    others = [s for s in ("certificates:write", "promote", "gate:read", "targets:write",
                          "observations:write") if s != scope]  # fmt: skip
    wrong = make_token(client, admin, *others)
    response = client.request(method, path, headers=bearer(wrong), **kwargs)
    assert response.status_code == 403, response.text
    assert response.json()["scope"] == scope
    right = make_token(client, admin, scope)
    allowed = client.request(method, path, headers=bearer(right), **kwargs)
    assert allowed.status_code not in (401, 403), allowed.text


def test_an_expired_token_is_refused(client: TestClient, admin: dict[str, str]) -> None:
    token = make_token(client, admin, "gate:read", expires_in=1)
    assert client.get("/v1/keys", headers=bearer(token)).status_code == 200
    time.sleep(1.1)
    response = client.get("/v1/keys", headers=bearer(token))
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_tokens_are_stored_hashed_and_shown_once(
    client: TestClient, admin: dict[str, str], engine: Engine
) -> None:
    created = client.post("/v1/tokens", json={"scopes": ["promote"], "description": "ci"},
                          headers=admin).json()  # fmt: skip
    token = created["token"]
    assert token.startswith("kcert_") and len(token) > 40
    with read_session(engine) as session:
        rows = session.exec(select(ApiToken)).all()
    assert len(rows) == 1
    assert token not in repr(rows[0].model_dump())
    log = client.get("/v1/log/entries", params={"start": 0, "end": 1}).text
    assert token not in log


def test_the_admin_token_can_do_everything_and_bad_scopes_are_422(
    client: TestClient, admin: dict[str, str]
) -> None:
    assert client.get("/v1/keys", headers=admin).status_code == 200
    response = client.post("/v1/tokens", json={"scopes": ["root"]}, headers=admin)
    assert response.status_code == 422
    assert client.post("/v1/tokens", json={"scopes": []}, headers=admin).status_code == 422


def test_the_log_needs_no_token(client: TestClient) -> None:
    assert client.get("/v1/log/checkpoint").status_code == 200

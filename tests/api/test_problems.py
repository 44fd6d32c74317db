"""Errors are RFC 9457 problems; hostile requests get 4xx, never a 500 or a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kcert.api.problems import LastResortMiddleware, problem

PROBLEM = "application/problem+json"
DIGEST = "sha256:" + "a" * 64


def is_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert set(body) >= {"type", "title", "status", "detail"}
    assert body["type"].startswith("https://kcert.dev/problems/")
    assert body["status"] == status
    assert "Traceback" not in response.text and 'File "' not in response.text
    return body


def test_validation_errors_are_422_problems(client: TestClient, admin: dict[str, str]) -> None:
    body = is_problem(client.post("/v1/promotions", json={"kernel": "nope"}, headers=admin), 422)
    assert body["type"].endswith("/validation-error")
    assert {tuple(e["loc"]) for e in body["errors"]} >= {("body", "kernel"), ("body", "target")}


def test_unknown_routes_and_methods_are_problems(client: TestClient, admin: dict[str, str]) -> None:
    assert is_problem(client.get("/v2/nothing", headers=admin), 404)["type"].endswith("not-found")
    assert is_problem(client.patch("/v1/gate", headers=admin), 405)


def test_bodies_over_the_cap_are_413_before_parsing(
    client: TestClient, admin: dict[str, str]
) -> None:
    big = b'{"name": "' + b"x" * (300 * 1024) + b'"}'
    response = client.post("/v1/keys", content=big, headers={**admin,
                           "content-type": "application/json"})  # fmt: skip
    assert is_problem(response, 413)["type"].endswith("/body-too-large")

    def chunks() -> Iterator[bytes]:
        for _ in range(64):
            yield b"x" * 8192

    streamed = client.post("/v1/keys", content=chunks(), headers={**admin,
                           "content-type": "application/json"})  # fmt: skip
    is_problem(streamed, 413)


def hostile_requests() -> list[tuple[str, str, dict[str, Any]]]:
    deep = b"[" * 100_000 + b"]" * 100_000
    envelope_like = {"payloadType": "application/vnd.in-toto+json", "payload": "%%%",
                     "signatures": [{"sig": "AAAA", "keyid": "k"}]}  # fmt: skip
    not_a_statement = {"payloadType": "application/vnd.in-toto+json", "payload": "e30=",
                       "signatures": [{"sig": "A" * 88}]}  # fmt: skip
    return [
        ("POST", "/v1/certificates", {"content": b"{not json"}),
        ("POST", "/v1/certificates", {"content": b"\xff\xfe\x00garbage"}),
        ("POST", "/v1/certificates", {"content": deep}),
        ("POST", "/v1/certificates", {"json": []}),
        ("POST", "/v1/certificates", {"json": "a string"}),
        ("POST", "/v1/certificates", {"json": envelope_like}),
        ("POST", "/v1/certificates", {"json": not_a_statement}),
        ("POST", "/v1/certificates", {"json": {**envelope_like, "extra": 1}}),
        ("POST", "/v1/certificates", {"json": {"payloadType": 1e308, "payload": None}}),
        ("GET", "/v1/certificates/sha256:zz", {}),
        ("GET", "/v1/certificates/..%2F..%2Fetc%2Fpasswd", {}),
        ("GET", f"/v1/certificates/{'a' * 5000}", {}),
        ("GET", f"/v1/kernels/{DIGEST[:-1]}/certificates", {}),
        ("GET", "/v1/gate", {"params": {"kernel": "sha256:" + "A" * 64, "target": "prod"}}),
        ("GET", "/v1/gate", {"params": {"kernel": DIGEST, "target": "a/b"}}),
        ("GET", "/v1/gate", {"params": {"kernel": DIGEST, "target": "\u0000"}}),
        ("GET", "/v1/gate", {}),
        ("PUT", "/v1/targets/prod", {"json": {"hw_class": "H100", "environment": []}}),
        ("PUT", "/v1/targets/prod", {"json": {"hw_class": "H100", "environment": {},
                                              "drift_fields": ["nonsense"]}}),
        ("PUT", "/v1/targets/prod", {"json": {"hw_class": "H100", "environment": {"x": 1}}}),
        ("PUT", "/v1/targets/prod", {"json": {"hw_class": "H100",
                                              "environment": {"device_kind": "tpu"}}}),
        ("PUT", "/v1/targets/prod", {"json": {"hw_class": "H100",
                                              "environment": {str(i): i for i in range(999)}}}),
        ("PUT", "/v1/targets/prod", {"json": {"hw_class": "../../x", "environment": {}}}),
        ("PUT", "/v1/targets/prod", {"json": {"hw_class": "H100",
                                              "environment": {"device_kind": "gpu",
                                                              "gpu_name": 10**30}}}),
        ("PUT", f"/v1/targets/{'t' * 300}", {"json": {"hw_class": "H100", "environment": {}}}),
        ("POST", "/v1/promotions", {"json": {"kernel": DIGEST, "target": "x" * 1000}}),
        ("POST", "/v1/promotions", {"json": {"kernel": 12, "target": ["prod"]}}),
        ("POST", "/v1/keys", {"json": {"name": "k", "public_key": "00" * 32}}),
        ("POST", "/v1/keys", {"json": {"name": "", "public_key": "zz"}}),
        ("DELETE", f"/v1/keys/{'f' * 64}", {}),
        ("POST", "/v1/tokens", {"json": {"scopes": ["admin"], "expires_in": -5}}),
        ("POST", "/v1/tokens", {"json": {"scopes": ["admin"], "expires_in": 10**30}}),
        ("GET", "/v1/log/entries", {"params": {"start": -1, "end": 10**20}}),
        ("GET", "/v1/log/proofs/inclusion", {"params": {"index": 5, "size": 2}}),
    ]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "kwargs"), hostile_requests())
def test_hostile_requests_get_4xx_problems(
    client: TestClient, admin: dict[str, str], method: str, path: str, kwargs: dict[str, Any]
) -> None:
    headers = {**admin}
    if "content" in kwargs:
        headers["content-type"] = "application/json"
    response = client.request(method, path, headers=headers, **kwargs)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    is_problem(response, response.status_code)


def test_the_last_resort_answers_a_problem_without_a_traceback() -> None:
    """The safety net exists for bugs; hostile input must never reach it (tests above)."""
    app = FastAPI()

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals")

    app.add_middleware(LastResortMiddleware)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom")
    body = is_problem(response, 500)
    assert "secret internals" not in response.text
    assert body["type"].endswith("/internal-error")
    assert problem(418, "teapot", "short and stout").status_code == 418

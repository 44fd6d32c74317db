"""Requests are validated before anything is written (issue 14, findings 4 and 5).

Every refusal here is a 422 problem that names what is wrong, and the audit
log, the tokens and the targets are exactly as they were before it: a request
that is refused changes nothing. Runs on SQLite and on PostgreSQL, where a NUL
reached the driver and came back as a 503 "try again".
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from kcert.attest.keys import key_id, public_key_hex
from kcert.registry.testing import gpu_environment, make_certificate

PROBLEM = "application/problem+json"


def refused(response: Any, *, loc: list[str] | None = None, error: str | None = None) -> str:
    """Assert a 422 validation problem (with an error at or under ``loc``); return its detail."""
    assert response.status_code == 422, (response.status_code, response.text[:400])
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["type"] == "https://kcert.dev/problems/validation-error"
    assert "Traceback" not in response.text
    if loc is not None:
        assert any(e["loc"][: len(loc)] == loc for e in body["errors"]), body["errors"]
    if error is not None:
        assert error in [e["type"] for e in body["errors"]], body["errors"]
    detail: str = body["detail"]
    return detail


def log_size(client: TestClient) -> int:
    return int(client.get("/v1/log/checkpoint").text.splitlines()[1])


def nested(depth: int) -> str:
    """JSON text of objects nested ``depth`` deep (built as text: json.dumps recurses)."""
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


# --- finding 4: nothing is committed that the answer cannot carry ---------------------------


@pytest.mark.parametrize("depth", [2, 600, 900])
def test_a_nested_environment_is_refused_before_any_write(
    client: TestClient, admin: dict[str, str], depth: int
) -> None:
    environment = gpu_environment()
    first = client.put("/v1/targets/prod", json={"hw_class": "H100", "environment": environment},
                       headers=admin)  # fmt: skip
    assert first.status_code == 201, first.text
    size = log_size(client)

    drifted = json.dumps({**environment, "driver_version": "999.1"})
    body = '{"hw_class": "H100", "environment": ' + drifted[:-1] + ', "extra": ' + nested(depth)
    body += "}}"
    response = client.put("/v1/targets/prod", content=body,
                          headers={**admin, "content-type": "application/json"})  # fmt: skip
    refused(response)

    assert log_size(client) == size
    target = client.get("/v1/targets/prod", headers=admin)
    assert target.status_code == 200, target.text
    assert target.json()["generation"] == 1
    assert target.json()["fingerprint"] == first.json()["fingerprint"]


def test_an_environment_is_flat_and_bounded(client: TestClient, admin: dict[str, str]) -> None:
    def report(environment: dict[str, Any]) -> Any:
        return client.put("/v1/targets/prod", json={"hw_class": "H100",
                          "environment": environment}, headers=admin)  # fmt: skip

    refused(report(gpu_environment(extra=[1, 2])), loc=["body", "environment", "extra"])
    refused(report(gpu_environment(extra="x" * 5000)), loc=["body", "environment", "extra"])
    refused(report(gpu_environment(extra=2**64)), loc=["body", "environment", "extra"])
    refused(report(gpu_environment(**{"k" * 200: "v"})))
    refused(report({f"f{i}": i for i in range(300)}), loc=["body", "environment"])
    assert log_size(client) == 0
    assert report(gpu_environment(extra=None, n=3, r=0.5, ok=True)).status_code == 201


# --- finding 5: NUL, strict types, UTF-8, unknown fields --------------------------------------


def test_a_nul_is_a_422_and_changes_nothing(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    pub = public_key_hex(signing_key.public_key())
    assert client.post("/v1/keys", json={"name": "ci", "public_key": pub},
                       headers=admin).status_code == 201  # fmt: skip
    cert = make_certificate(signing_key)
    pushed = client.post("/v1/certificates", json=cert.envelope.to_json(), headers=admin)
    assert pushed.status_code == 201, pushed.text
    cid = pushed.json()["id"]
    size = log_size(client)

    refused(client.post(f"/v1/certificates/{cid}/revoke", json={"reason": "bad\u0000"},
                        headers=admin), loc=["body", "reason"])  # fmt: skip
    refused(client.post("/v1/tokens", json={"scopes": ["admin"], "description": "a\u0000b"},
                        headers=admin), loc=["body", "description"])  # fmt: skip
    refused(client.delete(f"/v1/keys/{key_id(signing_key.public_key())}",
                          params={"reason": "x\u0000"}, headers=admin))  # fmt: skip
    refused(client.put("/v1/targets/prod", json={"hw_class": "H100",
                       "environment": gpu_environment(gpu_name="H\u0000")}, headers=admin))
    refused(client.put("/v1/targets/prod", json={"hw_class": "H100",
                       "environment": {**gpu_environment(), "k\u0000": 1}}, headers=admin))

    assert log_size(client) == size
    assert client.get(f"/v1/certificates/{cid}", headers=admin).json()["revoked_at"] is None
    assert client.get("/v1/keys", headers=admin).json()[0]["revoked_at"] is None


def test_a_lifetime_is_an_integer_not_anything_that_converts(
    client: TestClient, admin: dict[str, str]
) -> None:
    for lifetime in (True, False, "60", 1.0, 1.5, [60], {"s": 60}):
        response = client.post("/v1/tokens", headers=admin,
                               json={"scopes": ["gate:read"], "expires_in": lifetime})  # fmt: skip
        refused(response, loc=["body", "expires_in"])
    made = client.post("/v1/tokens", json={"scopes": ["gate:read"], "expires_in": 60},
                       headers=admin)  # fmt: skip
    assert made.status_code == 201, made.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/tokens", {"scopes": ["admin"], "expires": 60}),
        ("/v1/keys", {"name": "k", "public_key": "ab" * 32, "trusted": True}),
        ("/v1/promotions", {"kernel": "sha256:" + "a" * 64, "target": "t", "force": True}),
    ],
)
def test_unknown_fields_are_refused(
    client: TestClient, admin: dict[str, str], path: str, body: dict[str, Any]
) -> None:
    extra = next(iter(body.keys() - {"scopes", "name", "public_key", "kernel", "target"}))
    refused(client.post(path, json=body, headers=admin), loc=["body", extra],
            error="extra_forbidden")  # fmt: skip
    assert log_size(client) == 0


def test_a_misspelt_target_field_is_refused(client: TestClient, admin: dict[str, str]) -> None:
    body = {"hw_class": "H100", "environment": gpu_environment(), "drift_field": ["gpu_name"]}
    refused(client.put("/v1/targets/prod", json=body, headers=admin),
            loc=["body", "drift_field"], error="extra_forbidden")  # fmt: skip
    assert client.get("/v1/targets/prod", headers=admin).status_code == 404


#: Bodies that Python's json.loads(bytes) takes and the API must not.
NOT_UTF8_JSON = [
    ('{"scopes": ["admin"]}'.encode("utf-16"), "application/json"),
    ('{"scopes": ["admin"]}'.encode("utf-16-le"), "application/json"),
    ('{"scopes": ["admin"]}'.encode("utf-32"), "application/json"),
    (b"\xef\xbb\xbf" + b'{"scopes": ["admin"]}', "application/json"),
    (b'{"scopes": ["admin"], "description": "caf\xe9"}', "application/json"),
    (b'{"scopes": ["admin"]}', "application/json; charset=latin-1"),
    (b'{"scopes": ["admin"], "expires_in": NaN}', "application/json"),
    (b'{"scopes": ["admin"], "expires_in": Infinity}', "application/json"),
    ('{"scopes": ["admin"]}'.encode("utf-16"), ""),
]  # fmt: skip


def test_a_body_is_json_in_utf8(client: TestClient, admin: dict[str, str]) -> None:
    for content, content_type in NOT_UTF8_JSON:
        headers = {**admin, "content-type": content_type} if content_type else admin
        response = client.post("/v1/tokens", content=content, headers=headers)
        refused(response, loc=["body"], error="json_invalid")
    assert log_size(client) == 0


def test_a_plain_utf8_body_still_works(client: TestClient, admin: dict[str, str]) -> None:
    content = '{"scopes": ["admin"], "description": "café ☕"}'.encode()
    for content_type in ("application/json", "application/json; charset=utf-8"):
        response = client.post("/v1/tokens", content=content,
                               headers={**admin, "content-type": content_type})  # fmt: skip
        assert response.status_code == 201, response.text
        assert response.json()["description"] == "café ☕"

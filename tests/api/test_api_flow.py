"""The HTTP API end to end: push, trust, target, promote, gate, drift, deny, revoke."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from kcert.attest.keys import key_id, public_key_hex
from kcert.registry.db import write_session
from kcert.registry.models import Promotion
from kcert.registry.testing import gpu_environment, make_certificate

PROBLEM = "application/problem+json"


def assert_problem(response: Any, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["type"] == f"https://kcert.dev/problems/{kind}"
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert "Traceback" not in response.text
    return body


def test_the_flow_through_the_api(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = make_certificate(signing_key)
    envelope = cert.envelope.to_json()

    refused = client.post("/v1/certificates", json=envelope, headers=admin)
    assert_problem(refused, 422, "certificate-rejected")

    pub = public_key_hex(signing_key.public_key())
    trusted = client.post("/v1/keys", json={"name": "ci", "public_key": pub}, headers=admin)
    assert trusted.status_code == 201
    assert trusted.json()["keyid"] == key_id(signing_key.public_key())
    assert client.post("/v1/keys", json={"name": "ci", "public_key": pub},
                       headers=admin).status_code == 200  # fmt: skip

    first = client.post("/v1/certificates", json=envelope, headers=admin)
    assert first.status_code == 201 and first.json()["id"] == cert.id
    again = client.post("/v1/certificates", json=envelope, headers=admin)
    assert again.status_code == 200 and again.json()["created"] is False

    got = client.get(f"/v1/certificates/{cert.id}", headers=admin)
    assert got.status_code == 200 and got.json()["subjects"] == [cert.kernel]
    stored_envelope = client.get(f"/v1/certificates/{cert.id}/envelope", headers=admin).json()
    assert stored_envelope["signatures"] == envelope["signatures"]
    listed = client.get(f"/v1/kernels/{cert.kernel}/certificates", headers=admin).json()
    assert [c["id"] for c in listed] == [cert.id]

    body = {"hw_class": "H100", "environment": gpu_environment()}
    created = client.put("/v1/targets/prod", json=body, headers=admin)
    assert created.status_code == 201 and created.json()["generation"] == 1

    promo = {"kernel": cert.kernel, "target": "prod"}
    granted = client.post("/v1/promotions", json=promo, headers=admin)
    assert granted.status_code == 201, granted.text
    assert granted.json()["certificate"] == cert.id

    size = client.get("/v1/log/entries", params={"start": 0, "end": 1}).json()["tree_size"]
    gate = client.get("/v1/gate", params=promo, headers=admin)
    assert gate.status_code == 200
    # The gate is read-only: answering it writes nothing, not even a log leaf.
    after = client.get("/v1/log/entries", params={"start": 0, "end": 1}).json()["tree_size"]
    assert after == size
    assert gate.json() == {"allow": True, "certificate": cert.id, "reasons": gate.json()["reasons"]}

    drifted = {"hw_class": "H100", "environment": gpu_environment(cuda_runtime="13.1")}
    report = client.put("/v1/targets/prod", json=drifted, headers=admin)
    assert report.status_code == 200
    assert report.json()["stale_certificates"] == [cert.id]
    assert report.json()["suspended_promotions"] == [cert.kernel]

    gate = client.get("/v1/gate", params=promo, headers=admin).json()
    assert gate["allow"] is False and gate["certificate"] is None
    assert any("(stale)" in r for r in gate["reasons"])

    denied = client.post("/v1/promotions", json=promo, headers=admin)
    problem = assert_problem(denied, 409, "promotion-denied")
    assert any("(stale)" in r for r in problem["reasons"])
    assert isinstance(problem["log_index"], int)

    target = client.get("/v1/targets/prod", headers=admin).json()
    assert [h["generation"] for h in target["history"]] == [1, 2]
    assert [s["certificate_id"] for s in target["stale"]] == [cert.id]
    promotions = client.get("/v1/promotions", params={"target": "prod"}, headers=admin).json()
    assert [p["status"] for p in promotions] == ["suspended"]


def test_revocation_through_the_api(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    pub = public_key_hex(signing_key.public_key())
    client.post("/v1/keys", json={"name": "ci", "public_key": pub}, headers=admin)
    cert = make_certificate(signing_key)
    client.post("/v1/certificates", json=cert.envelope.to_json(), headers=admin)
    client.put("/v1/targets/prod", json={"hw_class": "H100", "environment": gpu_environment()},
               headers=admin)  # fmt: skip
    promo = {"kernel": cert.kernel, "target": "prod"}
    assert client.post("/v1/promotions", json=promo, headers=admin).status_code == 201

    keyid = key_id(signing_key.public_key())
    revoked = client.delete(f"/v1/keys/{keyid}", params={"reason": "leaked"}, headers=admin)
    assert revoked.status_code == 200 and revoked.json()["revoke_reason"] == "leaked"
    gate = client.get("/v1/gate", params=promo, headers=admin).json()
    assert gate["allow"] is False
    assert any(f"signing key {keyid} is revoked" in r for r in gate["reasons"])

    other = make_certificate(signing_key)
    refused = client.post("/v1/certificates", json=other.envelope.to_json(), headers=admin)
    assert "revoked" in assert_problem(refused, 422, "certificate-rejected")["detail"]

    out = client.post(f"/v1/certificates/{cert.id}/revoke", json={"reason": "bad ref"},
                      headers=admin)  # fmt: skip
    assert out.status_code == 200 and out.json()["revoke_reason"] == "bad ref"
    missing = client.post(f"/v1/certificates/sha256:{'0' * 64}/revoke", json={"reason": "x"},
                          headers=admin)  # fmt: skip
    assert_problem(missing, 404, "not-found")


def test_the_log_is_public_and_records_the_changes(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    pub = public_key_hex(signing_key.public_key())
    client.post("/v1/keys", json={"name": "ci", "public_key": pub}, headers=admin)
    checkpoint = client.get("/v1/log/checkpoint")
    assert checkpoint.status_code == 200
    entries = client.get("/v1/log/entries", params={"start": 0, "end": 1})
    assert entries.status_code == 200 and len(entries.json()["entries"]) == 1


def test_openapi_is_served_and_lists_the_design_routes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("/v1/certificates", "/v1/certificates/{certificate_id}",
                 "/v1/kernels/{digest}/certificates", "/v1/certificates/{certificate_id}/revoke",
                 "/v1/keys", "/v1/keys/{keyid}", "/v1/targets/{name}", "/v1/promotions",
                 "/v1/gate", "/v1/tokens"):  # fmt: skip
        assert path in paths, path
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


NO_SANDBOX = "was made with --no-sandbox (or by a certifier that did not record its sandbox)"


def test_certificates_made_outside_the_sandbox_are_stored_but_the_api_refuses_them(
    client: TestClient, admin: dict[str, str], engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    pub = public_key_hex(signing_key.public_key())
    client.post("/v1/keys", json={"name": "ci", "public_key": pub}, headers=admin)
    client.put("/v1/targets/prod", json={"hw_class": "H100", "environment": gpu_environment()},
               headers=admin)  # fmt: skip
    unsandboxed = make_certificate(signing_key, sandbox=False)
    pushed = client.post("/v1/certificates", json=unsandboxed.envelope.to_json(), headers=admin)
    assert pushed.status_code == 201 and pushed.json()["sandboxed"] is False
    promo = {"kernel": unsandboxed.kernel, "target": "prod"}
    problem = assert_problem(
        client.post("/v1/promotions", json=promo, headers=admin), 409, "promotion-denied"
    )
    assert any(r.startswith(f"{unsandboxed.id}: certificate {NO_SANDBOX}")
               for r in problem["reasons"]), problem["reasons"]  # fmt: skip
    gate = client.get("/v1/gate", params=promo, headers=admin).json()
    assert gate["allow"] is False and any(NO_SANDBOX in r for r in gate["reasons"])

    # A promotion an older registry granted on a certificate that records no sandbox:
    # the gate's own reads (not the promotion path) refuse it too.
    source = "kernel certified by an older kcert"
    old = make_certificate(signing_key, source=source, sandbox=None)
    client.post("/v1/certificates", json=old.envelope.to_json(), headers=admin)
    with write_session(engine) as session:
        session.add(Promotion(kernel=old.kernel, target_name="prod", status="active",
                              certificate_id=old.id))  # fmt: skip
        session.commit()
    promo = {"kernel": old.kernel, "target": "prod"}
    for _ in range(2):  # computed, then from the cache
        gate = client.get("/v1/gate", params=promo, headers=admin).json()
        assert gate == {"allow": False, "certificate": None,
                        "reasons": [f"{old.id}: certificate {NO_SANDBOX}: the kernel's code "
                                    "could reach the certifier; certify it again without "
                                    "--no-sandbox"]}  # fmt: skip

    again = make_certificate(signing_key, source=source, sandbox=True)
    pushed = client.post("/v1/certificates", json=again.envelope.to_json(), headers=admin)
    assert pushed.status_code == 201 and pushed.json()["sandboxed"] is True
    gate = client.get("/v1/gate", params=promo, headers=admin).json()
    assert gate["allow"] is True and gate["certificate"] == again.id

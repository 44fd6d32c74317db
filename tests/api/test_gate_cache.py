"""The gate's cached answers change on the very next request after any change that matters.

Each test first shows that the gate answered from its cache (so the test
would pass a stale answer through if invalidation were broken), then makes one
kind of change and asks again. A second app on its own engine stands for a
second server process on the same database.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlmodel import select

from kcert.api.app import create_app
from kcert.attest.keys import key_id, public_key_hex
from kcert.registry import decisions
from kcert.registry.config import Settings
from kcert.registry.db import make_engine, write_session
from kcert.registry.gatekeeper import Gatekeeper
from kcert.registry.models import GateDecision, Promotion, Target, utcnow
from kcert.registry.policy import decide_promotion
from kcert.registry.testing import MadeCertificate, gpu_environment, make_certificate


def gatekeeper(app: FastAPI) -> Gatekeeper[bytes]:
    keeper: Gatekeeper[bytes] = app.state.gatekeeper
    return keeper


def promoted(
    client: TestClient, admin: dict[str, str], key: Ed25519PrivateKey
) -> tuple[MadeCertificate, dict[str, str]]:
    """A certificate, trusted, pushed and promoted to target ``prod``."""
    pub = public_key_hex(key.public_key())
    client.post("/v1/keys", json={"name": "ci", "public_key": pub}, headers=admin)
    cert = make_certificate(key)
    assert client.post("/v1/certificates", json=cert.envelope.to_json(),
                       headers=admin).status_code == 201  # fmt: skip
    body = {"hw_class": "H100", "environment": gpu_environment()}
    assert client.put("/v1/targets/prod", json=body, headers=admin).status_code == 201
    promo = {"kernel": cert.kernel, "target": "prod"}
    assert client.post("/v1/promotions", json=promo, headers=admin).status_code == 201
    return cert, promo


def gate_json(client: TestClient, promo: dict[str, str], headers: dict[str, str]) -> Any:
    response = client.get("/v1/gate", params=promo, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def allowed_from_cache(
    app: FastAPI, client: TestClient, promo: dict[str, str], headers: dict[str, str]
) -> None:
    """Ask twice: allowed both times, and the second answer came from the cache."""
    assert gate_json(client, promo, headers)["allow"] is True
    hits = gatekeeper(app).hits
    assert gate_json(client, promo, headers)["allow"] is True
    assert gatekeeper(app).hits == hits + 1, "the second identical gate request was not cached"


def test_the_answer_is_the_json_fastapi_would_serve(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    _, promo = promoted(client, admin, signing_key)
    answers = [client.get("/v1/gate", params=promo, headers=admin) for _ in range(2)]
    assert gatekeeper(app).hits >= 1  # computed, then cached: the same bytes
    plain = FastAPI()

    @plain.get("/answer")
    def answer() -> GateDecision:
        return GateDecision.model_validate(answers[0].json())

    expected = TestClient(plain).get("/answer")
    for response in answers:
        assert response.headers["content-type"] == expected.headers["content-type"]
        assert response.content == expected.content


def test_revoking_the_certificate_changes_the_next_answer(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert, promo = promoted(client, admin, signing_key)
    allowed_from_cache(app, client, promo, admin)
    out = client.post(f"/v1/certificates/{cert.id}/revoke", json={"reason": "bad"},
                      headers=admin)  # fmt: skip
    assert out.status_code == 200
    gate = gate_json(client, promo, admin)
    assert gate["allow"] is False
    assert any("revoked" in r for r in gate["reasons"])


def test_revoking_the_key_changes_the_next_answer(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    _, promo = promoted(client, admin, signing_key)
    allowed_from_cache(app, client, promo, admin)
    keyid = key_id(signing_key.public_key())
    assert client.delete(f"/v1/keys/{keyid}", headers=admin).status_code == 200
    gate = gate_json(client, promo, admin)
    assert gate["allow"] is False
    assert any(f"signing key {keyid} is revoked" in r for r in gate["reasons"])


def test_drift_changes_the_next_answer(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    _, promo = promoted(client, admin, signing_key)
    allowed_from_cache(app, client, promo, admin)
    drifted = {"hw_class": "H100", "environment": gpu_environment(cuda_runtime="13.1")}
    assert client.put("/v1/targets/prod", json=drifted, headers=admin).status_code == 200
    gate = gate_json(client, promo, admin)
    assert gate["allow"] is False
    assert any("(stale)" in r for r in gate["reasons"])


def test_suspending_the_promotion_changes_the_next_answer(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    engine: Engine,
) -> None:  # fmt: skip
    """A suspension alone (the certificate still valid) is enough to deny."""
    cert, promo = promoted(client, admin, signing_key)
    allowed_from_cache(app, client, promo, admin)
    with write_session(engine) as session:
        promotion = session.exec(select(Promotion).where(Promotion.kernel == cert.kernel)).one()
        inputs = decisions.gather_inputs(
            session, kernel=cert.kernel, target_name="prod",
            target=decisions.TargetState.of(session.get(Target, "prod")), full_key_set=True,
        )  # fmt: skip
        decisions._suspend(session, promotion, inputs, decide_promotion(inputs), cause="test")
        session.commit()
    gate = gate_json(client, promo, admin)
    assert gate["allow"] is False
    assert any("suspended" in r for r in gate["reasons"]), gate


def test_a_revoked_token_is_refused_on_the_next_request(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    _, promo = promoted(client, admin, signing_key)
    made = client.post("/v1/tokens", json={"scopes": ["gate:read"]}, headers=admin).json()
    reader = {"Authorization": f"Bearer {made['token']}"}
    allowed_from_cache(app, client, promo, reader)
    revoked = client.delete(f"/v1/tokens/{made['id']}", headers=admin)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = client.get("/v1/gate", params=promo, headers=reader)
    assert refused.status_code == 401
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert "revoked" in refused.json()["detail"]


def test_an_expired_token_is_refused_even_when_the_answer_is_cached(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _, promo = promoted(client, admin, signing_key)
    made = client.post("/v1/tokens", json={"scopes": ["gate:read"], "expires_in": 3600},
                       headers=admin).json()  # fmt: skip
    reader = {"Authorization": f"Bearer {made['token']}"}
    allowed_from_cache(app, client, promo, reader)
    later = utcnow() + timedelta(hours=2)
    monkeypatch.setattr("kcert.registry.gatekeeper.utcnow", lambda: later)
    refused = client.get("/v1/gate", params=promo, headers=reader)
    assert refused.status_code == 401
    assert "expired" in refused.json()["detail"]


def test_a_token_without_the_scope_is_refused_even_when_the_answer_is_cached(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    _, promo = promoted(client, admin, signing_key)
    allowed_from_cache(app, client, promo, admin)
    made = client.post("/v1/tokens", json={"scopes": ["promote"]}, headers=admin).json()
    refused = client.get("/v1/gate", params=promo,
                         headers={"Authorization": f"Bearer {made['token']}"})  # fmt: skip
    assert refused.status_code == 403


def test_a_change_through_one_server_reaches_the_other_servers_gate(
    app: FastAPI, client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    database_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    cert, promo = promoted(client, admin, signing_key)
    other_engine = make_engine(database_url)
    try:
        settings: Settings = app.state.settings
        other_settings = Settings(
            home=tmp_path / "other", database_url=database_url,
            admin_token=SecretStr(settings.admin_token.get_secret_value())
            if settings.admin_token else None,
        )  # fmt: skip
        other = create_app(other_settings, engine=other_engine, migrate_on_start=False)
        with TestClient(other) as other_client:
            allowed_from_cache(other, other_client, promo, admin)
            # The change goes through the first server; the second has a cached "allow".
            drifted = {"hw_class": "H100", "environment": gpu_environment(cuda_runtime="13.1")}
            assert client.put("/v1/targets/prod", json=drifted, headers=admin).status_code == 200
            assert gate_json(other_client, promo, admin)["allow"] is False
            # And back: re-reporting the old environment and promoting again allows again.
            same = {"hw_class": "H100", "environment": gpu_environment()}
            assert client.put("/v1/targets/prod", json=same, headers=admin).status_code == 200
            assert client.post("/v1/promotions", json=promo, headers=admin).status_code == 201
            gate = gate_json(other_client, promo, admin)
            assert gate["allow"] is True and gate["certificate"] == cert.id
    finally:
        other_engine.dispose()

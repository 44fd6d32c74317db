"""Writers storming the API from many threads get answers, never a 503 (issue 14, finding 3).

On PostgreSQL a deadlock between two writers is detected after a second and one
of them fails; the API answered that 503. Under the registry's one lock order
(:mod:`kcert.registry.db`) there is no deadlock to detect.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import Engine

from kcert.attest.keys import generate_private_key, key_id, public_key_hex
from kcert.registry.consistency import check_state
from kcert.registry.db import read_session
from kcert.registry.testing import gpu_environment, make_certificate

THREADS = 8


def test_drift_revocation_promotion_and_key_changes_through_the_api_never_503(
    client: TestClient, admin: dict[str, str], engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    def key_body(name: str, key: Ed25519PrivateKey) -> dict[str, str]:
        return {"name": name, "public_key": public_key_hex(key.public_key())}

    others = [generate_private_key() for _ in range(3)]
    for i, key in enumerate([signing_key, *others]):
        assert client.post("/v1/keys", json=key_body(f"k{i}", key), headers=admin).is_success
    report = {"hw_class": "H100", "environment": gpu_environment()}
    assert client.put("/v1/targets/prod", json=report, headers=admin).is_success
    certs = [make_certificate(signing_key) for _ in range(12)]
    certs += [make_certificate(key) for key in others]
    for cert in certs:
        assert client.post("/v1/certificates", json=cert.envelope.to_json(), headers=admin)
        body = {"kernel": cert.kernel, "target": "prod"}
        assert client.post("/v1/promotions", json=body, headers=admin).status_code == 201

    drifted = {"hw_class": "H100", "environment": gpu_environment(driver_version="999.1")}
    jobs: list[Callable[[], Response]] = []
    for i, cert in enumerate(certs):
        env = drifted if i % 2 == 0 else report
        jobs.append(lambda e=env: client.put("/v1/targets/prod", json=e, headers=admin))  # type: ignore[misc]
        jobs.append(
            lambda c=cert: client.post(  # type: ignore[misc]
                f"/v1/certificates/{c.id}/revoke", json={"reason": "storm"}, headers=admin
            )
        )
        jobs.append(
            lambda c=cert: client.post(  # type: ignore[misc]
                "/v1/promotions", json={"kernel": c.kernel, "target": "prod"}, headers=admin
            )
        )
    for key in others:
        jobs.append(
            lambda k=key: client.request(  # type: ignore[misc]
                "DELETE", f"/v1/keys/{key_id(k.public_key())}", headers=admin
            )
        )
        fresh = key_body("fresh", generate_private_key())
        jobs.append(lambda f=fresh: client.post("/v1/keys", json=f, headers=admin))  # type: ignore[misc]
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        answers = [f.result(timeout=60) for f in [pool.submit(job) for job in jobs]]
    unexpected = [
        (r.status_code, r.text[:200]) for r in answers if r.status_code not in (200, 201, 409)
    ]
    assert unexpected == []
    for cert in certs:
        gate = client.get(
            "/v1/gate", params={"kernel": cert.kernel, "target": "prod"}, headers=admin
        )
        assert gate.json()["allow"] is False
    with read_session(engine) as session:
        result = check_state(session=session)
    assert result.consistent, result.differences[:5]

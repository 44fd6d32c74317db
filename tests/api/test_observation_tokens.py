"""An observations:write token reports only for the targets it was made for."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from kcert.registry.testing import gpu_environment
from tests.api.test_observations import (
    TARGET,
    _auth,
    _batch,
    _setup,
    _tree_size,
    assert_problem,
)

OTHER = "prod-b"


def _made(client: TestClient, admin: dict[str, str], **body: Any) -> Any:
    return client.post("/v1/tokens", json={"scopes": ["observations:write"], **body},
                       headers=admin)  # fmt: skip


def test_a_token_for_another_target_cannot_report_or_suspend(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key)
    assert client.put(f"/v1/targets/{OTHER}", json={"hw_class": "H100",
                      "environment": gpu_environment()}, headers=admin).status_code == 201
    made = _made(client, admin, targets=[OTHER])
    assert made.status_code == 201, made.text
    assert made.json()["targets"] == [OTHER]
    other = _auth(made.json()["token"])
    size = _tree_size(client)

    refused = client.post("/v1/observations", json=_batch(cert), headers=other)
    body = assert_problem(refused, 403, "forbidden")
    assert body["target"] == TARGET and TARGET in body["detail"]
    assert _tree_size(client) == size  # nothing logged
    gate = client.get("/v1/gate", params={"kernel": cert.kernel, "target": TARGET},
                      headers=admin).json()  # fmt: skip
    assert gate["allow"] is True  # nothing suspended

    # A batch that mixes a permitted report with a forbidden one is refused whole.
    mixed = _batch(cert)
    allowed = dict(mixed["reports"][0], target=OTHER, mismatches=[])
    mixed["reports"] = [allowed, mixed["reports"][0]]
    assert_problem(client.post("/v1/observations", json=mixed, headers=other), 403, "forbidden")
    assert _tree_size(client) == size

    # The same bound token may not feed another target's latency store either.
    perf = {"kernel": cert.kernel, "target": TARGET,
            "samples": [{"name": "k", "start_us": 0, "dur_us": 1}]}  # fmt: skip
    assert_problem(client.post("/v1/perf", json=perf, headers=other), 403, "forbidden")
    perf["target"] = OTHER
    assert client.post("/v1/perf", json=perf, headers=other).status_code == 201

    # Bound to TARGET, the report goes through and suspends.
    mine = _auth(_made(client, admin, targets=[TARGET]).json()["token"])
    sent = client.post("/v1/observations", json=_batch(cert), headers=mine)
    assert sent.status_code == 201 and sent.json()["suspended"] == [TARGET]


def test_an_observations_token_must_name_its_targets_or_say_all(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key)
    assert_problem(_made(client, admin), 422, "validation-error")
    both = _made(client, admin, targets=[TARGET], all_targets=True)
    assert_problem(both, 422, "validation-error")
    assert_problem(_made(client, admin, targets=[]), 422, "validation-error")
    assert_problem(_made(client, admin, targets=["../x"]), 422, "validation-error")
    gate_only = client.post("/v1/tokens", json={"scopes": ["gate:read"], "targets": [TARGET]},
                            headers=admin)  # fmt: skip
    assert_problem(gate_only, 422, "validation-error")

    every = _made(client, admin, all_targets=True)
    assert every.status_code == 201 and every.json()["targets"] is None
    sent = client.post("/v1/observations", json=_batch(cert), headers=_auth(every.json()["token"]))
    assert sent.status_code == 201, sent.text

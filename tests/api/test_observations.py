"""POST /v1/observations as a hostile client would use it, and what a mismatch does."""

from __future__ import annotations

import base64
import copy
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from kcert.attest.keys import public_key_hex
from kcert.certify.anchors import anchor
from kcert.registry.testing import gpu_environment, make_certificate

TARGET = "prod-a"
PROBLEM = "application/problem+json"


def assert_problem(response: Any, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["type"] == f"https://kcert.dev/problems/{kind}"
    assert body["detail"] and "Traceback" not in response.text
    return body


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _token(client: TestClient, admin: dict[str, str], *scopes: str) -> dict[str, str]:
    body: dict[str, Any] = {"scopes": list(scopes)}
    if "observations:write" in scopes:
        body["targets"] = [TARGET]
    made = client.post("/v1/tokens", json=body, headers=admin)
    assert made.status_code == 201, made.text
    return _auth(made.json()["token"])


def _setup(client: TestClient, admin: dict[str, str], key: Ed25519PrivateKey,
           *, policy: str = "suspend", promote: bool = True) -> Any:  # fmt: skip
    pub = public_key_hex(key.public_key())
    assert client.post("/v1/keys", json={"name": "ci", "public_key": pub},
                       headers=admin).status_code == 201  # fmt: skip
    cert = make_certificate(key)
    assert client.post("/v1/certificates", json=cert.envelope.to_json(),
                       headers=admin).status_code == 201  # fmt: skip
    body = {"hw_class": "H100", "environment": gpu_environment()}
    assert client.put(f"/v1/targets/{TARGET}", json=body, headers=admin).status_code == 201
    put = client.put(f"/v1/targets/{TARGET}/policy", json={"on_mismatch": policy}, headers=admin)
    assert put.status_code == 200, put.text
    if promote:
        granted = client.post("/v1/promotions", json={"kernel": cert.kernel, "target": TARGET},
                              headers=admin)  # fmt: skip
        assert granted.status_code == 201, granted.text
    return cert


def _evidence(x: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {"dtype": str(x.dtype), "shape": list(x.shape),
            "data": base64.b64encode(x.tobytes()).decode()}  # fmt: skip


def _batch(cert: Any, *, n: int = 70000, evidence: bool = True) -> dict[str, Any]:
    x = np.arange(n, dtype=np.float32)
    out = x * 2 + 1
    ref = x * 2
    mismatch = {
        "at": "2026-11-23T17:00:03Z", "dims": {"n": n},
        "inputs": {"x": str(anchor(x))}, "outputs": {"out": str(anchor(out))},
        "reference": {"out": str(anchor(ref))}, "max_error": 1.0, "max_ratio": 1.2e6,
        "in_scope": False, "evidence": {"x": _evidence(x)} if evidence else None,
    }  # fmt: skip
    return {"reports": [{
        "kernel": cert.kernel, "target": TARGET, "certificate": cert.id,
        "window": {"start": "2026-11-23T17:00:00Z", "end": "2026-11-23T17:00:05Z"},
        "calls_seen": 1000, "calls_checked": 12, "dropped": 0, "out_of_scope": 3,
        "latency": {"unit": "us", "bounds": [1, 2, 5, 10], "counts": [0, 3, 7, 2, 0]},
        "mismatches": [mismatch],
    }]}  # fmt: skip


def _tree_size(client: TestClient) -> int:
    size: int = client.get("/v1/log/entries", params={"start": 0, "end": 1}).json()["tree_size"]
    return size


def test_a_confirmed_mismatch_suspends_and_the_gate_denies(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key)
    guard = _token(client, admin, "observations:write")
    gate = {"kernel": cert.kernel, "target": TARGET}
    assert client.get("/v1/gate", params=gate, headers=admin).json()["allow"] is True
    size = _tree_size(client)

    sent = client.post("/v1/observations", json=_batch(cert), headers=guard)
    assert sent.status_code == 201, sent.text
    body = sent.json()
    assert (body["accepted"], body["mismatches_logged"], body["suspended"]) == (1, 1, [TARGET])
    assert _tree_size(client) == size + 1

    denied = client.get("/v1/gate", params=gate, headers=admin).json()
    assert denied["allow"] is False
    assert any("runtime-mismatch" in r for r in denied["reasons"]), denied

    (mid,) = body["mismatch_ids"]
    got = client.get(f"/v1/observations/mismatches/{mid}/evidence", headers=admin).json()
    x = np.frombuffer(base64.b64decode(got["arrays"]["x"]["data"]), dtype=np.float32)
    assert str(anchor(x)) == got["arrays"]["x"]["anchor"]
    entry = client.get("/v1/log/entries", params={"start": size, "end": size + 1}).json()
    assert entry["tree_size"] == size + 1

    # The same report again is a duplicate: nothing logged, nothing stored twice.
    again = client.post("/v1/observations", json=_batch(cert), headers=guard)
    assert again.status_code == 201 and again.json()["duplicates"] == 1
    assert again.json()["mismatches_logged"] == 0 and _tree_size(client) == size + 1


def test_record_policy_and_unconfirmed_mismatches_only_record(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key, policy="record")
    guard = _token(client, admin, "observations:write")
    sent = client.post("/v1/observations", json=_batch(cert), headers=guard).json()
    assert sent["mismatches_logged"] == 1 and sent["suspended"] == []
    client.put(f"/v1/targets/{TARGET}/policy", json={"on_mismatch": "suspend"}, headers=admin)
    unconfirmed = client.post("/v1/observations", json=_batch(cert, n=10, evidence=False),
                              headers=guard).json()  # fmt: skip
    assert unconfirmed["mismatches_logged"] == 1 and unconfirmed["suspended"] == []
    gate = {"kernel": cert.kernel, "target": TARGET}
    assert client.get("/v1/gate", params=gate, headers=admin).json()["allow"] is True


@pytest.mark.parametrize("scopes", [("gate:read",), ("promote",), ("targets:write",)])
def test_wrong_scopes_and_no_token_are_refused(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey,
    scopes: tuple[str, ...],
) -> None:  # fmt: skip
    cert = _setup(client, admin, signing_key)
    size = _tree_size(client)
    assert_problem(client.post("/v1/observations", json=_batch(cert)), 401, "unauthenticated")
    wrong = _token(client, admin, *scopes)
    size = _tree_size(client)
    body = assert_problem(client.post("/v1/observations", json=_batch(cert), headers=wrong),
                          403, "forbidden")  # fmt: skip
    assert body["scope"] == "observations:write"
    # A guard's token cannot set the policy that decides what its reports do.
    guard = _token(client, admin, "observations:write")
    size = _tree_size(client)
    assert_problem(client.put(f"/v1/targets/{TARGET}/policy", json={"on_mismatch": "record"},
                              headers=guard), 403, "forbidden")  # fmt: skip
    assert _tree_size(client) == size


def _mutate(batch: dict[str, Any], how: str) -> dict[str, Any]:
    b = copy.deepcopy(batch)
    report = b["reports"][0]
    mismatch = report["mismatches"][0]
    if how == "bad-base64":
        mismatch["evidence"]["x"]["data"] = "not base64!!"
    elif how == "forged-anchor":
        mismatch["inputs"]["x"] = "sha256:" + "0" * 64
    elif how == "wrong-length":
        mismatch["evidence"]["x"]["shape"] = [69999]
    elif how == "unanchored-evidence":
        mismatch["evidence"]["y"] = mismatch["evidence"]["x"]
    elif how == "extra-field":
        report["suspend"] = True
    elif how == "negative-count":
        report["calls_seen"] = -1
    elif how == "histogram-shape":
        report["latency"]["counts"] = [1, 2]
    elif how == "too-many-reports":
        b["reports"] = [report] * 101
    elif how == "naive-time":
        mismatch["at"] = "2026-11-23T17:00:03"
    elif how == "bool-as-int":
        report["dropped"] = True
    elif how == "nan-error":
        mismatch["max_error"] = "NaN"
    return b


@pytest.mark.parametrize("how", [
    "bad-base64", "forged-anchor", "wrong-length", "unanchored-evidence", "extra-field",
    "negative-count", "histogram-shape", "too-many-reports", "naive-time", "bool-as-int",
    "nan-error",
])  # fmt: skip
def test_malformed_reports_are_refused_and_change_nothing(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey, how: str
) -> None:
    cert = _setup(client, admin, signing_key)
    guard = _token(client, admin, "observations:write")
    size = _tree_size(client)
    sent = client.post("/v1/observations", json=_mutate(_batch(cert, n=64), how), headers=guard)
    assert sent.status_code == 422, sent.text
    assert sent.headers["content-type"].startswith("application/problem+json")
    assert "Traceback" not in sent.text
    assert _tree_size(client) == size
    gate = {"kernel": cert.kernel, "target": TARGET}
    assert client.get("/v1/gate", params=gate, headers=admin).json()["allow"] is True


def test_unknown_objects_and_unpromoted_kernels_are_refused(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key, promote=False)
    guard = _token(client, admin, "observations:write")
    size = _tree_size(client)
    batch = _batch(cert, n=16)
    # A kernel the target never promoted: its mismatch cannot suspend anything, and is refused.
    assert_problem(client.post("/v1/observations", json=batch, headers=guard), 422,
                   "invalid-input")  # fmt: skip
    for key, value, status, kind in (
        # A token bound to prod-a learns nothing about other targets, known or not.
        ("target", "nowhere", 403, "forbidden"),
        ("certificate", "sha256:" + "1" * 64, 404, "not-found"),
        ("kernel", "sha256:" + "2" * 64, 422, "invalid-input"),
    ):
        b = copy.deepcopy(batch)
        b["reports"][0][key] = value
        assert_problem(client.post("/v1/observations", json=b, headers=guard), status, kind)
    b = copy.deepcopy(batch)
    b["reports"][0]["target"] = "nowhere"
    assert_problem(client.post("/v1/observations", json=b, headers=admin), 404, "not-found")
    other = make_certificate(signing_key)  # a certificate of another kernel
    assert client.post("/v1/certificates", json=other.envelope.to_json(),
                       headers=admin).status_code == 201  # fmt: skip
    size = _tree_size(client)
    b = copy.deepcopy(batch)
    b["reports"][0]["certificate"] = other.id
    assert_problem(client.post("/v1/observations", json=b, headers=guard), 422, "invalid-input")
    assert _tree_size(client) == size
    # Latency alone (a canary before promotion) is taken.
    b = copy.deepcopy(batch)
    b["reports"][0]["mismatches"] = []
    assert client.post("/v1/observations", json=b, headers=guard).status_code == 201


def test_oversized_evidence_is_413(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey, app: Any
) -> None:
    app.state.settings.observation_evidence_max = 1024
    cert = _setup(client, admin, signing_key)
    guard = _token(client, admin, "observations:write")
    size = _tree_size(client)
    assert_problem(client.post("/v1/observations", json=_batch(cert, n=1024), headers=guard),
                   413, "too-large")  # fmt: skip
    assert _tree_size(client) == size
    # The route's own body cap is above the API's (evidence), and still a cap.
    big = b"{" + b" " * (65 * 1024 * 1024) + b"}"
    assert_problem(client.post("/v1/observations", content=big, headers={
        **guard, "content-type": "application/json"}), 413, "body-too-large")  # fmt: skip


def test_the_log_explains_the_suspension(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey, engine: Any
) -> None:
    from kcert.log.leaf import parse_leaf
    from kcert.registry.audit import read_entries
    from kcert.registry.consistency import check_state
    from kcert.registry.db import read_session
    from kcert.registry.history import replay_history
    from kcert.registry.replay import replay_decision

    cert = _setup(client, admin, signing_key)
    guard = _token(client, admin, "observations:write")
    assert client.post("/v1/observations", json=_batch(cert, n=8), headers=guard).json()[
        "suspended"] == [TARGET]  # fmt: skip
    with read_session(engine) as session:
        entries = [(r.index, r.leaf) for r in read_entries(session, 0, 1000)]
    with read_session(engine) as session:
        assert check_state(session=session).consistent
    history = replay_history(entries)
    assert history.differences == [], history.differences
    assert history.state.promotions[(cert.kernel, TARGET)].status == "suspended"
    index, data = entries[-1]
    leaf = parse_leaf(index, data)
    assert leaf.kind == "observation.mismatch" and replay_decision(leaf).same
    # A leaf that claims the target only records, yet suspended, is caught both ways.
    forged = data.replace(b'"on_mismatch":"suspend"', b'"on_mismatch":"record"')
    assert forged != data
    assert not replay_decision(parse_leaf(index, forged)).same
    found = replay_history([*entries[:-1], (index, forged)]).differences
    assert any("on_mismatch" in d.message for d in found), found


def test_a_nan_error_is_a_mismatch_too(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key)
    guard = _token(client, admin, "observations:write")
    batch = _batch(cert, n=8)
    batch["reports"][0]["mismatches"][0]["max_error"] = "nan"
    batch["reports"][0]["mismatches"][0]["max_ratio"] = "inf"
    sent = client.post("/v1/observations", json=batch, headers=guard)
    assert sent.status_code == 201 and sent.json()["suspended"] == [TARGET]


def test_guard_histograms_feed_perf_and_huge_counts_stay_bounded(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    from kcert.registry.perf import MAX_VALUES

    cert = _setup(client, admin, signing_key, promote=False)
    guard = _token(client, admin, "observations:write")
    batch = _batch(cert, n=8)
    batch["reports"][0]["mismatches"] = []
    assert client.post("/v1/observations", json=batch, headers=guard).status_code == 201
    params = {"target": TARGET, "before": cert.kernel, "after": cert.kernel, "resamples": 20}
    got = client.get("/v1/perf/compare", params=params, headers=admin)
    assert got.status_code == 200, got.text
    assert got.json()["before"]["samples"] == 12  # 3 + 7 + 2 counted calls
    p50 = got.json()["before"]["percentiles"][0]
    assert p50["q"] == 50 and p50["value_us"] == 5.0  # counted at the bucket's upper bound
    batch["reports"][0]["window"]["end"] = "2026-11-23T17:00:06Z"
    batch["reports"][0]["latency"]["counts"] = [2**53 - 1, 0, 0, 2**53 - 1, 0]
    assert client.post("/v1/observations", json=batch, headers=guard).status_code == 201
    got = client.get("/v1/perf/compare", params=params, headers=admin)
    assert got.status_code == 200 and got.json()["before"]["samples"] <= MAX_VALUES
    guard_only = client.get("/v1/perf/compare", params=params, headers=guard)
    assert_problem(guard_only, 403, "forbidden")


def test_a_deep_body_is_refused_before_routing(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key)
    guard = _token(client, admin, "observations:write")
    size = _tree_size(client)
    batch = _batch(cert, n=4)
    deep: Any = 0
    for _ in range(40):
        deep = [deep]
    batch["reports"][0]["mismatches"][0]["dims"] = {"n": deep}
    assert_problem(client.post("/v1/observations", json=batch, headers=guard), 422,
                   "validation-error")  # fmt: skip
    assert _tree_size(client) == size


def test_output_evidence_is_anchored_stored_and_served_and_forgeries_are_refused(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    cert = _setup(client, admin, signing_key, policy="record")
    guard = _token(client, admin, "observations:write")
    n = 64
    out = np.arange(n, dtype=np.float32) * 2 + 1
    size = _tree_size(client)

    def post(outputs_evidence: Any, *, evidence: bool = True, **changes: Any) -> Any:
        batch = _batch(cert, n=n, evidence=evidence)
        mismatch = batch["reports"][0]["mismatches"][0]
        mismatch.update(outputs_evidence=outputs_evidence, **changes)
        return client.post("/v1/observations", json=batch, headers=guard)

    forged = out.copy()
    forged[0] += 1  # bytes that are not the output the mismatch anchors
    assert_problem(post({"out": _evidence(forged)}), 422, "invalid-input")
    assert_problem(post({"x": _evidence(np.arange(n, dtype=np.float32))}), 422,
                   "invalid-input")  # an input's bytes passed off as an output  # fmt: skip
    assert_problem(post({"out": _evidence(out)}, evidence=False), 422, "invalid-input")
    # inout: the output anchor is the value after the call; its value before is not it
    y0, y1 = np.ones(n, dtype=np.float32), np.full(n, 3, dtype=np.float32)
    inout = {"inputs": {"x": str(anchor(np.arange(n, dtype=np.float32))), "y": str(anchor(y0))},
             "outputs": {"y": str(anchor(y1))}, "reference": {"y": str(anchor(y1))}}
    assert_problem(post({"y": _evidence(y0)}, **inout), 422, "invalid-input")
    assert _tree_size(client) == size  # nothing of the refused batches was logged

    sent = post({"out": _evidence(out)})
    assert sent.status_code == 201, sent.text
    (mid,) = sent.json()["mismatch_ids"]
    got = client.get(f"/v1/observations/mismatches/{mid}/evidence", headers=admin).json()
    served = got["outputs"]["out"]
    assert served["anchor"] == str(anchor(out))
    assert base64.b64decode(served["data"]) == out.tobytes()
    assert base64.b64decode(got["arrays"]["x"]["data"]) == np.arange(n, dtype=np.float32).tobytes()
    logged = client.get(f"/v1/observations/mismatches/{mid}", headers=admin).json()
    assert logged["report"]["outputs_evidence"]["out"]["anchor"] == str(anchor(out))


def test_a_mismatch_that_names_nothing_is_not_confirmed(
    client: TestClient, admin: dict[str, str], signing_key: Ed25519PrivateKey
) -> None:
    """Empty anchors with an empty evidence map hold nothing to re-run: recorded, no suspension."""
    cert = _setup(client, admin, signing_key)
    guard = _token(client, admin, "observations:write")
    batch = _batch(cert, n=4)
    mismatch = batch["reports"][0]["mismatches"][0]
    for key in ("inputs", "outputs", "reference", "evidence", "dims"):
        mismatch[key] = {}
    sent = client.post("/v1/observations", json=batch, headers=guard)
    assert sent.status_code == 201, sent.text
    assert sent.json()["mismatches_logged"] == 1 and sent.json()["suspended"] == []
    (mid,) = sent.json()["mismatch_ids"]
    stored = client.get(f"/v1/observations/mismatches/{mid}", headers=admin).json()
    assert stored["confirmed"] is False
    gate = {"kernel": cert.kernel, "target": TARGET}
    assert client.get("/v1/gate", params=gate, headers=admin).json()["allow"] is True

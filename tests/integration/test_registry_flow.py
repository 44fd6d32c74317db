"""The registry end to end, through both doors on one database, on SQLite and PostgreSQL.

The CLI (embedded registry) and the HTTP API share one database: what one
door writes the other reads. The flow is the README tour's: push, trust, target,
promote, gate allow, drift, gate deny, 409 on promotion; then the audit log
holds a leaf for every change and every promotion leaf re-decides the same.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from typer.testing import CliRunner

from kcert.api.app import create_app
from kcert.attest.certificate import write_certificate
from kcert.attest.keys import generate_private_key, public_key_hex
from kcert.cli.app import app as cli
from kcert.registry.config import Settings
from kcert.registry.db import dispose_engines
from kcert.registry.policy import PromotionInputs, decide_promotion
from kcert.registry.testing import (
    gpu_environment,
    make_certificate,
    postgres_database,
    postgres_reachable,
)

ADMIN = "kcert_integration_admin_" + "z" * 20
runner = CliRunner()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        dispose_engines()
        return
    reason = postgres_reachable()
    if reason is not None:
        pytest.skip(reason)
    with postgres_database() as url:
        yield url


@pytest.fixture
def api(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    for name in ("KCERT_REGISTRY", "KCERT_TOKEN", "KCERT_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KCERT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KCERT_DATABASE_URL", database_url)
    settings = Settings(
        home=tmp_path / "home", database_url=database_url, admin_token=SecretStr(ADMIN)
    )
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield c


def cli_json(*args: str | Path, code: int = 0) -> dict[str, Any]:
    result = runner.invoke(cli, [*map(str, args), "--json"])
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    value: dict[str, Any] = json.loads(result.stdout)
    return value


def test_push_trust_target_promote_gate_drift_deny_across_both_doors(
    api: TestClient, tmp_path: Path
) -> None:
    key = generate_private_key()
    cert = make_certificate(key)
    cert_file = tmp_path / "saxpy.cert.json"
    write_certificate(cert_file, cert.envelope)
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps(gpu_environment()))

    # The CLI (embedded) refuses an untrusted certificate; the API trusts the key.
    assert runner.invoke(cli, ["push", str(cert_file)]).exit_code == 1
    pub = public_key_hex(key.public_key())
    assert api.post("/v1/keys", json={"name": "ci", "public_key": pub}).status_code == 201
    assert cli_json("push", cert_file)["created"] is True
    assert api.post("/v1/certificates", json=cert.envelope.to_json()).status_code == 200

    cli_json("target", "report", "prod", "--hw", "H100", "--environment", env_file)
    promotion = api.post("/v1/promotions", json={"kernel": cert.kernel, "target": "prod"})
    assert promotion.status_code == 201
    assert cli_json("gate", "--kernel", cert.kernel, "--target", "prod")["allow"] is True

    drifted = {"hw_class": "H100", "environment": gpu_environment(cublas="13.1.0")}
    report = api.put("/v1/targets/prod", json=drifted).json()
    assert report["stale_certificates"] == [cert.id]
    gate = cli_json("gate", "--kernel", cert.kernel, "--target", "prod", code=1)
    assert gate["allow"] is False
    denied = api.post("/v1/promotions", json={"kernel": cert.kernel, "target": "prod"})
    assert denied.status_code == 409
    assert denied.headers["content-type"].startswith("application/problem+json")
    assert cli_json("promote", "--kernel", cert.kernel, "--target", "prod", code=1)["reasons"]

    # Every change is a leaf, and every decision re-decides the same from its leaf.
    entries = api.get("/v1/log/entries", params={"start": 0, "end": 100}).json()["entries"]
    leaves = [json.loads(base64.b64decode(e["leaf"])) for e in entries]
    kinds = [leaf["kind"] for leaf in leaves]
    for kind in ("key.trusted", "certificate.stored", "target.reported", "promotion.granted",
                 "certificate.invalidated", "promotion.suspended", "promotion.denied"):  # fmt: skip
        assert kind in kinds, kind
    assert kinds.count("certificate.stored") == 1  # the second push stored nothing new
    decisions = [leaf for leaf in leaves if leaf["kind"].startswith("promotion.")]
    assert len(decisions) == 4  # granted, suspended, denied (API), denied (CLI)
    for leaf in decisions:
        inputs = PromotionInputs.from_json(leaf["payload"]["inputs"])
        assert decide_promotion(inputs).to_json() == leaf["payload"]["decision"]
        assert inputs.trusted_keys_digest() == leaf["payload"]["inputs"]["trusted_keys_digest"]

    granted = kinds.index("promotion.granted")
    replay = runner.invoke(cli, ["audit", "replay", str(granted), "--json"])
    assert replay.exit_code == 0, (replay.stdout, replay.stderr)
    assert json.loads(replay.stdout)["same"] is True

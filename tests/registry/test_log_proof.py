"""``kcert audit state`` and ``kcert audit replay --all`` prove the leaves they fold.

Folding leaves says what they explain, not that they are the log's: an attacker
with only the database can rewrite a leaf in place (a revocation turned into
some harmless kind) and the state with it. Both commands recompute every leaf
hash and the root and hold them against the log's signed checkpoints; they
check token rows against the token leaves, and they count a decision whose
inputs could not be checked against envelopes as unverified, not as the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, text
from typer.testing import CliRunner, Result

from kcert.attest.keys import public_key_hex
from kcert.cli import audit_cmds
from kcert.cli.app import app
from kcert.digest import Digest
from kcert.log.leaf import build_leaf
from kcert.log.note import Checkpoint, Signer
from kcert.registry import audit
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.consistency import Commitments, StateCheck, check_state
from kcert.registry.db import dispose_engines, read_session, write_session
from kcert.registry.history import replay_history
from kcert.registry.log_source import DatabaseLogSource
from kcert.registry.models import ApiTokenCreate, Scope, TargetCreate, TrustedKeyCreate
from kcert.registry.testing import MadeCertificate, gpu_environment, make_certificate
from kcert.registry.tokens import create_token, revoke_token


@dataclass
class Home:
    registry: EmbeddedRegistry
    engine: Engine
    url: str
    home: Path
    signer: Signer
    cert: MadeCertificate


@pytest.fixture
def h(
    engine: Engine, database_url: str, signing_key: Ed25519PrivateKey, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Home]:  # fmt: skip
    """A registry with a log key in its home, a trusted key and one certificate."""
    for name in ("KCERT_REGISTRY", "KCERT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    where = tmp_path / "home"
    monkeypatch.setenv("KCERT_HOME", str(where))
    monkeypatch.setenv("KCERT_DATABASE_URL", database_url)
    reg = EmbeddedRegistry(Settings(database_url=database_url, home=where), engine=engine)
    reg.trust_key(TrustedKeyCreate(name="ci", public_key=public_key_hex(signing_key.public_key())))
    cert = make_certificate(signing_key)
    reg.push(cert.envelope)
    yield Home(reg, engine, database_url, where, audit.log_signer(where), cert)
    dispose_engines()


def _check(h: Home, notes: list[tuple[str, str]] | None = None) -> StateCheck:
    commitments = Commitments(h.signer.verifier, h.signer, notes or [])
    with read_session(h.engine) as session:
        return check_state(session=session, commitments=commitments)


def _leaves(engine: Engine) -> list[tuple[int, str, bytes]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT leaf_index, kind, leaf FROM log_entry ORDER BY 1"))
        return [(int(i), str(k), bytes(leaf)) for i, k, leaf in rows]


def _audit(*args: str) -> Result:
    return CliRunner().invoke(app, ["audit", *args])


# --- B1: leaves rewritten in place -------------------------------------------------------


def _hide_the_revocation(engine: Engine) -> list[int]:
    """The attacker with only the database: the revocation's leaves become token leaves
    (log_node untouched), the certificate unrevoked, the promotion active again."""
    rewritten = []
    leaves = _leaves(engine)
    with engine.begin() as conn:
        for index, kind, _ in leaves:
            if kind in (audit.CERTIFICATE_REVOKED, audit.PROMOTION_SUSPENDED):
                payload = {"token_id": f"tok_{index:04x}", "scopes": ["gate:read"],
                           "expires_at": None}  # fmt: skip
                fake = build_leaf(index=index, kind=audit.TOKEN_CREATED, payload=payload,
                                  time=datetime.now(UTC))  # fmt: skip
                conn.execute(
                    text("UPDATE log_entry SET kind = :k, leaf = :l WHERE leaf_index = :i"),
                    {"k": audit.TOKEN_CREATED, "l": fake, "i": index},
                )
                rewritten.append(index)
        conn.execute(text("UPDATE certificate SET revoked_at = NULL, revoke_reason = NULL"))
        conn.execute(text("UPDATE promotion SET status = 'active', suspended_at = NULL, "
                          "suspend_reason = NULL"))  # fmt: skip
    return rewritten


def test_a_leaf_rewritten_in_place_is_named_by_state_and_replay(h: Home) -> None:
    h.registry.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    h.registry.promote(Digest.parse(h.cert.kernel), "prod")
    h.registry.revoke_certificate(h.cert.id, "bad")
    size = len(_leaves(h.engine))
    assert _check(h).consistent
    rewritten = _hide_the_revocation(h.engine)
    assert len(rewritten) == 2

    result = _check(h)
    message = f"entry {rewritten[0]} is not the leaf the log's signed checkpoint (size {size}) "
    assert [(d.kind, d.subject, d.message) for d in result.differences if d.kind == "log"] == [
        ("log", f"entry {rewritten[0]}", message + "commits to")
    ]
    assert result.proved_against == ()
    # Without the log key: held against the tree the database's nodes store.
    with read_session(h.engine) as session:
        bare = check_state(session=session)
    assert [d.subject for d in bare.differences if d.kind == "log"] == [f"entry {rewritten[0]}"]

    state = _audit("state", "--database", h.url)
    assert state.exit_code == 1, state.output
    assert f"log: {message}commits to" in state.stdout
    # replay --all asks the registry for its checkpoint first: the log guard, which hashes
    # every entry it signs, refuses the rewritten log (and fails closed).
    replay = _audit("replay", "--all", "--json")
    assert replay.exit_code not in (0, 1), (replay.exit_code, replay.output)  # an error
    assert "log-inconsistent" in replay.output, replay.output
    assert "do not hash to the root its stored tree" in replay.output


def test_an_untouched_log_is_proved_against_every_checkpoint_it_has(h: Home) -> None:
    h.registry.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    h.registry.promote(Digest.parse(h.cert.kernel), "prod")
    size = len(_leaves(h.engine))
    (h.home / "log-checkpoint").write_text(DatabaseLogSource(h.engine, h.home).checkpoint())
    h.registry.revoke_certificate(h.cert.id, "bad")  # the log grows past the file
    state = _audit("state", "--database", h.url, "--json")
    assert state.exit_code == 0, state.output
    assert json.loads(state.stdout)["proved_against"] == [
        f"the log's signed checkpoint (size {size + 2})",
        f"the server's last signed checkpoint ({h.home / 'log-checkpoint'}) (size {size})",
    ]


def test_a_server_checkpoint_the_log_does_not_extend_is_named(h: Home) -> None:
    """The hook for the server's own last checkpoint (``KCERT_HOME/log-checkpoint``)."""
    size = len(_leaves(h.engine))
    other = Checkpoint(h.signer.name, size, bytes(32)).sign(h.signer)
    (h.home / "log-checkpoint").write_text(other)
    state = _audit("state", "--database", h.url, "--json")
    assert state.exit_code == 1, state.output
    (difference,) = json.loads(state.stdout)["differences"]
    assert difference["kind"] == "log"
    assert difference["message"] == (
        f"entry 0 is not the leaf the server's last signed checkpoint "
        f"({h.home / 'log-checkpoint'}) (size {size}) commits to"
    )
    forged = Checkpoint(h.signer.name, size, bytes(32)).sign(
        Signer(h.signer.name, Ed25519PrivateKey.generate())
    )
    (h.home / "log-checkpoint").write_text(forged)
    (difference,) = _check(h, [("the file", forged)]).differences
    assert difference.kind == "log" and "carries no signature by the pinned key" in str(
        difference.message
    )


# --- B9: token rows ----------------------------------------------------------------------


def test_token_rows_are_checked_against_their_leaves(h: Home) -> None:
    with write_session(h.engine) as s:
        reader = create_token(session=s, request=ApiTokenCreate(scopes=[Scope.GATE_READ]))
    with write_session(h.engine) as s:
        admin = create_token(
            session=s, request=ApiTokenCreate(scopes=[Scope.ADMIN], expires_in=3600)
        )
    with write_session(h.engine) as s:
        revoke_token(session=s, token_id=admin.id)
    with write_session(h.engine) as s:
        create_token(
            session=s,
            request=ApiTokenCreate(
                scopes=[Scope.PROMOTE, Scope.GATE_READ], expires_in=60
            ),  # fmt: skip
        )
    assert _check(h).consistent, _check(h).differences  # expiries agree on both databases

    later = datetime.now(UTC) + timedelta(days=3650)
    with h.engine.begin() as conn:
        conn.execute(text("UPDATE api_token SET scopes = :s, expires_at = :e WHERE id = :i"),
                     {"s": json.dumps(["admin"]), "e": later, "i": reader.id})  # fmt: skip
        conn.execute(text("UPDATE api_token SET revoked_at = NULL WHERE id = :i"), {"i": admin.id})
        hashes = [r[0] for r in conn.execute(text("SELECT token_hash FROM api_token"))]
    found = [(d.kind, d.subject, d.message) for d in _check(h).differences]
    assert sorted(found) == sorted(
        [
            (
                "token",
                admin.id,
                f"token {admin.id} is not revoked in the database, revoked in the log",
            ),
            (
                "token",
                reader.id,
                f"token {reader.id} scopes: database ['admin'], log ['gate:read']",
            ),
            (
                "token",
                reader.id,
                f"token {reader.id} expires at {later.isoformat()} in the database, "
                "never in the log",
            ),
        ]  # fmt: skip
    )
    shown = json.dumps(found)
    for secret in (reader.token, admin.token, *hashes):
        assert secret not in shown
    state = _audit("state", "--database", h.url)
    assert state.exit_code == 1
    assert f"token: token {reader.id} scopes" in state.stdout
    assert all(secret not in state.output for secret in (reader.token, admin.token, *hashes))


# --- B4 and B5: targets with their own drift fields --------------------------------------


def _drift_target(h: Home) -> dict[str, Any]:
    """A target with drift fields, the certificate promoted on it."""
    report = TargetCreate(
        hw_class="H100", environment=gpu_environment(), drift_fields=["driver_version", "gpu_name"]
    )
    h.registry.report_target("prod", report)
    h.registry.promote(Digest.parse(h.cert.kernel), "prod")
    granted = next(leaf for _, kind, leaf in _leaves(h.engine) if kind == audit.PROMOTION_GRANTED)
    payload: dict[str, Any] = json.loads(granted)["payload"]
    return payload


def test_replay_all_folds_a_target_with_its_own_drift_fields(h: Home) -> None:
    _drift_target(h)
    result = _audit("replay", "--all", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["same"] is True and body["decisions"] == 1
    assert body["differences"] == [] and body["unverified"] == []
    assert _check(h).consistent


def _forge_grant_after_drift(h: Home) -> int:
    """The target drifts (the promotion is suspended), then a grant is appended whose
    candidates' fingerprints are rewritten to the drifted target's."""
    payload = _drift_target(h)
    drifted = gpu_environment(driver_version="999.9")
    h.registry.report_target("prod", TargetCreate(
        hw_class="H100", environment=drifted, drift_fields=["driver_version", "gpu_name"]
    ))  # fmt: skip
    assert not h.registry.gate(Digest.parse(h.cert.kernel), "prod").allow
    reported = [leaf for _, kind, leaf in _leaves(h.engine) if kind == audit.FINGERPRINT_REPORTED]
    fingerprint = json.loads(reported[-1])["payload"]["fingerprint"]
    payload["inputs"]["target_fingerprint"] = fingerprint
    for candidate in payload["inputs"]["candidates"]:
        candidate["fingerprint"] = fingerprint
    with write_session(h.engine) as s:
        index = audit.record_event(s, audit.PROMOTION_GRANTED, payload)
        s.commit()
    return index


def test_a_forged_grant_is_different_with_envelopes_and_unverified_without(
    h: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    forged = _forge_grant_after_drift(h)
    seeing = _audit("replay", "--all", "--json")
    assert seeing.exit_code == 1, seeing.output
    body = json.loads(seeing.stdout)
    assert body["same"] is False
    assert any(
        d["index"] == forged and d["message"].startswith(f"candidate {h.cert.id} fingerprint")
        for d in body["differences"]
    ), body

    leaves = _leaves(h.engine)
    blind = replay_history([(i, leaf) for i, _, leaf in leaves])
    assert blind.same  # the leaf alone re-decides the same way...
    decisions = [i for i, kind, _ in leaves if kind.startswith("promotion.")]
    assert [d.index for d in blind.unverified] == [*decisions, forged]  # ...on trust
    assert "was taken from the entry" in blind.unverified[-2].message
    assert "is not checked" in blind.unverified[-1].message

    monkeypatch.setattr(audit_cmds, "_fetcher", lambda source: lambda cid: None)
    unverified = _audit("replay", "--all", "--json")
    assert unverified.exit_code == 1, unverified.output
    body = json.loads(unverified.stdout)
    assert body["same"] is True and body["differences"] == []
    assert forged in [u["index"] for u in body["unverified"]]
    text_out = _audit("replay", "--all")
    assert "SAME decisions as far as checked" in text_out.stdout
    assert f"unverified: entry {forged} (promotion.granted): certificate" in text_out.stdout
    assert _audit("replay", "--all", "--allow-unverified").exit_code == 0
    assert _audit("replay", "0", "--allow-unverified").exit_code == 2


def test_state_names_a_fingerprint_it_cannot_check_as_unverified(h: Home) -> None:
    _drift_target(h)
    with h.engine.begin() as conn:
        conn.execute(text("UPDATE certificate SET envelope = '{}'"))
    found = [(d.kind, d.subject) for d in _check(h).differences]
    assert found == [("unverified", "entry 3"), ("unverified", "entry 3")]
    assert "its envelope could not be read" in _check(h).differences[0].message

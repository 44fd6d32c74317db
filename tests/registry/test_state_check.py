"""``kcert audit state``: the registry's tables against the state its log folds to.

Every kind of out-of-band edit (a change written to the tables without its
leaf) must be named, by kind and subject; an untouched registry is consistent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, delete, update
from typer.testing import CliRunner

from kcert.attest.keys import generate_private_key, key_id, public_key_hex
from kcert.cli.app import app
from kcert.digest import Digest
from kcert.registry import audit
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.consistency import StateCheck, check_state
from kcert.registry.db import read_session, write_session
from kcert.registry.environment import target_fingerprint
from kcert.registry.models import (
    Certificate,
    Promotion,
    StaleCertificate,
    Target,
    TargetCreate,
    TrustedKey,
    TrustedKeyCreate,
)
from kcert.registry.testing import MadeCertificate, gpu_environment, make_certificate


@dataclass
class Story:
    """A registry that went through every kind of change the log records."""

    registry: EmbeddedRegistry
    kept: MadeCertificate
    revoked: MadeCertificate
    old_key: str


@pytest.fixture
def story(engine: Engine, database_url: str, signing_key: Ed25519PrivateKey) -> Story:
    reg = EmbeddedRegistry(Settings(database_url=database_url), engine=engine)
    reg.trust_key(trust("ci", signing_key))
    old = generate_private_key()
    reg.trust_key(trust("old", old))
    reg.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    kept, revoked = make_certificate(signing_key), make_certificate(signing_key)
    for cert in (kept, revoked, make_certificate(old)):
        reg.push(cert.envelope)
        reg.promote(Digest.parse(cert.kernel), "prod")
    reg.revoke_certificate(revoked.id, "bad")
    reg.revoke_key(key_id(old.public_key()), "retired")
    env = gpu_environment(driver_version="1.0")
    reg.report_target("staging", TargetCreate(hw_class="H100", environment=gpu_environment()))
    reg.report_target("staging", TargetCreate(hw_class="H100", environment=env))
    return Story(reg, kept, revoked, key_id(old.public_key()))


def trust(name: str, key: Ed25519PrivateKey) -> TrustedKeyCreate:
    return TrustedKeyCreate(name=name, public_key=public_key_hex(key.public_key()))


def check(engine: Engine) -> StateCheck:
    with read_session(engine) as session:
        return check_state(session=session)


def test_a_registry_changed_only_through_its_library_is_what_its_log_says(
    story: Story, engine: Engine
) -> None:
    result = check(engine)
    assert result.consistent, result.differences
    assert result.decisions == 5  # three grants, two suspensions
    assert result.entries > 10


def _key(s: Story) -> object:
    return update(TrustedKey).where(TrustedKey.keyid == s.old_key).values(revoked_at=None)


def _revocation(s: Story) -> object:
    return update(Certificate).where(Certificate.id == s.revoked.id).values(revoked_at=None)


def _target(s: Story) -> object:
    return update(Target).where(Target.name == "prod").values(fingerprint="sha256:" + "0" * 64)


def _promotion(s: Story) -> object:
    return update(Promotion).where(Promotion.kernel == s.revoked.kernel).values(status="active")


def _stale(s: Story) -> object:
    return delete(StaleCertificate).where(StaleCertificate.target_name == "staging")


def _certificate(s: Story) -> object:
    return update(Certificate).where(Certificate.id == s.kept.id).values(verdict="fail")


EDITS: dict[str, tuple[Callable[[Story], object], Callable[[Story], str]]] = {
    "key": (_key, lambda s: f"key {s.old_key} is not revoked in the database, revoked in the log"),
    "revocation": (
        _revocation,
        lambda s: f"certificate {s.revoked.id} is not revoked in the database, revoked in the log",
    ),
    "target": (
        _target,
        lambda s: (
            f"target 'prod' fingerprint: database 'sha256:{'0' * 64}', log "
            f"'{target_fingerprint(gpu_environment(), None)}'"
        ),
    ),
    "promotion": (
        _promotion,
        lambda s: (
            f"promotion of {s.revoked.kernel} on 'prod' is active in the database, "
            "suspended in the log"
        ),
    ),
    "stale": (
        _stale,
        lambda s: (
            f"certificate {s.kept.id} is stale for 'staging' from generation 2 in the log, "
            "not in the database"
        ),
    ),
    "certificate": (
        _certificate,
        lambda s: f"certificate {s.kept.id} verdict: database 'fail', log 'pass'",
    ),
}


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_an_edit_outside_the_log_is_named(story: Story, engine: Engine, kind: str) -> None:
    edit, message = EDITS[kind]
    with engine.begin() as connection:
        connection.execute(edit(story))  # type: ignore[call-overload]
    result = check(engine)
    assert [(d.kind, d.message) for d in result.differences] == [(kind, message(story))]


def test_a_decision_that_does_not_follow_from_the_log_is_named(
    story: Story, engine: Engine
) -> None:
    with read_session(engine) as session:
        leaves = [json.loads(r.leaf) for r in audit.read_entries(session, 0, 1000)]
    granted = next(
        leaf
        for leaf in leaves
        if leaf["kind"] == audit.PROMOTION_GRANTED
        and leaf["payload"]["inputs"]["kernel"] == story.revoked.kernel
    )
    # The same grant logged again after the certificate's revocation: the race's leaf.
    with write_session(engine) as session:
        index = audit.record_event(session, audit.PROMOTION_GRANTED, granted["payload"])
        session.commit()
    differences = check(engine).differences
    history = [d.message for d in differences if d.kind == "history"]
    assert (
        f"entry {index} (promotion.granted): revoked_certificates: recorded [], the log's "
        f"history gives ['{story.revoked.id}']" in history
    )
    # The log now says the promotion is active again; the table (rightly) does not.
    assert [d.kind for d in differences if d.kind != "history"] == ["promotion"]


def test_the_cli_exits_0_consistent_1_different_2_unreachable(
    story: Story, engine: Engine, database_url: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    env = {"KCERT_HOME": str(tmp_path)}
    ok = runner.invoke(app, ["audit", "state", "--database", database_url, "--json"], env=env)
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["consistent"] is True
    with engine.begin() as connection:
        connection.execute(_revocation(story))  # type: ignore[call-overload]
    bad = runner.invoke(app, ["audit", "state", "--database", database_url], env=env)
    assert bad.exit_code == 1
    assert f"revocation: certificate {story.revoked.id} is not revoked" in bad.stdout
    missing = runner.invoke(
        app, ["audit", "state", "--database", f"sqlite:///{tmp_path}/none.db"], env=env
    )
    assert missing.exit_code == 2
    assert "no registry database" in missing.output

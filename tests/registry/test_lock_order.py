"""Writers racing each other on one registry (issue 14, findings 2 and 3).

A promotion racing the revocation of its certificate must not stay active on
the revoked certificate, and drift reports, revocations, promotions and key
changes from many threads must neither deadlock nor fail. Each test checks the
end state, the gate, and that the log's decisions agree with the log's own
history (every leaf folded in order).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine
from sqlmodel import select

from kcert.attest.keys import generate_private_key, key_id, public_key_hex
from kcert.digest import Digest
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.db import read_session
from kcert.registry.errors import PromotionDenied
from kcert.registry.history import replay_history
from kcert.registry.log_models import LogEntry
from kcert.registry.models import Certificate, Promotion, TargetCreate, TrustedKeyCreate
from kcert.registry.testing import MadeCertificate, gpu_environment, make_certificate

THREADS = 8


@pytest.fixture
def registry(engine: Engine, database_url: str, signing_key: Ed25519PrivateKey) -> EmbeddedRegistry:
    reg = EmbeddedRegistry(Settings(database_url=database_url), engine=engine)
    reg.trust_key(trust("ci", signing_key))
    reg.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    return reg


def run_all(jobs: list[Callable[[], object]]) -> list[BaseException]:
    """Run ``jobs`` on :data:`THREADS` threads; every exception any of them raised."""
    failures: list[BaseException] = []
    lock = threading.Lock()

    def guarded(job: Callable[[], object]) -> None:
        try:
            job()
        except PromotionDenied:
            pass  # a decision, not a failure
        except Exception as exc:  # noqa: BLE001 - collected and asserted on below
            with lock:
                failures.append(exc)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for future in [pool.submit(guarded, job) for job in jobs]:
            future.result(timeout=60)
    return failures


def leaves(engine: Engine) -> list[tuple[int, bytes]]:
    with read_session(engine) as session:
        rows = session.exec(select(LogEntry.leaf_index, LogEntry.leaf)).all()
    return sorted((int(i), bytes(leaf)) for i, leaf in rows)


def active_on_revoked(engine: Engine) -> list[str]:
    """Active promotions whose certificate is revoked."""
    with read_session(engine) as session:
        rows = session.exec(
            select(Promotion.kernel)
            .join(Certificate, Certificate.id == Promotion.certificate_id)  # type: ignore[arg-type]
            .where(Promotion.status == "active", Certificate.revoked_at.is_not(None))  # type: ignore[union-attr]
        ).all()
    return list(rows)


def assert_active_means_allowed(registry: EmbeddedRegistry, kernels: list[str]) -> None:
    """A promotion is active exactly when the gate allows: none rests on an invalid certificate."""
    with read_session(registry.engine) as session:
        active = set(session.exec(select(Promotion.kernel).where(Promotion.status == "active")))
    allowed = {k for k in kernels if registry.gate(Digest.parse(k), "prod").allow}
    assert active == allowed


def assert_history_agrees(engine: Engine) -> int:
    """Every decision leaf replays to the same decision from the log's own history."""
    result = replay_history(leaves(engine))
    assert result.differences == [], result.differences[:5]
    return result.decisions


def test_promotion_racing_revocation_never_stays_active_on_the_revoked_certificate(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    certs = [make_certificate(signing_key) for _ in range(24)]
    for cert in certs:
        registry.push(cert.envelope)
    jobs: list[Callable[[], object]] = []
    for cert in certs:
        jobs.append(partial(registry.promote, Digest.parse(cert.kernel), "prod"))
        jobs.append(partial(registry.revoke_certificate, cert.id, "race"))
    failures = run_all(jobs)
    assert active_on_revoked(engine) == []
    assert failures == [], [f"{type(f).__name__}: {f}" for f in failures[:3]]
    for cert in certs:
        assert not registry.gate(Digest.parse(cert.kernel), "prod").allow
    assert_active_means_allowed(registry, [c.kernel for c in certs])
    assert assert_history_agrees(engine) >= len(certs)


def test_drift_revocation_promotion_and_key_changes_never_deadlock(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    other_keys = [generate_private_key() for _ in range(4)]
    for i, key in enumerate(other_keys):
        registry.trust_key(trust(f"k{i}", key))
    certs: list[MadeCertificate] = [make_certificate(signing_key) for _ in range(16)]
    certs += [make_certificate(key) for key in other_keys for _ in range(2)]
    for cert in certs:
        registry.push(cert.envelope)
        registry.promote(Digest.parse(cert.kernel), "prod")
    reports = [
        TargetCreate(hw_class="H100", environment=gpu_environment()),
        TargetCreate(hw_class="H100", environment=gpu_environment(driver_version="999.1")),
    ]
    jobs: list[Callable[[], object]] = []
    for i, cert in enumerate(certs):
        jobs.append(partial(registry.report_target, "prod", reports[(i + 1) % 2]))
        if i % 2 == 0:
            jobs.append(partial(registry.revoke_certificate, cert.id, "storm"))
        jobs.append(partial(registry.promote, Digest.parse(cert.kernel), "prod"))
        if i < len(other_keys):
            jobs.append(partial(registry.revoke_key, key_id(other_keys[i].public_key()), "storm"))
            jobs.append(partial(registry.trust_key, trust(f"new{i}", generate_private_key())))
    failures = run_all(jobs)
    assert active_on_revoked(engine) == []
    assert failures == [], [f"{type(f).__name__}: {f}" for f in failures[:3]]
    assert_active_means_allowed(registry, [c.kernel for c in certs])
    assert assert_history_agrees(engine) > 0


def trust(name: str, key: Ed25519PrivateKey) -> TrustedKeyCreate:
    return TrustedKeyCreate(name=name, public_key=public_key_hex(key.public_key()))

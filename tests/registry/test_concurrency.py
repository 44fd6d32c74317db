"""Writers from several threads at once: no lost update, no torn state, no gaps in the log."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine
from sqlmodel import col, select

from kcert.attest.keys import public_key_hex
from kcert.digest import Digest
from kcert.registry.client import EmbeddedRegistry
from kcert.registry.config import Settings
from kcert.registry.db import read_session
from kcert.registry.errors import PromotionDenied
from kcert.registry.log_models import LogEntry
from kcert.registry.models import Promotion, TargetCreate, TargetHistory, TrustedKeyCreate
from kcert.registry.testing import gpu_environment, make_certificate

THREADS = 6
T = TypeVar("T")


@pytest.fixture
def registry(engine: Engine, database_url: str, signing_key: Ed25519PrivateKey) -> EmbeddedRegistry:
    reg = EmbeddedRegistry(Settings(database_url=database_url), engine=engine)
    reg.trust_key(TrustedKeyCreate(name="ci", public_key=public_key_hex(signing_key.public_key())))
    return reg


def in_threads(jobs: list[Callable[[], T]]) -> list[T]:
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [f.result(timeout=120) for f in futures]


def leaf_indices(engine: Engine) -> list[int]:
    with read_session(engine) as session:
        return list(
            session.exec(select(LogEntry.leaf_index).order_by(col(LogEntry.leaf_index))).all()
        )


def test_concurrent_drift_reports_are_all_kept_in_order(
    registry: EmbeddedRegistry, engine: Engine
) -> None:
    registry.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    drivers = [f"600.{i}" for i in range(THREADS * 2)]
    results = in_threads(
        [
            lambda d=d: registry.report_target(  # type: ignore[misc]
                "prod",
                TargetCreate(hw_class="H100", environment=gpu_environment(driver_version=d)),
            )
            for d in drivers
        ]
    )
    assert all(r.changed for r in results)
    # Every report got its own generation: none was computed from a stale read.
    assert sorted(r.generation for r in results) == list(range(2, len(drivers) + 2))
    with read_session(engine) as session:
        history = session.exec(select(TargetHistory).order_by(col(TargetHistory.id))).all()
    assert [h.generation for h in history] == list(range(1, len(drivers) + 2))
    final = registry.get_target("prod")
    assert final.generation == len(drivers) + 1
    assert final.fingerprint == history[-1].fingerprint
    assert leaf_indices(engine) == list(range(len(leaf_indices(engine))))


def test_concurrent_promotions_are_all_granted_and_logged(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    registry.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    certs = [make_certificate(signing_key) for _ in range(THREADS * 2)]
    in_threads([lambda c=c: registry.push(c.envelope) for c in certs])  # type: ignore[misc]
    promoted = in_threads(
        [lambda c=c: registry.promote(Digest.parse(c.kernel), "prod") for c in certs]  # type: ignore[misc]
    )
    assert {p.kernel for p in promoted} == {c.kernel for c in certs}
    log_indices = [p.log_index for p in promoted]
    assert len(set(log_indices)) == len(certs)
    with read_session(engine) as session:
        rows = session.exec(select(Promotion)).all()
    assert len(rows) == len(certs) and all(r.status == "active" for r in rows)
    assert leaf_indices(engine) == list(range(len(leaf_indices(engine))))


def test_the_same_promotion_from_many_threads_makes_one_row(
    registry: EmbeddedRegistry, engine: Engine, signing_key: Ed25519PrivateKey
) -> None:
    registry.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    cert = make_certificate(signing_key)
    stored = in_threads([lambda: registry.push(cert.envelope) for _ in range(THREADS)])
    assert sum(s.created for s in stored) == 1
    kernel = Digest.parse(cert.kernel)
    in_threads([lambda: registry.promote(kernel, "prod") for _ in range(THREADS)])
    with read_session(engine) as session:
        rows = session.exec(select(Promotion)).all()
    assert len(rows) == 1


def test_promotions_racing_drift_never_leave_an_active_promotion_on_a_stale_certificate(
    registry: EmbeddedRegistry, signing_key: Ed25519PrivateKey
) -> None:
    """Each promotion either lands before a drift (and is suspended by it) or after
    (and is denied): the gate and the promotion table must agree at the end."""
    registry.report_target("prod", TargetCreate(hw_class="H100", environment=gpu_environment()))
    certs = [make_certificate(signing_key) for _ in range(THREADS * 2)]
    for cert in certs:
        registry.push(cert.envelope)

    def promote(kernel: str) -> str:
        try:
            return registry.promote(Digest.parse(kernel), "prod").status
        except PromotionDenied:
            return "denied"

    def drift(i: int) -> str:
        env = gpu_environment(driver_version=f"700.{i}")
        registry.report_target("prod", TargetCreate(hw_class="H100", environment=env))
        return "drift"

    jobs: list[Callable[[], str]] = []
    for i, cert in enumerate(certs):
        jobs.append(lambda k=cert.kernel: promote(k))  # type: ignore[misc]
        if i % 4 == 3:
            jobs.append(lambda i=i: drift(i))  # type: ignore[misc]
    in_threads(jobs)
    # Every certificate was made for the first environment, which is gone: nothing may pass.
    for cert in certs:
        assert not registry.gate(Digest.parse(cert.kernel), "prod").allow
    with read_session(registry.engine) as session:
        active = session.exec(select(Promotion).where(Promotion.status == "active")).all()
    assert active == []

"""Seeding for ``bench/gate.py``: a registry of real certificates, cached between runs.

:class:`Plan` names every kernel, target and gate query from two numbers.
:func:`seed` fills a migrated database through the registry's own library
(every certificate signed by :mod:`kcert.attest`, verified and stored with its
audit-log leaf by :func:`kcert.registry.certificates.store_certificate`).
Because that takes minutes for 10,000 certificates, :func:`sqlite_database`
and :func:`postgres_database` seed once into a cache (a SQLite file, a
PostgreSQL template database) and hand each run a fresh copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Bump when the seeded content changes, so stale caches are not reused.
SEED_VERSION = 1
HARDWARE = (
    ("H100", "NVIDIA H100 80GB HBM3", "9.0"),
    ("A100", "NVIDIA A100-SXM4-80GB", "8.0"),
    ("L40S", "NVIDIA L40S", "8.9"),
    ("H200", "NVIDIA H200", "9.0"),
)
CERTS_PER_KERNEL = 4


@dataclass(frozen=True, slots=True)
class Plan:
    """What to seed; every name and digest follows from these numbers."""

    certificates: int
    targets: int

    @property
    def kernels(self) -> int:
        return self.certificates // CERTS_PER_KERNEL

    def target_name(self, t: int) -> str:
        return f"fleet-{t:03d}"

    def target(self, t: int) -> tuple[str, dict[str, Any]]:
        from kcert.registry.testing import gpu_environment

        hw, gpu, cc = HARDWARE[t % len(HARDWARE)]
        env = gpu_environment(
            gpu_name=gpu, compute_capability=cc, driver_version=f"580.{t // len(HARDWARE)}.0"
        )
        return hw, env

    def certified_on(self, k: int) -> list[int]:
        """The targets whose environment kernel ``k`` was certified in (first: promoted one)."""
        step = max(1, self.targets // CERTS_PER_KERNEL)
        return [(k + j * step) % self.targets for j in range(CERTS_PER_KERNEL)]

    @staticmethod
    def source(k: int) -> str:
        return f"bench kernel {k}"

    @staticmethod
    def kernel_digest(k: int) -> str:
        return "sha256:" + hashlib.sha256(Plan.source(k).encode()).hexdigest()

    def cache_key(self) -> str:
        from alembic.script import ScriptDirectory

        from kcert.registry.db import alembic_config

        heads = sorted(ScriptDirectory.from_config(alembic_config()).get_heads())
        text = json.dumps([SEED_VERSION, self.certificates, self.targets, heads])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def queries(self, count: int = 2000) -> list[str]:
        """Gate paths: half allow, a quarter deny (not promoted), a quarter deny (no match)."""
        rng = random.Random(7)
        paths = []
        for i in range(count):
            k = rng.randrange(self.kernels)
            on = self.certified_on(k)
            if i % 4 < 2:
                t = on[0]
            elif i % 4 == 2:
                t = on[1]
            else:
                t = next(x for x in range(self.targets) if x not in on)
            paths.append(self.gate_path(k, t))
        return paths

    def gate_path(self, k: int, t: int) -> str:
        return f"/v1/gate?kernel={self.kernel_digest(k)}&target={self.target_name(t)}"

    def unseen_queries(self, rounds: int, *, per_round: int, seen: list[str]) -> list[list[str]]:
        """Per round, distinct gate paths asked in no other round and not in ``seen``.

        Every (kernel, target) pair at most once, so a server answering them
        computes every answer; most are denials, each after the kernel's
        certificates are read and the policy runs.
        """
        wanted = rounds * per_round
        skip = set(seen)
        order = list(range(self.kernels * self.targets))
        random.Random(11).shuffle(order)
        paths = (self.gate_path(pair // self.targets, pair % self.targets) for pair in order)
        chosen = [p for p in paths if p not in skip][:wanted]
        if len(chosen) < wanted:
            raise ValueError(
                f"{rounds} rounds of {per_round} unseen queries need {wanted} (kernel, target) "
                f"pairs besides the repeat mix; this plan has {len(chosen)}"
            )
        return [chosen[r * per_round : (r + 1) * per_round] for r in range(rounds)]


def _sign_chunk(args: tuple[bytes, Plan, list[tuple[int, int]]]) -> list[bytes]:
    """Sign the reports of (kernel, target) pairs; runs in a worker process."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kcert.attest.certificate import sign_report
    from kcert.registry.testing import make_report

    raw, plan, pairs = args
    key = Ed25519PrivateKey.from_private_bytes(raw)
    out = []
    for k, t in pairs:
        hw, env = plan.target(t)
        # One certificate in twenty fails a check: stored as evidence, never valid.
        failing = {"correctness": "2 of 9 probes fail"} if (k + t) % 20 == 19 else None
        report = make_report(source=plan.source(k), environment=env, hw_class=hw,
                             failing=failing, name=f"k{k}")  # fmt: skip
        out.append(sign_report(report, key).to_bytes())
    return out


def seed(url: str, plan: Plan, say: Any) -> None:
    """Fill the empty, migrated database at ``url`` following ``plan``."""
    from concurrent.futures import ProcessPoolExecutor

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kcert.attest.dsse import parse_envelope
    from kcert.attest.keys import public_key_hex
    from kcert.digest import Digest
    from kcert.registry import certificates, decisions, keys, targets
    from kcert.registry.db import make_engine, migrate, write_session
    from kcert.registry.errors import PromotionDenied
    from kcert.registry.models import TargetCreate, TrustedKeyCreate

    engine = make_engine(url)
    migrate(engine)
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )  # fmt: skip
    started = time.perf_counter()
    with write_session(engine) as session:
        keys.trust_key(session=session, key=TrustedKeyCreate(
            name="bench-ci", public_key=public_key_hex(key.public_key())))  # fmt: skip
        for t in range(plan.targets):
            hw, env = plan.target(t)
            targets.report_target(session=session, name=plan.target_name(t),
                                  report=TargetCreate(hw_class=hw, environment=env))  # fmt: skip
    pairs = [(k, t) for k in range(plan.kernels) for t in plan.certified_on(k)]
    chunks = [pairs[i : i + 250] for i in range(0, len(pairs), 250)]
    stored = 0
    with ProcessPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1)) as pool:
        signed = pool.map(_sign_chunk, [(raw, plan, c) for c in chunks])
        with write_session(engine) as session:
            for chunk in signed:
                for data in chunk:
                    certificates.store_certificate(session=session, envelope=parse_envelope(data))
                    stored += 1
                say(f"  stored {stored}/{len(pairs)} certificates "
                    f"({time.perf_counter() - started:.0f} s)")  # fmt: skip
    granted = 0
    with write_session(engine) as session:
        for k in range(plan.kernels):
            try:
                decisions.promote(session=session, kernel=Digest.parse(plan.kernel_digest(k)),
                                  target=plan.target_name(plan.certified_on(k)[0]))  # fmt: skip
                granted += 1
            except PromotionDenied:
                session.rollback()
    engine.dispose()
    say(f"  {granted} promotions granted; seeded in {time.perf_counter() - started:.0f} s")


# ---------------------------------------------------------------------------- databases


@contextmanager
def sqlite_database(plan: Plan, cache: Path, work: Path, say: Any) -> Iterator[str]:
    """A fresh copy of the cached seeded SQLite database (seeded first when not cached)."""
    cache.mkdir(parents=True, exist_ok=True)
    cached = cache / f"gate-{plan.cache_key()}.db"
    if not cached.exists():
        say(f"seeding {plan.certificates} certificates into {cached} (once; then cached)")
        partial = cached.with_suffix(".partial")
        for leftover in cache.glob(partial.name + "*"):
            leftover.unlink()
        seed(f"sqlite:///{partial}", plan, say)
        # The engine was disposed, so the WAL is checkpointed into the file itself.
        partial.rename(cached)
    copy = work / "registry.db"
    shutil.copyfile(cached, copy)
    yield f"sqlite:///{copy}"


@contextmanager
def postgres_database(plan: Plan, server: str, say: Any) -> Iterator[str]:
    """A fresh database made from a cached, seeded template database on the server."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(server)
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    template = f"kcert_bench_gate_{plan.cache_key()}"
    name = f"kcert_bench_run_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": template}
            ).first()
            if exists is None:
                say(f"seeding {plan.certificates} certificates into database {template} "
                    "(once; then used as a template)")  # fmt: skip
                partial = template + "_partial"
                conn.execute(text(f'DROP DATABASE IF EXISTS "{partial}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{partial}"'))
                seed(base.set(database=partial).render_as_string(hide_password=False), plan, say)
                conn.execute(text(f'ALTER DATABASE "{partial}" RENAME TO "{template}"'))
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def make_gate_token(url: str) -> str:
    """A real ``gate:read`` token, looked up by hash on every request like a deploy's."""
    from kcert.registry import tokens
    from kcert.registry.db import make_engine, write_session
    from kcert.registry.models import ApiTokenCreate, Scope

    engine = make_engine(url)
    try:
        with write_session(engine) as session:
            made = tokens.create_token(session=session, request=ApiTokenCreate(
                scopes=[Scope.GATE_READ], description="bench/gate.py"))  # fmt: skip
    finally:
        engine.dispose()
    return made.token

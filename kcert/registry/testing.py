"""Helpers for tests and benchmarks of the registry: databases and real certificates.

Nothing here is used by the registry itself. Certificates are made the real
way (a :class:`~kcert.certify.report.CertificationReport` signed by
:func:`kcert.attest.certificate.sign_report`), never with a shortcut, so what
the registry accepts in tests is what it accepts in production. Databases are
fresh per test run: a SQLite file migrated once and copied, or a PostgreSQL
database with a random name that is dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from kcert.attest.certificate import certificate_id, sign_report
from kcert.attest.dsse import Envelope
from kcert.certify.environment import fingerprint
from kcert.certify.report import (
    CHECK_NAMES,
    CertificationReport,
    CheckResult,
    KernelIdentity,
    Status,
    TimingReport,
)
from kcert.digest import Digest
from kcert.registry.db import dispose_engines, make_engine, migrate

POSTGRES_URL_ENV = "KCERT_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


# --- certificates ---------------------------------------------------------------------------


def gpu_environment(**overrides: Any) -> dict[str, Any]:
    """A plausible H100 environment as ``kcert.certify.environment`` records one."""
    fields: dict[str, Any] = {
        "device_kind": "gpu",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
        "sm_count": 132,
        "memory_bytes": 85_045_231_616,
        "driver_version": "580.65.06",
        "cuda_driver_api": "13.0",
        "cuda_runtime": "13.0",
        "nvrtc": "13.0",
        "cublas": "13.0.1",
        "cupy": "13.6.0",
        "numpy": "2.3.0",
        "triton": "3.5.0",
        "ecc": "enabled",
        "os": "Linux-6.8",
        "python": "CPython 3.11.7",
    }
    fields.update(overrides)
    return fields


def confinement_record(*, sandbox: bool = True, module_code: bool = False) -> dict[str, Any]:
    """A ``certifier.confinement`` record as the certifier writes one (``Confinement.to_json``)."""
    if not sandbox:
        return {"sandbox": False, "mechanism": "none (--no-sandbox: trusted code only)",
                "module_code": module_code, "limits": None,
                "notes": ["the kernel ran with the certifier's rights"]}  # fmt: skip
    return {"sandbox": True, "mechanism": "bubblewrap 0.11.0: user, PID, network, IPC and UTS "
            "namespaces; read-only system and Python; private /tmp", "module_code": module_code,
            "limits": {"address_space_bytes": None, "memory_bytes": 68_719_476_736,
                       "open_files": 1024, "processes": 512, "file_size_bytes": 2 << 30,
                       "cpu_seconds": 4 * 3600},
            "notes": ["address space not capped: CUDA reserves the device's virtual range"],
            }  # fmt: skip


@dataclass(frozen=True, slots=True)
class MadeCertificate:
    envelope: Envelope
    id: str
    kernel: str  # the source digest: what promotions and the gate name
    environment: Mapping[str, Any]


def make_report(
    *, source: str, environment: Mapping[str, Any], hw_class: str = "H100",
    failing: Mapping[str, str] | None = None, name: str = "saxpy", sandbox: bool | None = True,
    module_code: bool = False,
) -> CertificationReport:  # fmt: skip
    """A hand-built report for kernel ``source`` certified in ``environment``.

    ``sandbox`` False is a ``--no-sandbox`` certification; None a certifier from before
    the confinement record (no ``certifier.confinement`` at all).
    """
    failing = dict(failing or {})

    def digest(text_: str) -> str:
        return str(Digest.of_bytes(text_.encode()))

    checks = tuple(
        CheckResult(
            name=check,
            status=Status.FAIL if check in failing else Status.PASS,
            message=failing.get(check, "ok"),
            probe="n=33" if check in failing else None,
        )
        for check in CHECK_NAMES
    )
    return CertificationReport(
        kernel=KernelIdentity(
            name=name,
            entry=name,
            language="triton",
            source_name=f"{name}.py",
            source_digest=digest(source),
            spec_digest=digest("spec"),
            reference_digest=digest("reference"),
            build=None,
        ),  # fmt: skip
        executor="triton" if hw_class != "cpu" else "triton-interpreter",
        hw_class=hw_class,
        environment=dict(environment),
        fingerprint=str(fingerprint(environment)),
        fresh_seed=424242,
        probes=(),
        checks=checks,
        timing=TimingReport(
            method="skipped",
            kernel=None,
            baseline=None,
            speedup=None,
            lower_bound_ms=None,
            skipped_reason="hand-built test report",
        ),  # fmt: skip
        minimized={c: {"n": 33} for c in failing},
        certifier_version="0.1.0",
        issued_at="2026-11-22T09:00:00Z",
        confinement=(
            None
            if sandbox is None
            else confinement_record(sandbox=sandbox, module_code=module_code)
        ),  # fmt: skip
    )


def make_certificate(
    key: Ed25519PrivateKey, *, source: str | None = None,
    environment: Mapping[str, Any] | None = None, hw_class: str = "H100",
    failing: Mapping[str, str] | None = None, sandbox: bool | None = True,
    module_code: bool = False,
) -> MadeCertificate:  # fmt: skip
    """Sign a hand-built report with ``key``; a random kernel source unless one is given.

    ``sandbox`` and ``module_code`` as in :func:`make_report`.
    """
    source = source if source is not None else f"kernel {secrets.token_hex(8)}"
    environment = environment if environment is not None else gpu_environment()
    report = make_report(
        source=source, environment=environment, hw_class=hw_class, failing=failing,
        sandbox=sandbox, module_code=module_code,
    )  # fmt: skip
    envelope = sign_report(report, key)
    return MadeCertificate(
        envelope=envelope,
        id=str(certificate_id(envelope)),
        kernel=report.kernel.source_digest,
        environment=environment,
    )


# --- databases ------------------------------------------------------------------------------


class SqliteTemplate:
    """A SQLite database migrated once; each test gets a copy (much faster than migrating)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "template.db"
        engine = make_engine(f"sqlite:///{self.path}")
        try:
            migrate(engine)
        finally:
            # Closing the last connection checkpoints the WAL into the file we copy.
            engine.dispose()

    def fresh(self, directory: Path) -> str:
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"registry-{secrets.token_hex(4)}.db"
        shutil.copyfile(self.path, target)
        return f"sqlite:///{target}"


def postgres_server_url() -> str:
    return os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)


def postgres_reachable(url: str | None = None) -> str | None:
    """``None`` when the server answers, else why not (for a skip reason)."""
    engine = create_engine(url or postgres_server_url(), pool_pre_ping=False)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        return (
            f"PostgreSQL at {make_url(url or postgres_server_url()).render_as_string()} "
            f"is unreachable: {type(exc.orig).__name__}"
        )
    finally:
        engine.dispose()
    return None


class PostgresTemplate:
    """A migrated PostgreSQL database used as ``TEMPLATE`` for one fresh database per test.

    Every name is random, so parallel and earlier runs never collide; all of
    them are dropped by :meth:`close` (and by each :meth:`fresh` context).
    """

    def __init__(self, server_url: str | None = None) -> None:
        self.base = make_url(server_url or postgres_server_url())
        self.admin = create_engine(self.base, isolation_level="AUTOCOMMIT")
        self.name = f"kcert_tpl_{secrets.token_hex(6)}"
        self._execute(f'CREATE DATABASE "{self.name}"')
        engine = make_engine(self.url(self.name))
        try:
            migrate(engine)
        finally:
            engine.dispose()

    def url(self, database: str) -> str:
        return self.base.set(database=database).render_as_string(hide_password=False)

    def _execute(self, sql: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(sql))

    @contextmanager
    def fresh(self) -> Iterator[str]:
        name = f"kcert_test_{secrets.token_hex(6)}"
        self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.name}"')
        try:
            yield self.url(name)
        finally:
            dispose_engines()
            self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.admin.dispose()


@contextmanager
def postgres_database(server_url: str | None = None) -> Iterator[str]:
    """A new, empty database with a random name on the server; dropped on exit."""
    base = make_url(server_url or postgres_server_url())
    name = f"kcert_test_{secrets.token_hex(6)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        dispose_engines()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

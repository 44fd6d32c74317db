"""Whole-registry consistency checks shared by the crash and concurrency tests.

:func:`check_consistent` reads the database behind a server and its public
log, and says what does not hold: a certificate without its
``certificate.stored`` leaf (or a leaf without its certificate), a subject row
without a certificate, a gap in the log's indices, a promotion whose
recorded decision is not where it says, a stale mark without its leaf, and
finally a log that does not verify against its signed checkpoint.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reliability_server import RegistryServer
from sqlalchemy import create_engine, text

from kcert.log.monitor import AuditResult, audit_log
from kcert.log.source import HttpLogSource
from kcert.registry.audit import log_signer


@dataclass
class Acknowledged:
    """What the server said it did (a 2xx answer): each must be in the final state."""

    certificates: set[str] = field(default_factory=set)
    #: (kernel, target, log index) of each granted promotion.
    promotions: list[tuple[str, str, int]] = field(default_factory=list)
    #: log index of each denied promotion (the 409 problem names it).
    denials: list[int] = field(default_factory=list)
    #: (target, generation) of each acknowledged report.
    reports: list[tuple[str, int]] = field(default_factory=list)


def _rows(url: str, sql: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql)).all())
    finally:
        engine.dispose()


def leaves(url: str) -> dict[int, dict[str, Any]]:
    """Every leaf, parsed, by index."""
    return {
        int(i): json.loads(bytes(leaf))
        for i, leaf in _rows(url, "SELECT leaf_index, leaf FROM log_entry")
    }


def _grant(leaf: dict[str, Any] | None, kernel: str, target: str) -> bool:
    """Whether ``leaf`` is the grant of ``kernel`` to ``target``."""
    if leaf is None or leaf["kind"] != "promotion.granted":
        return False
    inputs = leaf["payload"]["inputs"]
    return bool(inputs["kernel"] == kernel and inputs["target"] == target)


def check_consistent(server: RegistryServer, acked: Acknowledged,
                     previous: list[tuple[str, str]] | None = None) -> AuditResult:  # fmt: skip
    """Assert the database behind ``server`` is whole and its log verifies; return the audit."""
    url = server.database_url
    problems: list[str] = []
    if url.startswith("sqlite"):
        (check,) = _rows(url, "PRAGMA integrity_check")
        if check[0] != "ok":
            problems.append(f"SQLite integrity_check: {check[0]}")
    log = leaves(url)
    (size,) = _rows(url, "SELECT size FROM log_state")[0]
    if sorted(log) != list(range(size)):
        problems.append(f"log_state.size is {size} but the entries are {sorted(log)[:5]}...")
    for i, leaf in log.items():
        if leaf.get("index") != i:
            problems.append(f"leaf {i} says it is index {leaf.get('index')}")
    kinds = Counter(leaf["kind"] for leaf in log.values())

    certs = {row[0] for row in _rows(url, "SELECT id FROM certificate")}
    stored = [leaf["payload"]["certificate"] for leaf in log.values()
              if leaf["kind"] == "certificate.stored"]  # fmt: skip
    if len(stored) != len(set(stored)):
        problems.append("a certificate was logged as stored twice")
    if set(stored) != certs:
        problems.append(f"certificates without a leaf: {sorted(certs - set(stored))}; "
                        f"leaves without a certificate: {sorted(set(stored) - certs)}")  # fmt: skip
    subjects = _rows(url, "SELECT certificate_id FROM certificate_subject")
    if {s[0] for s in subjects} - certs:
        problems.append("subject rows name certificates that are not stored")
    if bare := certs - {s[0] for s in subjects}:
        problems.append(f"certificates without subject rows: {sorted(bare)}")
    if missing := acked.certificates - certs:
        problems.append(f"acknowledged certificates lost: {sorted(missing)}")

    for kernel, target, index in acked.promotions:
        if not _grant(log.get(index), kernel, target):
            problems.append(f"granted promotion of {kernel} to {target} is not leaf {index}")
    for index in acked.denials:
        if log.get(index, {}).get("kind") != "promotion.denied":
            problems.append(f"denied promotion at leaf {index} is not in the log")
    for kernel, target, status, log_index in _rows(
        url, "SELECT kernel, target_name, status, log_index FROM promotion"
    ):
        if log_index is None or not _grant(log.get(log_index), kernel, target):
            problems.append(f"promotion row {kernel}/{target} ({status}) has no grant leaf")
    suspended = _rows(url, "SELECT count(*) FROM promotion WHERE status = 'suspended'")[0][0]
    if suspended > kinds["promotion.suspended"]:
        problems.append(f"{suspended} suspended promotions, "
                        f"{kinds['promotion.suspended']} suspension leaves")  # fmt: skip
    stale = _rows(url, "SELECT count(*) FROM stale_certificate")[0][0]
    if stale != kinds["certificate.invalidated"]:
        problems.append(
            f"{stale} stale marks, {kinds['certificate.invalidated']} invalidation leaves"
        )
    latest = dict(_rows(url, "SELECT target_name, max(generation) FROM target_history "
                             "GROUP BY target_name"))  # fmt: skip
    for name, generation in _rows(url, "SELECT name, generation FROM target"):
        if latest.get(name) != generation:
            problems.append(f"target {name} is at generation {generation}, "
                            f"its history at {latest.get(name)}")  # fmt: skip
    generations = dict(_rows(url, "SELECT name, generation FROM target"))
    for target, generation in acked.reports:
        if generations.get(target, 0) < generation:
            problems.append(f"acknowledged report of {target} (generation {generation}) lost")

    source = HttpLogSource(server.url)
    try:
        result = audit_log(source, log_signer(server.home).verifier, previous=previous or ())
    finally:
        source.close()
    if not result.ok:
        problems.append(f"the log does not verify: {[f.message for f in result.findings]}")
    if previous and len(result.consistent_with) != len(previous):
        problems.append("the log is not consistent with a checkpoint served before")
    assert not problems, "\n".join(problems)
    return result

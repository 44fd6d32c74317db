"""Where a guard's observations go: a window's report, and the reporters that send it.

A guard cuts its counts into windows (``flush_every_s`` of its reporter) and
hands each window's :class:`ObservationReport` to a :class:`Reporter`, on its
worker thread. :class:`HttpReporter` posts them to a registry as
``POST /v1/observations`` (the README's "After promotion" section shows the body): at most
:data:`MAX_REPORTS` reports per request and :data:`MAX_MISMATCHES` mismatches
per report, as the route requires. A failed post is retried a bounded number of
times (connection errors, 429 and 5xx) and the reports are kept for the next
flush up to a bound; nothing a registry does raises into the guard, and the
token is never logged. :class:`ListReporter` keeps reports in memory (tests,
or a process that ships them itself).

JSON has no NaN or Inf; a non-finite ``max_error`` or ``max_ratio`` (a kernel
that wrote NaN) is written as the string ``"inf"`` or ``"nan"``, as the
certificate's error metrics are.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

from kcert.guard.check import Mismatch
from kcert.guard.latency import LatencyHistogram

log = logging.getLogger("kcert.guard")

MAX_REPORTS = 100
MAX_MISMATCHES = 100
#: Reports a reporter keeps while its registry is unreachable; older ones are dropped.
MAX_PENDING = 1000


@dataclass(frozen=True, slots=True)
class ObservationReport:
    """One guard's counts over one window."""

    kernel: str  # sha256:<hex> of the kernel source
    certificate: str  # the certificate id
    start: str
    end: str
    calls_seen: int
    calls_checked: int
    dropped: int
    out_of_scope: int
    latency: LatencyHistogram
    mismatches: tuple[Mismatch, ...] = field(default_factory=tuple)

    def to_json(self, *, target: str, max_evidence_bytes: int) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "target": target, "certificate": self.certificate,
            "window": {"start": self.start, "end": self.end},
            "calls_seen": self.calls_seen, "calls_checked": self.calls_checked,
            "dropped": self.dropped, "out_of_scope": self.out_of_scope,
            "latency": self.latency.to_json(),
            "mismatches": [mismatch_json(m, max_evidence_bytes)
                           for m in self.mismatches[:MAX_MISMATCHES]],
        }  # fmt: skip


def mismatch_json(m: Mismatch, max_evidence_bytes: int) -> dict[str, Any]:
    evidence: dict[str, Any] | None = None
    if m.evidence is not None and sum(v.nbytes for v in m.evidence.values()) <= max_evidence_bytes:
        evidence = {name: {"dtype": v.dtype.name, "shape": list(v.shape),
                           "data": base64.b64encode(v.tobytes(order="C")).decode("ascii")}
                    for name, v in m.evidence.items()}  # fmt: skip
    return {
        "at": m.at, "dims": dict(m.dims), "inputs": dict(m.inputs), "outputs": dict(m.outputs),
        "reference": dict(m.reference), "max_error": _number(m.max_error),
        "max_ratio": _number(m.max_ratio), "in_scope": m.in_scope, "evidence": evidence,
    }  # fmt: skip


def _number(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


@runtime_checkable
class Reporter(Protocol):
    """Takes a guard's window reports; must never raise into the guard."""

    flush_every_s: float
    max_evidence_bytes: int

    def submit(self, report: ObservationReport) -> None: ...

    def flush(self) -> bool:
        """Send what is held now; True when nothing is left unsent."""
        ...

    def close(self) -> None: ...


class ListReporter:
    """Keeps every report in memory, in order."""

    def __init__(self, *, target: str = "local", flush_every_s: float = 5.0,
                 max_evidence_bytes: int = 1 << 20) -> None:  # fmt: skip
        self.target, self.flush_every_s = target, flush_every_s
        self.max_evidence_bytes = max_evidence_bytes
        self.reports: list[ObservationReport] = []
        self._lock = threading.Lock()

    def submit(self, report: ObservationReport) -> None:
        with self._lock:
            self.reports.append(report)

    def flush(self) -> bool:
        return True

    def close(self) -> None:
        return None

    def body(self) -> dict[str, Any]:
        """Every report so far as one ``POST /v1/observations`` body would carry them."""
        with self._lock:
            reports = list(self.reports)
        return {"reports": [r.to_json(target=self.target,
                                      max_evidence_bytes=self.max_evidence_bytes)
                            for r in reports]}  # fmt: skip


class HttpReporter:
    """Posts reports to a registry's ``/v1/observations`` with a bearer token."""

    def __init__(self, url: str, token: str, target: str, *, flush_every_s: float = 5.0,
                 max_evidence_bytes: int = 1 << 20, timeout_s: float = 10.0, retries: int = 3,
                 backoff_s: float = 0.5,
                 transport: httpx.BaseTransport | None = None) -> None:  # fmt: skip
        self.target, self.flush_every_s = target, flush_every_s
        self.max_evidence_bytes = max_evidence_bytes
        self.retries, self.backoff_s = retries, backoff_s
        self._client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s,
                                    transport=transport,
                                    headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        self._pending: list[ObservationReport] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.sent = 0
        self.rejected = 0
        self.dropped = 0

    def submit(self, report: ObservationReport) -> None:
        with self._lock:
            self._pending.append(report)
            excess = len(self._pending) - MAX_PENDING
            if excess > 0:
                del self._pending[:excess]
                self.dropped += excess

    def flush(self) -> bool:
        with self._send_lock:
            while True:
                with self._lock:
                    batch = self._pending[:MAX_REPORTS]
                    del self._pending[:MAX_REPORTS]
                if not batch:
                    return True
                if not self._post(batch):
                    with self._lock:  # keep them for the next flush, oldest first
                        self._pending[:0] = batch
                        excess = len(self._pending) - MAX_PENDING
                        if excess > 0:
                            del self._pending[:excess]
                            self.dropped += excess
                    return False

    def _post(self, batch: Sequence[ObservationReport]) -> bool:
        """Whether the batch is settled: accepted, or refused for good (counted, not retried)."""
        body = {"reports": [r.to_json(target=self.target,
                                      max_evidence_bytes=self.max_evidence_bytes)
                            for r in batch]}  # fmt: skip
        content = json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._client.post("/v1/observations", content=content, headers=headers)
            except httpx.HTTPError as exc:
                log.warning("kcert guard: posting observations failed: %s", type(exc).__name__)
                continue
            if response.status_code < 300:
                self.sent += len(batch)
                return True
            if response.status_code == 429 or response.status_code >= 500:
                log.warning("kcert guard: the registry answered %d", response.status_code)
                continue
            self.rejected += len(batch)
            log.error("kcert guard: the registry refused %d report(s): %d %s", len(batch),
                      response.status_code, _detail(response))  # fmt: skip
            return True
        return False

    def close(self) -> None:
        self._client.close()


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("detail", "")) if isinstance(body, Mapping) else ""

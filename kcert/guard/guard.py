"""The guard: wraps the callable that launches a certified kernel, checks samples off the hot path.

On the caller's thread each call costs: mapping its arguments onto the spec
(:mod:`kcert.guard.binding`), the sampler's decision (:mod:`kcert.guard.sampler`),
timing (:mod:`kcert.guard.latency`) and, for a sampled call only, copies of its
inputs before the call and of its outputs after it. The copies go to a bounded
queue; when it is full the sample is dropped and counted, never waited for.
One worker thread checks samples (:mod:`kcert.guard.check`), keeps the counts
of the current window and hands each window to the reporter
(:mod:`kcert.guard.report`). The caller always gets exactly what the wrapped
callable returned or raised; an error in the guard's own work is counted and
logged, never raised into the caller.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kcert.attest.certificate import CertificateContents
from kcert.attest.dsse import Envelope
from kcert.certify.spec import BufferArg, Intent, KernelSpec, load_spec
from kcert.errors import KcertError
from kcert.guard import arrays
from kcert.guard.binding import Adapter, BoundCall, CertifiedKernel
from kcert.guard.check import Checker, Mismatch, Sample
from kcert.guard.latency import Histogram, LatencyHistogram, Timer
from kcert.guard.report import MAX_MISMATCHES, ListReporter, ObservationReport, Reporter
from kcert.guard.sampler import Sampler

log = logging.getLogger("kcert.guard")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class GuardStats:
    """A guard's counts since it started."""

    calls_seen: int
    calls_sampled: int
    calls_checked: int
    mismatches: int
    out_of_scope: int
    dropped: int
    outliers: int
    check_errors: int
    latency: LatencyHistogram


class _Counts:
    def __init__(self) -> None:
        self.seen = self.sampled = self.checked = self.mismatches = 0
        self.out_of_scope = self.dropped = self.outliers = self.errors = 0


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


class Guard:
    """Samples and checks the calls of one certified kernel; see the module docstring."""

    def __init__(self, kernel: CertifiedKernel, *, sample_rate: float = 0.01,
                 queue_size: int = 64, seed: int | None = None,
                 reporter: Reporter | None = None,
                 adapter: Adapter | None = None) -> None:  # fmt: skip
        """``reporter`` belongs to the guard from now on: :meth:`close` closes it."""
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        self.kernel = kernel
        self.adapter = adapter
        self.reporter: Reporter = reporter if reporter is not None else ListReporter()
        self.sampler = Sampler(sample_rate, seed=seed)
        self.checker = Checker(kernel, evidence_cap=self.reporter.max_evidence_bytes)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._total, self._window = _Counts(), _Counts()
        self._latency = Histogram()
        self._timer = Timer(self._latency)
        self._mismatches: list[Mismatch] = []
        self._window_start = _now()
        self._closed = False
        self._inputs = [b for b in kernel.kernel.buffers if b.intent is not Intent.OUT]
        self._buffers = [(b.name, b.intent is not Intent.OUT) for b in kernel.kernel.buffers]
        self._outputs = kernel.kernel.outputs
        self._worker = threading.Thread(target=self._run, name="kcert-guard", daemon=True)
        self._worker.start()

    @classmethod
    def from_certificate(cls, certificate: str | Path | Envelope | CertificateContents,
                         spec: str | Path | KernelSpec, *,
                         kernel: str | Adapter | None = None,
                         key: str | Path | Ed25519PublicKey | None = None,
                         **options: Any) -> Guard:  # fmt: skip
        """A guard for ``certificate``'s kernel as ``spec`` describes it.

        ``kernel`` is the adapter from the guarded callable's arguments to the spec's
        (:mod:`kcert.guard.binding`; none: the callable takes the spec's arguments), or
        a name that picks the ``[[kernel]]`` of a spec file (by default the one the
        certificate names). With ``key`` (a public key or its file) the certificate's
        signature must verify with it. ``options`` go to :class:`Guard` (``sample_rate``,
        ``queue_size``, ``seed``, ``reporter``, ``adapter``).
        """
        if callable(kernel):
            options["adapter"] = kernel
            kernel = None
        if kernel is not None and not isinstance(spec, KernelSpec):
            spec = load_spec(Path(spec)).kernel(kernel)
        return cls(CertifiedKernel.load(certificate, spec, key=key), **options)

    # ------------------------------------------------------------------ the caller's side

    def wrap(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``fn`` guarded: same arguments, same result (NumPy, torch or CuPy arrays)."""

        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                bound, sampled, gpu = self._before(args, kwargs)
            except Exception:  # the guard's failure is never the caller's
                log.exception("kcert guard: could not look at a call")
                with self._lock:
                    self._total.errors += 1
                return fn(*args, **kwargs)
            started = self._timer.start(gpu)
            result = fn(*args, **kwargs)
            try:
                self._timer.stop(started)
                if sampled is not None:
                    self._after(bound, sampled, result)
            except Exception:
                log.exception("kcert guard: could not record a call")
                with self._lock:
                    self._total.errors += 1
            return result

        return guarded

    __call__ = wrap  # @guard

    def _before(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                ) -> tuple[BoundCall, dict[str, Any] | None, str | None]:  # fmt: skip
        bound = self.kernel.bind(args, kwargs, adapter=self.adapter)
        values = bound.values
        buffers = [(values[name], is_input) for name, is_input in self._buffers
                   if arrays.kind(values.get(name)) is not None]  # fmt: skip
        decision = self.sampler.decide(arrays.features(buffers) if buffers else None)
        gpu = next((arrays.kind(v) for v, _ in buffers if arrays.on_gpu(v)), None)
        with self._lock:
            for counts in (self._total, self._window):
                counts.seen += 1
                counts.out_of_scope += bool(bound.reasons)
                counts.outliers += decision.outlier
        # A call outside the certified scope is checked whatever the rate: the certificate
        # says nothing about it, so only the check can.
        if not (decision.sampled or bound.reasons) or bound.launch is None:
            return bound, None, gpu
        copies = {b.name: arrays.snapshot(values[b.name]) for b in self._inputs
                  if arrays.kind(values.get(b.name)) is not None}  # fmt: skip
        return bound, copies, gpu

    def _after(self, bound: BoundCall, inputs: dict[str, Any], result: Any) -> None:
        assert bound.launch is not None
        outputs = _outputs(self._outputs, bound.values, result)
        sample = Sample(_stamp(_now()), bound.dims, bound.launch, inputs, outputs, bound.reasons)
        with self._lock:
            self._total.sampled += 1
            self._window.sampled += 1
        try:
            self._queue.put_nowait(sample)
        except queue.Full:
            with self._lock:
                self._total.dropped += 1
                self._window.dropped += 1

    # ------------------------------------------------------------------ control

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Check what is queued and send the current window now; False if not done in time."""
        if self._closed:
            return True
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout_s)
        except queue.Full:
            return False
        return marker.done.wait(timeout_s)

    def stats(self) -> GuardStats:
        self._timer.poll()
        with self._lock:
            t = self._total
            return GuardStats(t.seen, t.sampled, t.checked, t.mismatches, t.out_of_scope,
                              t.dropped, t.outliers, t.errors, self._latency.since_start())

    def close(self, timeout_s: float = 10.0) -> None:
        """Send the last window and stop the worker (idempotent)."""
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            log.warning("kcert guard: the worker did not stop in time")
        self._worker.join(timeout_s)
        self.reporter.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the worker's side

    def _run(self) -> None:
        interval = max(0.05, float(self.reporter.flush_every_s))
        next_cut = time.monotonic() + interval
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, next_cut - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                if isinstance(item, Sample):
                    self._check(item)
                if isinstance(item, _Flush) or time.monotonic() >= next_cut or \
                        len(self._mismatches) >= MAX_MISMATCHES:  # fmt: skip
                    self._cut(wait=isinstance(item, _Flush))
                    next_cut = time.monotonic() + interval
            except Exception:  # the worker must outlive any one failure
                log.exception("kcert guard: the worker failed on one item")
            finally:
                if isinstance(item, _Flush):
                    item.done.set()

    def _check(self, sample: Sample) -> None:
        try:
            outcome = self.checker.check(sample)
        except Exception as exc:  # a reference that fails, a device error: counted and logged
            said = exc.diagnostics() if isinstance(exc, KcertError) else repr(exc)
            log.warning("kcert guard: checking a call of '%s' failed: %s",
                        self.kernel.kernel.name, said)
            with self._lock:
                self._total.errors += 1
            return
        with self._lock:
            for counts in (self._total, self._window):
                counts.checked += 1
                # shape reasons were counted when the call was seen; values only show here
                counts.out_of_scope += not outcome.in_scope and not sample.reasons
                counts.mismatches += outcome.mismatch is not None
            if outcome.mismatch is not None:
                self._mismatches.append(outcome.mismatch)
        if outcome.mismatch is not None:
            log.warning("kcert guard: '%s' mismatch at dims %s (max error %.3g, %.3g× allowed)%s",
                        self.kernel.kernel.name, dict(sample.dims), outcome.mismatch.max_error,
                        outcome.mismatch.max_ratio,
                        "" if outcome.in_scope else " outside the certified scope")  # fmt: skip

    def _cut(self, *, wait: bool) -> None:
        """End the current window: hand its report to the reporter, and send."""
        self._timer.poll(wait=wait)
        end = _now()
        with self._lock:
            w, self._window = self._window, _Counts()
            latency = self._latency.snapshot(reset=True)
            mismatches, self._mismatches = self._mismatches, []
            start, self._window_start = self._window_start, end
        if not w.seen and not mismatches:
            self.reporter.flush()  # nothing new, but an earlier window may wait to be sent
            return
        contents = self.kernel.contents
        report = ObservationReport(
            kernel=str(contents.source_digest), certificate=str(contents.id), start=_stamp(start),
            end=_stamp(end), calls_seen=w.seen, calls_checked=w.checked, dropped=w.dropped,
            out_of_scope=w.out_of_scope, latency=latency, mismatches=tuple(mismatches))  # fmt: skip
        try:
            self.reporter.submit(report)
            self.reporter.flush()
        except Exception:  # a reporter must not raise; if one does, the worker lives on
            log.exception("kcert guard: the reporter failed")


def _outputs(outputs: tuple[BufferArg, ...], values: Any, result: Any) -> dict[str, Any]:
    """Snapshots of the call's outputs: from the return value, else the buffers passed."""
    names = [out.name for out in outputs]
    if isinstance(result, dict):
        returned = {n: result[n] for n in names if n in result}
    elif isinstance(result, tuple | list):
        returned = dict(zip(names, result, strict=False))
    else:
        returned = {names[0]: result} if len(names) == 1 else {}
    got = {n: arrays.snapshot(v) for n, v in returned.items() if arrays.kind(v) is not None}
    for name in names:
        value = values.get(name)
        if name not in got and arrays.kind(value) is not None:
            got[name] = arrays.snapshot(value)
    return got


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")

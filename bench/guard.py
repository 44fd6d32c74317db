"""What does the guard cost the caller? A small NumPy kernel, unwrapped and guarded, same run.

    python bench/guard.py [--m 32] [--n 256] [--calls 2000] [--rounds 15] [--queue-size 64]

The kernel is examples/triton's row_sum written as a NumPy launcher
(``out[i] = sum(x[i, :])``, float32), called with inputs inside its
certificate's scope. Five variants run in alternating rounds, so that drift on
a shared machine hits all alike: the unwrapped call, a Python wrapper that only
forwards the call (the floor any Python-level wrapper pays on this machine),
and the guarded call at sample rate 0, 1% and 100%. Each round times
``--calls`` calls back to back with ``time.perf_counter_ns``. Printed per
variant: ns per call (the median round, and the best round: on a busy machine
the best is the least disturbed, as ``timeit`` reports), the overhead over the
unwrapped call in ns and the ratio to it (both from the best rounds), and the
guard's counts (sampled, checked, dropped: at 100% the worker cannot keep up
with a kernel this small, so most samples are dropped, by design, without
waiting).
After each guarded round the bench waits for the worker to finish its backlog,
outside the timed calls, so that its checks do not slow the next variant down.

The certificate is signed here with a throwaway key over the spec's real
digests and scope: the guard's hot path reads only those, so a certificate
from ``kcert certify`` (``--certificate PATH``, of examples/triton's row_sum)
gives the same figures.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kcert.attest.certificate import sign_report
from kcert.attest.dsse import Envelope
from kcert.certify.report import (
    CHECK_NAMES,
    CertificationReport,
    CheckResult,
    KernelIdentity,
    Status,
    TimingReport,
)
from kcert.certify.spec import KernelSpec, load_spec
from kcert.digest import Digest
from kcert.guard import Guard, ListReporter

SPEC = Path(__file__).resolve().parents[1] / "examples" / "triton" / "kcert.toml"
RATES = {"rate 0": 0.0, "rate 1%": 0.01, "rate 100%": 1.0}


def row_sum(x_ptr: np.ndarray[Any, Any], out_ptr: np.ndarray[Any, Any]) -> None:
    np.sum(x_ptr, axis=1, out=out_ptr)


def signed_certificate(kernel: KernelSpec, scope: dict[str, int]) -> Envelope:
    identity = KernelIdentity(
        name=kernel.name, entry=kernel.entry, language=kernel.language,
        source_name=kernel.code.main.name, source_digest=str(kernel.code.digest),
        spec_digest=str(kernel.digest), reference_digest=str(kernel.reference.code.digest),
        build=None)  # fmt: skip
    env = {"executor": "triton-interpreter"}
    report = CertificationReport(
        kernel=identity, executor="triton-interpreter", hw_class="cpu", environment=env,
        fingerprint=str(Digest.of_json(env)), fresh_seed=0, probes=(),
        checks=tuple(CheckResult(name, Status.PASS, "ok") for name in CHECK_NAMES),
        timing=TimingReport("skipped", None, None, None, None, skipped_reason="bench"),
        minimized={}, certifier_version="bench", issued_at="2026-11-23T00:00:00Z",
        shape_scope={name: {"listed": [1, top], "drawn": [], "min": 1, "max": top,
                            "draw_up_to": top} for name, top in scope.items()})  # fmt: skip
    return sign_report(report, Ed25519PrivateKey.generate())


def time_calls(fn: Callable[..., Any], x: np.ndarray[Any, Any], y: np.ndarray[Any, Any],
               calls: int) -> float:  # fmt: skip
    """Nanoseconds per call over ``calls`` back-to-back calls."""
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn(x, y)
    return (time.perf_counter_ns() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--queue-size", type=int, default=64)
    parser.add_argument("--certificate", type=Path, help="a certificate of examples' row_sum")
    args = parser.parse_args(argv)
    kernel = load_spec(SPEC).kernel("row_sum")
    certificate: Any = args.certificate or signed_certificate(kernel, {"m": args.m, "n": args.n})
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.m, args.n)).astype(np.float32)  # the spec's uniform(-1, 1)
    y = np.zeros(args.m, dtype=np.float32)
    guards = {name: Guard.from_certificate(certificate, kernel, sample_rate=rate, seed=0,
                                           queue_size=args.queue_size,
                                           reporter=ListReporter(flush_every_s=3600.0))
              for name, rate in RATES.items()}  # fmt: skip
    @functools.wraps(row_sum)
    def forwarded(*args: Any, **kwargs: Any) -> Any:
        return row_sum(*args, **kwargs)

    # the cost of any Python wrapper on this machine: a scale for the guard's figures
    variants: dict[str, Callable[..., Any]] = {"unwrapped": row_sum, "pass-through": forwarded}
    variants.update({name: g.wrap(row_sum) for name, g in guards.items()})
    for fn in variants.values():  # warm up: the launch cache, the detector's warm-up
        time_calls(fn, x, y, 200)
    figures: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            figures[name].append(time_calls(fn, x, y, args.calls))
            if name in guards:  # the worker's backlog must not run into the next variant's time
                guards[name].flush(120)
    base = min(figures["unwrapped"])
    print(f"guard overhead: row_sum of a {args.m}x{args.n} float32 array (NumPy), {args.calls} "
          f"calls x {args.rounds} rounds")
    print(f"{'variant':<13} {'median ns':>10} {'best ns':>10} {'overhead ns':>12} {'ratio':>7}"
          "  guard counts")
    for name, values in figures.items():
        best = min(values)
        counts = ""
        if name in guards:
            s = guards[name].stats()
            counts = (f"seen {s.calls_seen}, sampled {s.calls_sampled}, checked "
                      f"{s.calls_checked}, dropped {s.dropped}, mismatches {s.mismatches}")
        print(f"{name:<13} {statistics.median(values):>10.0f} {best:>10.0f} {best - base:>12.0f} "
              f"{best / base:>7.2f}  {counts}")
    for g in guards.values():
        g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

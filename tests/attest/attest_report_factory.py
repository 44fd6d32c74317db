"""Hand-built CertificationReports for the attestation tests.

The certification pipeline is written in parallel; these reports follow the
contract of kcert/certify/report.py directly so that signing, verifying and
diffing can be tested without it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kcert.certify.report import (
    CHECK_NAMES,
    BuildRecord,
    CertificationReport,
    CheckResult,
    ErrorMetrics,
    KernelIdentity,
    ProbeRecord,
    Resources,
    Status,
    TimingReport,
    TimingResult,
)
from kcert.digest import Digest


def digest_of(text: str) -> str:
    return str(Digest.of_bytes(text.encode()))


def make_metrics(max_abs: float = 1e-7, **overrides: Any) -> ErrorMetrics:
    base = ErrorMetrics(
        max_abs=max_abs, max_rel=max_abs * 2, max_ulp=1.0, bad_count=0,
        first_bad_index=None, atol=1e-5, rtol=1.3e-6,
    )  # fmt: skip
    return dataclasses.replace(base, **overrides)


def make_probe(n: int, *, kind: str = "fixed", max_abs: float = 1e-7) -> ProbeRecord:
    return ProbeRecord(
        id=f"n={n}",
        kind=kind,
        seed=1000 + n,
        dims={"n": n},
        inputs={"x": digest_of(f"x{n}"), "y": digest_of(f"y{n}")},
        reference={"y": digest_of(f"ref{n}")},
        outputs={"y": digest_of(f"out{n}")},
        metrics={"y": make_metrics(max_abs)},
    )


def make_checks(failing: dict[str, str] | None = None) -> tuple[CheckResult, ...]:
    failing = failing or {}
    return tuple(
        CheckResult(
            name=name,
            status=Status.FAIL if name in failing else Status.PASS,
            message=failing.get(name, "ok"),
            probe="n=33" if name in failing else None,
        )
        for name in CHECK_NAMES
    )


def make_resources(registers: int = 16, spill_stores: int = 0) -> Resources:
    return Resources(
        registers=registers, spill_stores=spill_stores, spill_loads=spill_stores,
        stack_bytes=0, shared_bytes=0, const_bytes=0, local_bytes=0, barriers=0,
    )  # fmt: skip


def make_timing(kernel_ms: float = 0.010, baseline_ms: float = 0.012) -> TimingReport:
    def result(ms: float) -> TimingResult:
        return TimingResult(median_ms=ms, p99_ms=ms * 1.2, min_ms=ms * 0.9, cv=0.02, runs=100)

    return TimingReport(
        method="cuda-events", kernel=result(kernel_ms), baseline=result(baseline_ms),
        speedup=baseline_ms / kernel_ms, lower_bound_ms=0.001,
    )  # fmt: skip


def make_report(
    *,
    cuda: bool = True,
    probes: tuple[ProbeRecord, ...] | None = None,
    failing: dict[str, str] | None = None,
    resources: Resources | None = None,
    timing: TimingReport | None = None,
    environment: dict[str, Any] | None = None,
    source: str = "extern \"C\" __global__ void saxpy() {}",
) -> CertificationReport:
    build = (
        BuildRecord(
            compiler="nvrtc 13.0", arch="sm_90", options=("-arch=sm_90", "--std=c++17"),
            ptx_digest=digest_of("ptx"), cubin_digest=digest_of("cubin"),
            resources=resources or make_resources(),
        )  # fmt: skip
        if cuda
        else None
    )
    kernel = KernelIdentity(
        name="saxpy",
        entry="saxpy",
        language="cuda" if cuda else "triton",
        source_name="saxpy.cu" if cuda else "saxpy.py",
        source_digest=digest_of(source),
        spec_digest=digest_of("spec"),
        reference_digest=digest_of("reference"),
        build=build,
    )
    env = environment or {
        "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "580.65",
        "cuda_runtime": "13.0", "nvrtc": "13.0", "cublas": "13.0.1", "numpy": "2.3.0",
    }  # fmt: skip
    return CertificationReport(
        kernel=kernel,
        executor="cuda" if cuda else "triton-interpreter",
        hw_class="H100" if cuda else "cpu",
        environment=env,
        fingerprint=digest_of(repr(sorted(env.items()))),
        fresh_seed=424242,
        probes=probes if probes is not None else (make_probe(1), make_probe(33)),
        checks=make_checks(failing),
        timing=timing or make_timing(),
        minimized={name: {"n": 33} for name in (failing or {})},
        certifier_version="0.1.0",
        issued_at="2026-11-22T08:30:00Z",
    )

"""Certification reports with recorded error profiles, for the HTML report tests."""

from __future__ import annotations

import dataclasses

import numpy as np
from attest_report_factory import make_probe, make_report

from kcert.certify.checks import error_profile
from kcert.certify.profile import PROBE_BINS
from kcert.certify.report import CertificationReport, ProbeRecord
from kcert.certify.tolerance import Allowance

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def profiled(probe: ProbeRecord, shape: tuple[int, ...], *, bad: tuple[int, ...] = (),
             budget: int = PROBE_BINS) -> ProbeRecord:  # fmt: skip
    """``probe`` with a real profile of an output of ``shape``, wrong at flat indices ``bad``."""
    rng = np.random.default_rng(len(shape) * 1000 + sum(shape))
    ref = rng.standard_normal(shape).astype(np.float32)
    got = (ref + rng.standard_normal(shape).astype(np.float32) * np.float32(1e-6)).reshape(-1)
    for i in bad:
        got[i] = np.float32(np.nan) if i % 2 else got[i] + np.float32(0.5)
    got = got.reshape(shape)
    allowance = Allowance(np.full(shape, 1e-5), 1e-5, 0.0, "spec")
    profile = error_profile("f32", got, ref, allowance, unwritten=np.zeros(shape, dtype=bool),
                            budget=budget)  # fmt: skip
    metrics = {k: dataclasses.replace(m, profile=profile, bad_count=len(bad),
                                      first_bad_index=(bad[0],) if bad else None)
               for k, m in probe.metrics.items()}  # fmt: skip
    return dataclasses.replace(probe, metrics=metrics)


def sample_report(message: str = "ok") -> CertificationReport:
    probes = (
        profiled(make_probe(1000), (1000,), bad=(500, 999)),
        profiled(dataclasses.replace(make_probe(64), id="m=48,n=64", dims={"m": 48, "n": 64}),
                 (48, 64), bad=(47 * 64 + 10, 20 * 64 + 41)),
        make_probe(7),  # as certificates made before profiles: none recorded
    )
    report = make_report(probes=probes, failing={"correctness": message})
    return report

"""Signed certificates for the guard tests, made from a real spec without running it.

The guard reads a certificate's kernel digests, verdict and shape scope; a real
certification of saxpy takes half a minute on the interpreter, so these tests
sign a report that names the spec's true digests and a chosen scope instead.
"""

from __future__ import annotations

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

#: The largest n the test certificate vouches for.
CERTIFIED_MAX = 8192
EXAMPLES = Path(__file__).parents[2] / "examples" / "triton" / "kcert.toml"


def saxpy_spec() -> KernelSpec:
    return load_spec(EXAMPLES).kernel("saxpy")


def certificate_for(kernel: KernelSpec, scope: dict[str, tuple[int, int]], *,
                    verdict: Status = Status.PASS, largest_elements: int | None = None,
                    key: Ed25519PrivateKey | None = None) -> Envelope:  # fmt: skip
    identity = KernelIdentity(
        name=kernel.name, entry=kernel.entry, language=kernel.language,
        source_name=kernel.code.main.name, source_digest=str(kernel.code.digest),
        spec_digest=str(kernel.digest), reference_digest=str(kernel.reference.code.digest),
        build=None)  # fmt: skip
    checks = tuple(CheckResult(name, verdict if name == "correctness" else Status.PASS, "ok")
                   for name in CHECK_NAMES)  # fmt: skip
    env = {"executor": "triton-interpreter", "numpy": "2"}
    report = CertificationReport(
        kernel=identity, executor="triton-interpreter", hw_class="cpu", environment=env,
        fingerprint=str(Digest.of_json(env)), fresh_seed=7, probes=(), checks=checks,
        timing=TimingReport("skipped", None, None, None, None, skipped_reason="interpreter"),
        minimized={}, certifier_version="0.1.0", issued_at="2026-11-23T12:00:00Z",
        shape_scope={name: {"listed": [low, high], "drawn": [], "min": low, "max": high,
                            "draw_up_to": high} for name, (low, high) in scope.items()},
        largest_elements=largest_elements)  # fmt: skip
    return sign_report(report, key or Ed25519PrivateKey.generate())


def saxpy(x_ptr: np.ndarray[Any, Any], y_ptr: np.ndarray[Any, Any], a: float = 2.5,
          n: int | None = None) -> None:  # fmt: skip
    """A correct launcher: y <- a*x + y in place, in float32 as the kernel computes."""
    y_ptr[...] = np.float32(a) * x_ptr + y_ptr


def saxpy_wrong_when_large(x_ptr: np.ndarray[Any, Any], y_ptr: np.ndarray[Any, Any],
                           a: float = 2.5, n: int | None = None) -> None:  # fmt: skip
    """Right for every size the certificate probed; past it the last block is off by 1 %."""
    saxpy(x_ptr, y_ptr, a, n)
    if x_ptr.size > CERTIFIED_MAX:
        y_ptr[-1024:] *= np.float32(1.01)


def pair(n: int, seed: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    return np.clip(x, -4, 4), np.clip(y, -4, 4)  # inside the 5-sigma reach of normal(0, 1)

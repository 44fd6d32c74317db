"""End to end on the CPU: certify each Triton example, sign it, verify it twice.

The report comes from the real pipeline (Triton interpreter, sandboxed child
process), so this is where the predicate the certifier writes meets the
schema, the signature and an independent DSSE verifier (securesystemslib).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from attest_report_factory import make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.signer import SSlibKey  # type: ignore[attr-defined]  # no __all__ there

from kcert.attest.certificate import (
    certificate_id,
    read_certificate,
    sign_report,
    verify_envelope,
    write_certificate,
)
from kcert.attest.keys import key_id
from kcert.certify import pipeline
from kcert.certify.lint import lint
from kcert.certify.report import Verdict
from kcert.certify.spec import load_spec

EXAMPLES = Path(__file__).parents[2] / "examples" / "triton" / "kcert.toml"
CUDA_EXAMPLES = EXAMPLES.parents[1] / "cuda" / "kcert.toml"
KERNELS = ("saxpy", "row_sum", "softmax", "matmul", "layernorm", "row_max")


@pytest.mark.slow
@pytest.mark.parametrize("name", KERNELS)
def test_triton_example_certified_on_cpu_signs_and_verifies(
    tmp_path: Path, name: str, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey],
) -> None:  # fmt: skip
    kernel = load_spec(EXAMPLES).kernel(name)
    options = pipeline.CertifyOptions(
        executor="triton-interpreter", max_probes=2, timing=False, minimize=False
    )
    report = pipeline.certify(kernel, options)
    cert = tmp_path / f"{name}.cert.json"
    write_certificate(cert, sign_report(report, signing_key))

    envelope = read_certificate(cert)
    verified = verify_envelope(envelope, trusted)
    assert verified.id == certificate_id(envelope)
    assert (verified.kernel_name, verified.hw_class) == (name, "cpu")
    assert verified.executor == "triton-interpreter"
    assert verified.verdict is Verdict.PASS, report.first_failure()
    assert [n for n, _ in verified.subjects][0] == kernel.source.name

    public = signing_key.public_key()
    theirs = SslibEnvelope.from_dict(json.loads(cert.read_bytes()))
    sslib_key = SSlibKey.from_crypto(public, keyid=key_id(public), scheme="ed25519")
    assert list(theirs.verify([sslib_key], 1)) == [key_id(public)]
    statement = json.loads(theirs.payload)
    assert statement["predicate"]["verdict"] == "pass"


def test_real_nvrtc_build_record_signs_and_names_the_cubin(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    """No GPU needed: NVRTC builds the CUDA example, and its record goes into a report."""
    kernel = load_spec(CUDA_EXAMPLES).kernel("saxpy")
    build = lint(kernel, arch="sm_90").builds[0].record()
    assert build.resources is not None
    base = make_report()
    identity = dataclasses.replace(base.kernel, build=build)
    verified = verify_envelope(sign_report(dataclasses.replace(base, kernel=identity),
                                           signing_key), trusted)  # fmt: skip
    assert [(n, str(d)) for n, d in verified.subjects][1] == ("saxpy.cubin", build.cubin_digest)
    resources = verified.predicate["kernel"]["build"]["resources"]
    assert resources["registers"] == build.resources.registers > 0


@pytest.mark.gpu
def test_cuda_example_certified_on_gpu_signs_and_verifies(
    tmp_path: Path, signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    kernel = load_spec(CUDA_EXAMPLES).kernel("saxpy")
    options = pipeline.CertifyOptions(executor="cuda", max_probes=2, minimize=False)
    report = pipeline.certify(kernel, options)
    cert = tmp_path / "saxpy.cert.json"
    write_certificate(cert, sign_report(report, signing_key))
    verified = verify_envelope(read_certificate(cert), trusted)
    assert verified.executor == "cuda" and verified.hw_class != "cpu"
    assert [n for n, _ in verified.subjects] == ["saxpy.cu", "saxpy.cubin"]
    public = signing_key.public_key()
    theirs = SslibEnvelope.from_dict(json.loads(cert.read_bytes()))
    sslib_key = SSlibKey.from_crypto(public, keyid=key_id(public), scheme="ed25519")
    assert list(theirs.verify([sslib_key], 1)) == [key_id(public)]

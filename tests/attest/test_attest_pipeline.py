"""Real build records and certificates signed and verified end to end.

Each Triton example certified on the CPU, signed and verified twice (kcert and
securesystemslib) is tests/integration/test_examples_certify.py, with the
certification that checks the example passes: one run of each, not two.
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
    read_certificate,
    sign_report,
    verify_envelope,
    write_certificate,
)
from kcert.attest.keys import key_id
from kcert.certify import pipeline
from kcert.certify.lint import lint
from kcert.certify.spec import load_spec

EXAMPLES = Path(__file__).parents[2] / "examples" / "triton" / "kcert.toml"
CUDA_EXAMPLES = EXAMPLES.parents[1] / "cuda" / "kcert.toml"


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

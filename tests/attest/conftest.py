"""Fixtures for the attestation tests: a signing key, its trust map, reports."""

from __future__ import annotations

import pytest
from attest_report_factory import make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kcert.attest.keys import generate_private_key, key_id
from kcert.certify.report import CertificationReport


@pytest.fixture(scope="session")
def signing_key() -> Ed25519PrivateKey:
    return generate_private_key()


@pytest.fixture(scope="session")
def trusted(signing_key: Ed25519PrivateKey) -> dict[str, Ed25519PublicKey]:
    public = signing_key.public_key()
    return {key_id(public): public}


@pytest.fixture
def report() -> CertificationReport:
    return make_report()

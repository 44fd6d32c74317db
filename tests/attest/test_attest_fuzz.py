"""Whatever bytes arrive, parsing and verifying fail only with kcert's own errors.

A pushed certificate is untrusted input: a crash here would be a 500 in the
registry or a traceback in the CLI, so every failure must be a KcertError.
"""

from __future__ import annotations

import json
from typing import Any

from attest_report_factory import make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcert.attest import dsse
from kcert.attest.certificate import parse_envelope, sign_report, verify_envelope
from kcert.attest.errors import CertificateFormatError, VerificationError
from kcert.attest.statement import PAYLOAD_TYPE

_FUZZ = settings(max_examples=100, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@_FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_fail_cleanly(data: bytes) -> None:
    try:
        parse_envelope(data)
    except CertificateFormatError:
        pass


@_FUZZ
@given(json_values)
def test_arbitrary_json_parses_or_fails_cleanly(value: Any) -> None:
    try:
        parse_envelope(json.dumps(value).encode())
    except CertificateFormatError:
        pass


@_FUZZ
@given(st.dictionaries(st.sampled_from(["payload", "payloadType", "signatures", "x"]),
                       json_values | st.just("AAAA"), max_size=4))  # fmt: skip
def test_envelope_shaped_json_parses_or_fails_cleanly(value: dict[str, Any]) -> None:
    try:
        parse_envelope(json.dumps(value).encode())
    except CertificateFormatError:
        pass


def _mutate_predicate(predicate: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    node: Any = predicate
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return predicate


PATHS = [
    ["verdict"], ["kernel", "name"], ["kernel", "source_digest"], ["kernel", "build"],
    ["hardware", "class"], ["environment", "fields"], ["probes", "items"], ["checks"],
    ["timing", "kernel"], ["timing", "speedup"], ["minimized"], ["issued_at"],
]  # fmt: skip


@_FUZZ
@given(st.sampled_from(PATHS), json_values)
def test_signed_but_odd_statements_fail_with_verification_errors(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey],
    path: list[str], value: Any,
) -> None:  # fmt: skip
    """A trusted signer's odd content is refused with a reason, never a crash."""
    statement = json.loads(sign_report(make_report(), signing_key).payload)
    _mutate_predicate(statement["predicate"], path, value)
    envelope = dsse.sign(PAYLOAD_TYPE, json.dumps(statement).encode(), signing_key)
    try:
        verified = verify_envelope(envelope, trusted)
    except VerificationError:
        return
    # Accepted: then the odd value must have been one the schema allows there.
    assert verified.predicate == statement["predicate"]

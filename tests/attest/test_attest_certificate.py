"""Signing reports, certificate ids, files, and what verification refuses and why."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from attest_report_factory import digest_of, make_probe, make_report
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kcert.attest import dsse
from kcert.attest.certificate import (
    Envelope,
    Signature,
    certificate_id,
    inspect_envelope,
    load_envelope,
    parse_envelope,
    read_certificate,
    sign_report,
    verify_envelope,
    write_certificate,
)
from kcert.attest.errors import CertificateFormatError, SigningError, VerificationError
from kcert.attest.keys import generate_private_key, key_id
from kcert.attest.statement import PAYLOAD_TYPE, STATEMENT_TYPE
from kcert.certify.report import PREDICATE_TYPE, CertificationReport, Verdict
from kcert.digest import Digest, canonical_json


def _sign_statement(statement: Any, key: Ed25519PrivateKey, *, raw: bytes | None = None,
                    payload_type: str = PAYLOAD_TYPE) -> Envelope:  # fmt: skip
    """Sign arbitrary content with a trusted key, to test what lies past the signature."""
    payload = raw if raw is not None else json.dumps(statement).encode()
    return dsse.sign(payload_type, payload, key)


def _statement(report: CertificationReport) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": report.kernel.source_name,
                     "digest": {"sha256": Digest.parse(report.kernel.source_digest).hex}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": report.predicate(),
    }  # fmt: skip


def test_sign_and_verify_round_trip(
    report: CertificationReport, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey],
) -> None:  # fmt: skip
    envelope = sign_report(report, signing_key)
    assert envelope.payload_type == "application/vnd.in-toto+json"
    assert [s.keyid for s in envelope.signatures] == list(trusted)
    # The payload is RFC 8785 canonical JSON of the statement.
    assert envelope.payload == canonical_json(json.loads(envelope.payload))
    verified = verify_envelope(parse_envelope(envelope.to_bytes()), trusted)
    assert verified.id == certificate_id(envelope)
    assert verified.keyid == key_id(signing_key.public_key())
    assert verified.statement["_type"] == "https://in-toto.io/Statement/v1"
    assert verified.statement["predicateType"] == PREDICATE_TYPE
    assert verified.predicate == json.loads(json.dumps(report.predicate()))
    assert verified.kernel_name == "saxpy"
    assert str(verified.source_digest) == report.kernel.source_digest
    assert verified.verdict is Verdict.PASS
    assert (verified.hw_class, verified.executor) == ("H100", "cuda")
    assert str(verified.fingerprint) == report.fingerprint
    assert report.kernel.build is not None
    assert [(n, str(d)) for n, d in verified.subjects] == [
        ("saxpy.cu", report.kernel.source_digest),
        ("saxpy.cubin", report.kernel.build.cubin_digest),
    ]


def test_interpreter_certificate_has_only_the_source_subject(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    verified = verify_envelope(sign_report(make_report(cuda=False), signing_key), trusted)
    assert [n for n, _ in verified.subjects] == ["saxpy.py"]
    assert (verified.hw_class, verified.executor) == ("cpu", "triton-interpreter")


def test_failed_verdict_is_signed_too(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    report = make_report(failing={"correctness": "element 3 is off by 2.0"})
    verified = verify_envelope(sign_report(report, signing_key), trusted)
    assert verified.verdict is Verdict.FAIL
    assert verified.predicate["minimized"] == {"correctness": {"n": 33}}


def test_non_finite_error_metrics_survive_signing(
    signing_key: Ed25519PrivateKey, trusted: dict[str, Ed25519PublicKey]
) -> None:
    probe = make_probe(7)
    nan = dataclasses.replace(probe.metrics["y"], max_abs=float("nan"), max_ulp=float("inf"))
    report = make_report(probes=(dataclasses.replace(probe, metrics={"y": nan}),))
    verified = verify_envelope(sign_report(report, signing_key), trusted)
    metrics = verified.predicate["probes"]["items"][0]["metrics"]["y"]
    assert (metrics["max_abs"], metrics["max_ulp"]) == ("nan", "inf")


def test_certificate_id_is_stable_across_layouts(
    report: CertificationReport, signing_key: Ed25519PrivateKey
) -> None:
    envelope = sign_report(report, signing_key)
    expected = Digest.of_bytes(dsse.pae(envelope.payload_type, envelope.payload))
    assert certificate_id(envelope) == expected
    assert expected != Digest.of_bytes(canonical_json(envelope.to_json()))
    document = envelope.to_json()
    respelled = {
        "signatures": [{"sig": base64.urlsafe_b64encode(envelope.signatures[0].sig)
                        .decode().rstrip("="), "keyid": envelope.signatures[0].keyid}],
        "payloadType": document["payloadType"],
        "payload": base64.urlsafe_b64encode(envelope.payload).decode().rstrip("="),
    }  # fmt: skip
    assert certificate_id(parse_envelope(json.dumps(respelled).encode())) == expected
    other = sign_report(make_report(source="different source"), signing_key)
    assert certificate_id(other) != expected


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: dataclasses.replace(r, fresh_seed=2**63 - 5),
         r"predicate.probes.fresh_seed = 9223372036854775803 is beyond 2\^53 - 1"),
        (lambda r: dataclasses.replace(r, probes=(dataclasses.replace(r.probes[0], seed=2**60),)),
         r"predicate.probes.items\[0\].seed = .* is beyond 2\^53 - 1"),
        (lambda r: dataclasses.replace(r, timing=dataclasses.replace(r.timing, speedup=math.nan)),
         "predicate.timing.speedup is nan, and JSON has no NaN"),
        (lambda r: dataclasses.replace(r, kernel=dataclasses.replace(r.kernel, source_digest="x")),
         "not a content address: 'x'"),
        (lambda r: dataclasses.replace(r, hw_class=""),
         "schema violation at predicate.hardware.class"),
    ],
)  # fmt: skip
def test_reports_that_cannot_be_signed_say_where(
    report: CertificationReport, signing_key: Ed25519PrivateKey, change: Any, reason: str
) -> None:
    with pytest.raises(SigningError, match=reason):
        sign_report(change(report), signing_key)


def test_untrusted_signer_is_refused_with_its_key_id(
    report: CertificationReport, trusted: dict[str, Ed25519PublicKey]
) -> None:
    stranger = generate_private_key()
    envelope = sign_report(report, stranger)
    stranger_id = key_id(stranger.public_key())
    with pytest.raises(VerificationError, match=f"untrusted key {stranger_id}"):
        verify_envelope(envelope, trusted)
    with pytest.raises(VerificationError, match="no trusted keys"):
        verify_envelope(envelope, {})


def test_untrusted_signer_claiming_a_trusted_key_id_is_refused(
    report: CertificationReport, trusted: dict[str, Ed25519PublicKey]
) -> None:
    forged = sign_report(report, generate_private_key())
    (trusted_id,) = trusted
    forged = dataclasses.replace(forged, signatures=(
        Signature(sig=forged.signatures[0].sig, keyid=trusted_id),))  # fmt: skip
    with pytest.raises(VerificationError, match=f"bad signature.*{trusted_id}"):
        verify_envelope(forged, trusted)


def test_keyid_is_only_a_hint(
    report: CertificationReport, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey],
) -> None:  # fmt: skip
    envelope = sign_report(report, signing_key)
    for hint in (None, "not-a-key-we-know"):
        relabelled = dataclasses.replace(
            envelope, signatures=(Signature(sig=envelope.signatures[0].sig, keyid=hint),)
        )
        assert verify_envelope(relabelled, trusted).keyid == next(iter(trusted))


def test_one_trusted_signature_among_several_is_enough(
    report: CertificationReport, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey],
) -> None:  # fmt: skip
    mine = sign_report(report, signing_key)
    theirs = sign_report(report, generate_private_key())
    both = dataclasses.replace(mine, signatures=(*theirs.signatures, *mine.signatures))
    assert verify_envelope(parse_envelope(both.to_bytes()), trusted).keyid in trusted


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: b"\xff\xfe not text", "not an in-toto statement: .*not UTF-8"),
        (lambda s: b"plain text, not JSON", "not an in-toto statement: .*not valid JSON"),
        (lambda s: b"[1, 2, 3]", "not an in-toto statement: the payload is not a JSON object"),
        (lambda s: {**s, "_type": "https://in-toto.io/Statement/v0.1"},
         "not an in-toto statement: _type is 'https://in-toto.io/Statement/v0.1'"),
        (lambda s: {k: v for k, v in s.items() if k != "_type"},
         "not an in-toto statement: _type is None"),
        (lambda s: {**s, "predicateType": "https://slsa.dev/provenance/v1"},
         "wrong predicate type 'https://slsa.dev/provenance/v1': this is not a kcert"),
        (lambda s: {**s, "subject": []}, "subject must be a non-empty list"),
        (lambda s: {**s, "subject": [{"name": "x", "digest": {"sha512": "ab"}}]},
         r"subject\[0\] has no sha256 digest"),
        (lambda s: {**s, "subject": [{"name": "x", "digest": {"sha256": digest_of("x")}}]},
         r"subject\[0\].digest.sha256"),
        (lambda s: {**s, "subject": [{"name": "x", "digest": {"sha256": "0" * 64}}]},
         "the kernel source sha256:.* is not among the subjects"),
        (lambda s: {**s, "predicate": {**s["predicate"], "verdict": "maybe"}},
         r"schema violation at predicate.verdict"),
        (lambda s: {**s, "predicate": {**s["predicate"], "verdict": "pass", "checks": [
            {**c, "status": "fail"} for c in s["predicate"]["checks"]]}},
         "the verdict is 'pass' but required check build failed"),
        (lambda s: {**s, "predicate": {**s["predicate"], "kernel": {
            k: v for k, v in s["predicate"]["kernel"].items() if k != "spec_digest"}}},
         r"schema violation at predicate.kernel: 'spec_digest' is a required property"),
        (lambda s: {**s, "predicate": {**s["predicate"], "probes": {
            **s["predicate"]["probes"], "items": [{**s["predicate"]["probes"]["items"][0],
                                                   "outputs": {"y": "md5:abc"}}]}}},
         r"schema violation at predicate.probes.items\[0\].outputs.y"),
        (lambda s: {**s, "predicate": None}, "schema violation at predicate: None is not"),
    ],
)  # fmt: skip
def test_signed_payloads_that_are_not_kcert_statements_are_refused(
    report: CertificationReport, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey], mutate: Any, reason: str,
) -> None:  # fmt: skip
    content = mutate(_statement(report))
    raw = content if isinstance(content, bytes) else None
    envelope = _sign_statement(content, signing_key, raw=raw)
    with pytest.raises(VerificationError, match=reason):
        verify_envelope(parse_envelope(envelope.to_bytes()), trusted)


def test_signed_envelope_of_another_payload_type_is_refused(
    report: CertificationReport, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey],
) -> None:  # fmt: skip
    envelope = _sign_statement(_statement(report), signing_key, payload_type="text/plain")
    with pytest.raises(VerificationError, match="wrong payload type 'text/plain'"):
        verify_envelope(envelope, trusted)


def test_duplicate_keys_in_the_payload_are_refused(
    report: CertificationReport, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey],
) -> None:  # fmt: skip
    text = json.dumps(_statement(report))
    raw = ('{"predicateType": "https://example.com/other", ' + text[1:]).encode()
    with pytest.raises(VerificationError, match="duplicate key 'predicateType'"):
        verify_envelope(_sign_statement(None, signing_key, raw=raw), trusted)


def test_write_and_read_certificate(
    tmp_path: Path, report: CertificationReport, signing_key: Ed25519PrivateKey,
    trusted: dict[str, Ed25519PublicKey],
) -> None:  # fmt: skip
    envelope = sign_report(report, signing_key)
    path = tmp_path / "saxpy.cert.json"
    write_certificate(path, envelope)
    assert read_certificate(path) == envelope
    assert certificate_id(read_certificate(path)) == certificate_id(envelope)
    assert verify_envelope(read_certificate(path), trusted).id == certificate_id(envelope)
    assert [p.name for p in tmp_path.iterdir()] == ["saxpy.cert.json"]


def test_schema_is_checked_when_writing_and_reading(
    tmp_path: Path, report: CertificationReport, signing_key: Ed25519PrivateKey
) -> None:
    statement = _statement(report)
    statement["predicate"]["hardware"]["executor"] = "abacus"
    bad = _sign_statement(statement, signing_key)
    path = tmp_path / "bad.json"
    with pytest.raises(VerificationError, match="predicate.hardware.executor"):
        write_certificate(path, bad)
    assert not path.exists()
    path.write_bytes(bad.to_bytes())
    assert load_envelope(path) == bad  # the envelope itself is well formed ...
    with pytest.raises(VerificationError, match="bad.json: schema violation"):
        read_certificate(path)  # ... but its statement is not kcert's


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "not valid JSON"),
        (b"\x89PNG", "not UTF-8"),
        (b"[]", "the JSON is an array, expected an object"),
        (b'{"payload": "", "payloadType": "x"}', "missing signatures"),
        (b'{"payload": "", "payloadType": "x", "signatures": [], "extra": 1}',
         "unknown field"),
        (b'{"payload": "", "payloadType": "x", "signatures": []}', "has no signatures"),
        (b'{"payload": "", "payloadType": 3, "signatures": [{"sig": ""}]}',
         "payloadType must be a string"),
        (b'{"payload": "!!!", "payloadType": "x", "signatures": [{"sig": ""}]}',
         "payload is not base64"),
        (b'{"payload": "A", "payloadType": "x", "signatures": [{"sig": ""}]}',
         "truncated base64"),
        (b'{"payload": "a+b-", "payloadType": "x", "signatures": [{"sig": ""}]}',
         "mixes two base64 alphabets"),
        (b'{"payload": "", "payloadType": "x", "signatures": [{"keyid": "k"}]}',
         r"signatures\[0\] has no sig"),
        (b'{"payload": "", "payloadType": "x", "signatures": [{"sig": "", "cert": ""}]}',
         r"unknown field\(s\) in signatures\[0\]"),
        (b'{"payload": "", "payloadType": "x", "payloadType": "y", "signatures": []}',
         "duplicate key 'payloadType'"),
        (b'{"payload": NaN, "payloadType": "x", "signatures": []}', "NaN is not JSON"),
    ],
)  # fmt: skip
def test_parse_envelope_is_strict(data: bytes, reason: str) -> None:
    with pytest.raises(CertificateFormatError, match=reason):
        parse_envelope(data)


def test_unreadable_certificate_files(tmp_path: Path) -> None:
    with pytest.raises(CertificateFormatError, match="does not exist"):
        load_envelope(tmp_path / "absent.json")
    with pytest.raises(CertificateFormatError, match="is a directory"):
        load_envelope(tmp_path)


def test_inspect_reads_without_checking_the_signature(
    report: CertificationReport
) -> None:
    envelope = sign_report(report, generate_private_key())
    assert inspect_envelope(envelope).kernel_name == "saxpy"

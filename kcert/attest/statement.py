"""in-toto Statement v1 around kcert's predicate, and the predicate's JSON Schema.

A certificate's payload is the RFC 8785 canonical JSON of a Statement
(https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md):
``_type``, ``subject`` (resource descriptors with a ``sha256`` digest),
``predicateType`` and ``predicate``. The predicate must validate against
``predicate.schema.json``, shipped in this package and read through
``importlib.resources`` so that it is found in an installed wheel too.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from kcert.attest.dsse import loads_strict
from kcert.attest.errors import CertificateFormatError, SigningError, VerificationError
from kcert.certify.report import PREDICATE_TYPE
from kcert.digest import Digest, DigestError, canonical_json

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SCHEMA_RESOURCE = "predicate.schema.json"
_MAX_REASON = 300
MAX_SAFE_INTEGER = 2**53 - 1


@dataclass(frozen=True, slots=True)
class Statement:
    """A parsed, checked kcert statement."""

    subjects: tuple[tuple[str, Digest], ...]
    predicate_type: str
    predicate: Mapping[str, Any]
    #: The statement exactly as it was signed (parsed JSON).
    raw: Mapping[str, Any]


def make_statement(subjects: Sequence[tuple[str, Digest]], predicate: Mapping[str, Any]) -> bytes:
    """Canonical payload bytes of a kcert statement (the predicate is checked first)."""
    _check_json_safe(predicate, "predicate")
    try:
        validate_predicate(predicate)
    except VerificationError as exc:
        raise SigningError(f"cannot sign this report: {exc.diagnostics()}") from exc
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": d.hex}} for name, d in subjects],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }
    return canonical_json(statement)


@functools.cache
def predicate_schema() -> dict[str, Any]:
    text = resources.files("kcert.attest").joinpath(SCHEMA_RESOURCE).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@functools.cache
def _validator() -> Draft202012Validator:
    # jsonschema is a fifth of `kcert verify`'s start, and built once per process.
    # lazy: only signing and reading a statement validate one, not gate or any --help
    from jsonschema import Draft202012Validator

    return Draft202012Validator(predicate_schema())


def validate_predicate(predicate: Any) -> None:
    """Raise :class:`VerificationError` naming the JSON path of the first schema violation."""
    # lazy: with _validator, jsonschema loads only where a schema is validated
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(predicate))
    if error is not None:
        path = error.json_path.replace("$", "predicate", 1)
        raise VerificationError(
            f"schema violation at {path}: {_shorten(error.message)} "
            f"(schema rule {'/'.join(str(p) for p in error.schema_path)})"
        )


def parse_statement(payload: bytes) -> Statement:
    """Check that a payload is an in-toto Statement v1 carrying a valid kcert predicate."""
    try:
        value = loads_strict(payload, what="payload")
    except CertificateFormatError as exc:
        # The envelope was fine; it is the signed content that is not a statement.
        raise VerificationError(f"not an in-toto statement: {exc.diagnostics()}") from exc
    if not isinstance(value, dict):
        raise VerificationError("not an in-toto statement: the payload is not a JSON object")
    kind = value.get("_type")
    if kind != STATEMENT_TYPE:
        raise VerificationError(
            f"not an in-toto statement: _type is {_shorten(repr(kind))}, "
            f"expected {STATEMENT_TYPE!r}"
        )
    predicate_type = value.get("predicateType")
    if predicate_type != PREDICATE_TYPE:
        raise VerificationError(
            f"wrong predicate type {_shorten(repr(predicate_type))}: this is not a kcert "
            f"certificate (expected {PREDICATE_TYPE!r})"
        )
    subjects = _parse_subjects(value.get("subject"))
    predicate = value.get("predicate")
    validate_predicate(predicate)
    assert isinstance(predicate, dict)  # the schema's top level is "type": "object"
    _check_consistency(subjects, predicate)
    return Statement(
        subjects=subjects, predicate_type=predicate_type, predicate=predicate, raw=value
    )


def _parse_subjects(value: Any) -> tuple[tuple[str, Digest], ...]:
    if not isinstance(value, list) or not value:
        raise VerificationError("not an in-toto statement: subject must be a non-empty list")
    out: list[tuple[str, Digest]] = []
    for index, item in enumerate(value):
        where = f"subject[{index}]"
        if not isinstance(item, dict):
            raise VerificationError(f"not an in-toto statement: {where} is not an object")
        name = item.get("name")
        digests = item.get("digest")
        if not isinstance(name, str) or not name:
            raise VerificationError(f"bad statement: {where}.name must be a non-empty string")
        if not isinstance(digests, dict) or not isinstance(digests.get("sha256"), str):
            raise VerificationError(f"bad statement: {where} has no sha256 digest")
        try:
            out.append((name, Digest(digests["sha256"])))
        except DigestError as exc:
            raise VerificationError(f"bad statement: {where}.digest.sha256: {exc}") from exc
    return tuple(out)


def _check_consistency(subjects: Sequence[tuple[str, Digest]], predicate: Any) -> None:
    """Catch statements that are well formed but say two different things."""
    source = Digest.parse(predicate["kernel"]["source_digest"])
    if all(d != source for _, d in subjects):
        raise VerificationError(
            f"bad statement: the kernel source {source} is not among the subjects"
        )
    failed = [
        c["name"] for c in predicate["checks"] if c["required"] and c["status"] == "fail"
    ]
    expected = "fail" if failed else "pass"
    if predicate["verdict"] != expected:
        why = f"required check {failed[0]} failed" if failed else "no required check failed"
        raise VerificationError(
            f"bad statement: the verdict is {predicate['verdict']!r} but {why}"
        )


def _check_json_safe(value: Any, path: str) -> None:
    """Refuse what RFC 8785 cannot write exactly, naming where it is."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise SigningError(
                f"cannot sign this report: {path} = {value} is beyond 2^53 - 1, which canonical "
                "JSON (RFC 8785) cannot carry exactly; the producer must use a smaller value"
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise SigningError(
                f"cannot sign this report: {path} is {value}, and JSON has no NaN or infinity"
            )
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SigningError(f"cannot sign this report: {path} has a non-string key")
            _check_json_safe(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json_safe(item, f"{path}[{index}]")
    else:
        raise SigningError(
            f"cannot sign this report: {path} is a {type(value).__name__}, not a JSON value"
        )


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."

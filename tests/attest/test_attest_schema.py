"""The predicate's JSON Schema: shipped as package data, and in step with report.py."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import pytest
from attest_report_factory import make_report

from kcert.attest.errors import VerificationError
from kcert.attest.statement import predicate_schema, validate_predicate


def test_schema_is_package_data_and_valid_draft_2020_12() -> None:
    text = resources.files("kcert.attest").joinpath("predicate.schema.json").read_text()
    schema = json.loads(text)
    assert schema == predicate_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def _undescribed(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Every object key in ``value`` that the schema does not name (following $refs)."""
    defs = predicate_schema()["$defs"]
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        branches = [s for s in schema["anyOf"] if s.get("type") != "null" and "enum" not in s]
        return _undescribed(value, branches[0], path) if branches and value is not None else []
    out: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            else:
                out.extend(_undescribed(item, schema["properties"][key], f"{path}.{key}"))
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            out.extend(_undescribed(item, schema["additionalProperties"], f"{path}.{key}"))
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            out.extend(_undescribed(item, schema["items"], f"{path}[{index}]"))
    return out


@pytest.mark.parametrize("cuda", [True, False])
def test_every_field_the_report_writes_is_in_the_schema(cuda: bool) -> None:
    predicate = json.loads(json.dumps(make_report(cuda=cuda).predicate()))
    validate_predicate(predicate)
    assert _undescribed(predicate, predicate_schema(), "predicate") == []


def test_schema_violations_name_the_json_path() -> None:
    predicate = json.loads(json.dumps(make_report().predicate()))
    predicate["kernel"]["build"]["resources"]["registers"] = -1
    where = r"predicate.kernel.build.resources.registers: -1 is less"
    with pytest.raises(VerificationError, match=where):
        validate_predicate(predicate)
    predicate = json.loads(json.dumps(make_report().predicate()))
    predicate["issued_at"] = "yesterday"
    with pytest.raises(VerificationError, match="predicate.issued_at"):
        validate_predicate(predicate)


def test_minimize_stopped_and_scope_notes_are_in_the_schema() -> None:
    import dataclasses

    from kcert.certify.report import ScopeNote

    report = dataclasses.replace(
        make_report(), minimize_stopped={"correctness": "stopped at n=20: the reference raised"},
        scope_notes=(ScopeNote("values", "never near exp's overflow"),
                     ScopeNote("executor", "races cannot show")),
    )  # fmt: skip
    predicate = json.loads(json.dumps(report.predicate()))
    validate_predicate(predicate)
    assert _undescribed(predicate, predicate_schema(), "predicate") == []
    predicate["scope_notes"][0]["kind"] = "vibes"
    with pytest.raises(VerificationError, match="scope_notes"):
        validate_predicate(predicate)

"""Property-based fuzzing of every operation in /openapi.json with all of Schemathesis' checks.

Every check runs on every answer, on SQLite and on PostgreSQL: no 5xx, every
status and content type documented (errors as ``application/problem+json``),
bodies that match their schemas, schema-violating requests refused,
schema-conforming ones accepted, auth enforced where it is declared.
Generation covers both schema-conforming and schema-violating inputs, bounded
(``MAX_EXAMPLES`` per operation and mode) so that each database takes well
under a minute. Requests carry the admin token, so they get past auth and
reach the handlers; ``ignored_auth`` re-sends them without it.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES

MAX_EXAMPLES = 12

#: Schema-conforming requests the registry still refuses, and why no schema can say so.
#: Every other operation must accept what its schema allows (the check's default statuses).
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429"]
REFUSED_BY_MEANING = [
    # The envelope must verify against a trusted key, and its payload be a kcert Statement.
    ("/v1/certificates", "POST", ["422"]),
    # A target's fingerprint needs the drift fields in its environment, by name.
    ("/v1/targets/{name}", "PUT", ["422"]),
    # An observations:write token must name its targets or say all_targets (a rule across
    # two fields and a scope).
    ("/v1/tokens", "POST", ["422"]),
    # Any 64 hex digits match the schema; not all are an Ed25519 point.
    ("/v1/keys", "POST", ["422"]),
    # Log indexes past the log's end (the log's size is not in the schema).
    ("/v1/log/entries", "GET", ["400"]),
    ("/v1/log/proofs/inclusion", "GET", ["400"]),
    ("/v1/log/proofs/consistency", "GET", ["400"]),
]


def _config(token: str) -> SchemathesisConfig:
    operations = [
        {
            "include-path": path,
            "include-method": method,
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED + extra}},
        }
        for path, method, extra in REFUSED_BY_MEANING
    ]
    # A body over the size cap is refused too, before anything parses it.
    refused = [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]
    checks = {"negative_data_rejection": {"expected-statuses": refused}}
    # The token as the bearer scheme's: case.call() sends it, except in the cases that test
    # a missing or bad token (which must get a 401).
    auth = {"openapi": {"HTTPBearer": {"bearer": token}}}
    return SchemathesisConfig.from_dict({"auth": auth, "checks": checks, "operations": operations})


def test_every_check_passes_on_every_operation(app: FastAPI, admin: dict[str, str]) -> None:
    load_all_checks()
    checks = CHECKS.get_all()
    token = admin["Authorization"].removeprefix("Bearer ")
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=_config(token))
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 15  # every route of the API, and the log's
    answered: dict[str, set[int]] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=MAX_EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck),
            )  # fmt: skip
            def fuzz(case: schemathesis.Case[Any]) -> None:
                response = case.call()
                answered.setdefault(case.operation.label, set()).add(response.status_code)
                case.validate_response(response, checks=checks)

            try:
                fuzz()
            except Unsatisfiable:
                # Nothing to make invalid: no parameters, no body, no token.
                assert mode is GenerationMode.NEGATIVE, operation.label
                assert not operation.definition.raw.get("parameters"), operation.label
                assert not operation.definition.raw.get("security"), operation.label
    # The token reached the handlers: every operation answered something other than 401.
    unauthenticated = [label for label, codes in answered.items() if codes <= {401}]
    assert not unauthenticated, answered

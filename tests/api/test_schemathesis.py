"""Property-based fuzzing of every operation in /openapi.json: no input produces a 5xx.

Bounded (``MAX_EXAMPLES`` per operation) so it runs in CI in about a minute.
Requests carry the admin token, so they get past auth and reach the handlers;
the unauthenticated paths are covered by test_auth.py. Generation covers both
schema-conforming and schema-violating inputs (schemathesis' default modes).
"""

from __future__ import annotations

from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

MAX_EXAMPLES = 25


def test_no_request_produces_a_server_error(app: FastAPI, admin: dict[str, str]) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 15  # every route of DESIGN.md's API, and the log's
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES, deadline=None, database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        def fuzz(case: schemathesis.Case[Any]) -> None:
            response = case.call(headers=admin)
            case.validate_response(response, checks=[not_a_server_error])

        fuzz()

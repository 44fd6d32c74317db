"""The OpenAPI document lists every problem response, as ``application/problem+json``."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def operations(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{method.upper()} {path}", operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


def test_every_error_response_is_a_documented_problem(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    problem = document["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for label, operation in operations(document):
        responses = operation["responses"]
        for status, response in responses.items():
            if status[0] in "45":
                assert response["content"] == PROBLEM, (label, status)
        expected = {"503"}
        if operation.get("security"):
            expected |= {"401", "403"}
        if "requestBody" in operation:
            expected |= {"413", "422"}
        if operation.get("parameters"):
            expected |= {"422"}
        if any(p["in"] == "path" for p in operation.get("parameters", [])):
            expected |= {"404"}
        assert expected <= set(responses), (label, sorted(responses))


def test_domain_errors_are_listed(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert "409" in document["paths"]["/v1/promotions"]["post"]["responses"]
    assert "409" in document["paths"]["/v1/keys"]["post"]["responses"]
    assert "401" not in document["paths"]["/v1/log/checkpoint"]["get"]["responses"]

"""The OpenAPI document, with every problem response an operation can give (RFC 9457).

FastAPI documents a route's answers and its own ``422`` (as
``application/json`` with its ``HTTPValidationError`` schema). The registry
answers every error as ``application/problem+json``, from its one exception
handler and from middleware that FastAPI never sees, so
:func:`problem_openapi` rewrites the generated document once:

- every error response a route declares (unless it names a media type other
  than JSON), and FastAPI's ``422``, becomes ``application/problem+json``
  with the ``Problem`` schema;
- what every operation of a kind can answer is added to it: ``401`` and
  ``403`` where it needs a token, ``413`` where it takes a body, ``422``
  where it takes a body or parameters, ``400`` where the library may refuse a
  parameter, and ``503`` (the database) everywhere.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from kcert.api.problems import PROBLEM_MEDIA_TYPE

_REF = "#/components/schemas/Problem"

#: Why each added status comes, as the document says it.
_ADDED = {
    400: "Bad request: a value the registry cannot use",
    401: "No token, or an unknown, expired or revoked one",
    403: "The token lacks the scope this operation needs",
    404: "No such resource",
    413: "The request body is over the registry's size cap",
    422: "The request is invalid (body, path or query)",
    503: "The registry's database is unavailable; try again",
}


class Problem(BaseModel):
    """RFC 9457 problem details; ``type`` is stable per kind of error."""

    model_config = ConfigDict(extra="allow", title="Problem")

    type: str = Field(description="A URI naming the kind of problem")
    title: str
    status: int = Field(ge=400, le=599)
    detail: str = Field(description="What went wrong, for a person to act on")
    instance: str | None = Field(default=None, description="The request's path")


def _problem_content() -> dict[str, Any]:
    return {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": _REF}}}


def _statuses(operation: dict[str, Any]) -> set[int]:
    statuses = {503}
    if operation.get("security"):
        statuses |= {401, 403}
    parameters = operation.get("parameters", [])
    if "requestBody" in operation:
        statuses |= {413, 422}
    if parameters:
        statuses |= {400, 422}
    if any(p.get("in") == "path" for p in parameters):
        statuses.add(404)
    return statuses


def with_problems(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (an OpenAPI 3.1 dict) with problem responses throughout, changed in place."""
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            responses: dict[str, Any] = operation.setdefault("responses", {})
            for added in _statuses(operation):
                responses.setdefault(str(added), {"description": _ADDED[added]})
            for status, response in responses.items():
                # A route that declares another media type for an error keeps it (a protocol
                # of its own, such as a witness's); JSON errors are problems.
                declared = set(response.get("content", {}))
                if status[0] in "45" and declared <= {"application/json", PROBLEM_MEDIA_TYPE}:
                    response["content"] = _problem_content()
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    # FastAPI's own 422 schemas are no longer referenced by anything.
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document


def problem_openapi(app: FastAPI) -> dict[str, Any]:
    """What ``app.openapi`` returns: FastAPI's document with the problem responses, cached."""
    if app.openapi_schema is None:
        document = get_openapi(
            title=app.title, version=app.version, openapi_version=app.openapi_version,
            description=app.description, routes=app.routes,
        )  # fmt: skip
        app.openapi_schema = with_problems(document)
    return app.openapi_schema


def install(app: FastAPI) -> None:
    """Serve :func:`problem_openapi` at ``/openapi.json``."""

    def openapi() -> dict[str, Any]:
        return problem_openapi(app)

    app.openapi = openapi  # type: ignore[method-assign]

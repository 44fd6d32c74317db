"""docs/api.md lists exactly the operations the served OpenAPI document has."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROW = re.compile(r"^\| `(GET|POST|PUT|DELETE|PATCH) (/[^`?]*)[^`]*` \| ([^|]+) \|", re.MULTILINE)


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def test_docs_api_md_lists_every_route_with_its_access(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    served = {
        f"{method.upper()} {_shape(path)}": bool(operation.get("security"))
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    documented = {f"{m} {_shape(p)}": scope.strip() for m, p, scope in ROW.findall(DOC.read_text())}
    assert set(documented) == set(served), {
        "served, not documented": sorted(set(served) - set(documented)),
        "documented, not served": sorted(set(documented) - set(served)),
    }
    for route, needs_token in served.items():
        # a route that takes a bearer token names its scope; only the log's are public
        assert (documented[route] != "public") == needs_token, route

"""Where an auditor reads a log from: a remote registry over HTTP, or anything alike.

:class:`LogSource` is what the auditing code needs and nothing more; the
registry offers a database-backed one for the embedded registry
(:class:`kcert.registry.log_source.DatabaseLogSource`), this module the HTTP one.
Nothing a source returns is trusted: the auditor checks it all against a
checkpoint signed by the pinned key.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Protocol

import httpx

from kcert.log.errors import LogRangeError, LogSourceError


class LogSource(Protocol):
    #: Who is being audited, for messages and for naming the local state.
    label: str

    def checkpoint(self) -> str: ...

    def verifier_key(self) -> str: ...

    def entries(self, start: int, end: int) -> list[tuple[int, bytes]]: ...

    def inclusion_proof(self, index: int, size: int) -> list[bytes]: ...

    def consistency_proof(self, first: int, second: int) -> list[bytes]: ...


class HttpLogSource:
    """The public ``/v1/log`` routes of a registry."""

    def __init__(
        self, base_url: str, *, client: httpx.Client | None = None, token: str | None = None
    ) -> None:
        self.label = base_url.rstrip("/")
        #: A client the caller passed stays the caller's to close.
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=30.0)
        #: Sent only where the registry needs it (certificates), never to the log routes.
        self._token = token

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def _get(self, path: str, params: dict[str, int] | None = None) -> httpx.Response:
        url = f"{self.label}/v1/log/{path}"
        try:
            response = self._client.get(url, params=params)
        except httpx.HTTPError as exc:
            raise LogSourceError(f"cannot reach {url}: {exc}") from exc
        if response.status_code == 400:
            raise LogRangeError(_detail(response))
        if response.status_code != 200:
            raise LogSourceError(f"{url} answered {response.status_code}: {_detail(response)}")
        return response

    def _json(self, path: str, params: dict[str, int]) -> dict[str, Any]:
        response = self._get(path, params)
        try:
            value = response.json()
        except ValueError as exc:
            raise LogSourceError(f"{self.label}/v1/log/{path} did not answer JSON") from exc
        if not isinstance(value, dict):
            raise LogSourceError(f"{self.label}/v1/log/{path} did not answer a JSON object")
        return value

    def checkpoint(self) -> str:
        return self._get("checkpoint").text

    def verifier_key(self) -> str:
        return self._get("key").text.strip()

    def entries(self, start: int, end: int) -> list[tuple[int, bytes]]:
        body = self._json("entries", {"start": start, "end": end})
        try:
            return [(int(e["index"]), _unb64(e["leaf"])) for e in body["entries"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise LogSourceError(f"{self.label} served malformed entries") from exc

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        body = self._json("proofs/inclusion", {"index": index, "size": size})
        return self._hashes(body)

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        body = self._json("proofs/consistency", {"first": first, "second": second})
        return self._hashes(body)

    def certificate_envelope(self, certificate: str) -> dict[str, Any] | None:
        """A stored certificate (not a log route: it needs a token with read scope)."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        url = f"{self.label}/v1/certificates/{certificate}/envelope"
        try:
            response = self._client.get(url, headers=headers)
            value = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def mismatch_evidence(self, mismatch_id: int) -> dict[str, Any] | None:
        """A runtime mismatch's evidence (``GET /v1/observations/mismatches/{id}/evidence``)."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        url = f"{self.label}/v1/observations/mismatches/{int(mismatch_id)}/evidence"
        try:
            response = self._client.get(url, headers=headers)
            value = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def _hashes(self, body: dict[str, Any]) -> list[bytes]:
        try:
            return [_unb64(h) for h in body["hashes"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise LogSourceError(f"{self.label} served a malformed proof") from exc


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError("not base64") from exc


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return str(body["detail"])
    return response.text[:200]

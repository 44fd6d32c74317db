"""Content addresses as values, and the canonical bytes they are taken over.

A :class:`Digest` is always SHA-256 and prints as ``sha256:<hex>``. Anything
that gets hashed or signed as JSON goes through :func:`canonical_json`
(RFC 8785), so two parties that agree on the value agree on the bytes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rfc8785

from kcert.errors import KcertError

_HEX = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class DigestError(KcertError):
    kind = "bad-digest"


@dataclass(frozen=True, slots=True, order=True)
class Digest:
    """A SHA-256 content address."""

    hex: str

    def __post_init__(self) -> None:
        if not _HEX.match(self.hex):
            raise DigestError(f"not a SHA-256 hex digest: {self.hex!r}")

    def __str__(self) -> str:
        return f"sha256:{self.hex}"

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Parse ``sha256:<64 lowercase hex>`` (a bare 64-hex string is accepted too)."""
        value = text.strip()
        if value.startswith("sha256:"):
            value = value[len("sha256:") :]
        if not _HEX.match(value):
            raise DigestError(
                f"not a content address: {text!r}; expected 'sha256:' and 64 lowercase hex digits"
            )
        return cls(value)

    @classmethod
    def of_bytes(cls, data: bytes) -> Digest:
        return cls(hashlib.sha256(data).hexdigest())

    @classmethod
    def of_file(cls, path: Path) -> Digest:
        """Hash a file by streaming it, never holding it whole in memory."""
        h = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
        return cls(h.hexdigest())

    @classmethod
    def of_json(cls, value: Any) -> Digest:
        return cls.of_bytes(canonical_json(value))


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical bytes of a JSON value."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise DigestError(f"value cannot be written as canonical JSON: {exc}") from exc

"""The bytes of one audit log leaf, and the checks an auditor makes on them.

A leaf is the RFC 8785 canonical JSON of::

    {"format": "kcert-log-leaf/v1", "index": N, "kind": "<event kind>",
     "payload": {...}, "time": "YYYY-MM-DDTHH:MM:SS.ffffffZ"}

``index`` is the leaf's own position, so a dropped or reordered leaf is caught
by reading the leaves alone and named by the first position that disagrees.
``payload`` carries everything needed to re-decide the event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kcert.digest import canonical_json
from kcert.errors import KcertError

LEAF_FORMAT = "kcert-log-leaf/v1"


def build_leaf(*, index: int, kind: str, payload: Mapping[str, Any], time: datetime) -> bytes:
    """The canonical bytes of one leaf."""
    return canonical_json(
        {
            "format": LEAF_FORMAT,
            "index": index,
            "kind": kind,
            "payload": dict(payload),
            "time": time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    )


@dataclass(frozen=True, slots=True)
class Leaf:
    index: int
    kind: str
    payload: Mapping[str, Any]
    time: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "payload": dict(self.payload),
                "time": self.time}  # fmt: skip


class LeafError(ValueError):
    """Why the bytes at a position are not the leaf that belongs there."""


def parse_leaf(position: int, data: bytes) -> Leaf:
    """Decode the leaf stored at ``position``; raise :class:`LeafError` saying what is wrong."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LeafError(f"entry {position} is not JSON") from exc
    if not isinstance(value, dict) or value.get("format") != LEAF_FORMAT:
        raise LeafError(f"entry {position} is not a {LEAF_FORMAT} leaf")
    index, kind, payload, time = (value.get(k) for k in ("index", "kind", "payload", "time"))
    if index != position:
        raise LeafError(f"entry {position} says it is entry {index}: dropped or reordered")
    if not isinstance(kind, str) or not isinstance(payload, dict) or not isinstance(time, str):
        raise LeafError(f"entry {position} lacks its kind, payload or time")
    try:
        canonical = canonical_json(value)
    except KcertError as exc:
        raise LeafError(f"entry {position} cannot be written canonically") from exc
    if canonical != data:
        raise LeafError(f"entry {position} is not in canonical form (RFC 8785)")
    return Leaf(index, kind, payload, time)

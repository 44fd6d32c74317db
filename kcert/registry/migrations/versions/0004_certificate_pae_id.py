"""A certificate's id becomes ``sha256:`` of its DSSE PAE bytes (the signed bytes).

Before, the id was ``sha256`` of the RFC 8785 JSON of the whole envelope, which
covers fields no signature does (a ``keyid`` hint, extra or repeated signatures),
so one signed statement could be stored, and revoked, under many ids. Upgrade:

- recomputes every certificate's id from its envelope's payload type and payload;
- merges the rows that now share an id into one row: the earliest stored row's
  signer and time, revoked if any of them was (the earliest revocation), and one
  canonical envelope holding the signatures that verify against a key in
  ``trusted_key`` (revoked keys included: they verified when pushed), one per
  key, named by the real key id, sorted by it;
- points every reference at the new id: subjects, stale marks, promotions;
- records each old id in ``certificate_alias`` with the envelope stored under it,
  because the audit log is immutable history and its leaves keep the old ids
  (replay and ``kcert revoke`` resolve them there).

Downgrade restores one row per alias, with its own envelope and the merged
row's state (so a revocation made after the upgrade is kept on every old row),
and gives rows stored after the upgrade their old-rule id; references go to the
smallest old id of their certificate.

Revision ID: 0004_certificate_pae_id
Revises: 0003_certificate_sandboxed
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import rfc8785
import sqlalchemy as sa
from alembic import op
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

revision = "0004_certificate_pae_id"
down_revision = "0003_certificate_sandboxed"
branch_labels = None
depends_on = None

#: Rows read per statement (envelopes run to megabytes).
_BATCH = 200

_COLUMNS = (
    "id", "kernel_name", "source_digest", "keyid", "verdict", "hw_class", "fingerprint",
    "envelope", "environment", "sandboxed", "created_at", "revoked_at", "revoke_reason",
)  # fmt: skip
_certificate = sa.table(
    "certificate",
    *(sa.column(n) for n in _COLUMNS if n not in ("environment", "created_at", "revoked_at")),
    sa.column("environment", sa.JSON()),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("revoked_at", sa.DateTime(timezone=True)),
)
_subject = sa.table(
    "certificate_subject", sa.column("digest"), sa.column("certificate_id"), sa.column("name")
)
_stale = sa.table("stale_certificate", sa.column("certificate_id"))
_promotion = sa.table("promotion", sa.column("certificate_id"))
_key = sa.table("trusted_key", sa.column("keyid"), sa.column("public_key"))
_alias = sa.table(
    "certificate_alias", sa.column("old_id"), sa.column("certificate_id"), sa.column("envelope")
)


def upgrade() -> None:
    op.create_table(
        "certificate_alias",
        sa.Column("old_id", sa.String(length=71), primary_key=True),
        sa.Column("certificate_id", sa.String(length=71), nullable=False),
        sa.Column("envelope", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["certificate_id"], ["certificate.id"]),
    )
    op.create_index("ix_certificate_alias_certificate_id", "certificate_alias", ["certificate_id"])
    connection = op.get_bind()
    keys = {
        keyid: Ed25519PublicKey.from_public_bytes(bytes.fromhex(public))
        for keyid, public in connection.execute(sa.select(_key.c.keyid, _key.c.public_key))
    }
    groups: dict[str, list[str]] = defaultdict(list)
    for cid, new_id in _pages(connection, _certificate.c.envelope, _envelope_pae_id):
        groups[new_id].append(cid)
    for new_id, old_ids in sorted(groups.items()):
        rows = _rows(connection, old_ids)
        first = min(rows, key=lambda r: (r["created_at"], r["id"]))
        revoked = sorted((r for r in rows if r["revoked_at"] is not None),
                         key=lambda r: (r["revoked_at"], r["id"]))  # fmt: skip
        merged = dict(first, id=new_id, envelope=_canonical([r["envelope"] for r in rows], keys))
        if revoked:
            merged.update(revoked_at=revoked[0]["revoked_at"],
                          revoke_reason=revoked[0]["revoke_reason"])  # fmt: skip
        _replace(connection, rows, merged, target_for_refs=new_id)
        if all(r["id"] == new_id for r in rows):
            continue
        connection.execute(
            sa.insert(_alias),
            [{"old_id": r["id"], "certificate_id": new_id, "envelope": r["envelope"]}
             for r in rows if r["id"] != new_id],
        )  # fmt: skip


def downgrade() -> None:
    connection = op.get_bind()
    aliases: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for old_id, cid, envelope in connection.execute(
        sa.select(_alias.c.old_id, _alias.c.certificate_id, _alias.c.envelope)
    ):
        aliases[cid].append((old_id, envelope))
    connection.execute(sa.delete(_alias))
    for cid, _ in _pages(connection, _certificate.c.id, str):
        (row,) = _rows(connection, [cid])
        stored_since = [(_json_id(json.loads(row["envelope"])), row["envelope"])]
        olds = sorted(aliases.get(cid) or stored_since)
        restored = [dict(row, id=old_id, envelope=envelope) for old_id, envelope in olds]
        _replace(connection, [row], *restored, target_for_refs=olds[0][0])
    op.drop_index("ix_certificate_alias_certificate_id", table_name="certificate_alias")
    op.drop_table("certificate_alias")


def _replace(
    connection: sa.Connection, old: Sequence[Mapping[str, Any]], *new: Mapping[str, Any],
    target_for_refs: str,
) -> None:  # fmt: skip
    """Put ``new`` rows in place of ``old`` ones, moving every reference to ``target_for_refs``."""
    old_ids = [r["id"] for r in old]
    subjects = {
        (digest, name)
        for digest, name in connection.execute(
            sa.select(_subject.c.digest, _subject.c.name).where(
                _subject.c.certificate_id.in_(old_ids)
            )
        )
    }
    by_digest = dict(sorted(subjects))
    # A row already under its new id (stored by a registry that named it so) is updated
    # in place; every other row is inserted and its predecessors deleted.
    kept = {r["id"] for r in new} & set(old_ids)
    for row in new:
        if row["id"] in kept:
            values = {k: v for k, v in row.items() if k != "id"}
            connection.execute(
                sa.update(_certificate).where(_certificate.c.id == row["id"]).values(values)
            )
        else:
            connection.execute(sa.insert(_certificate), [dict(row)])
    for table in (_stale, _promotion):
        connection.execute(
            sa.update(table)
            .where(table.c.certificate_id.in_(old_ids))
            .values(certificate_id=target_for_refs)
        )
    connection.execute(sa.delete(_subject).where(_subject.c.certificate_id.in_(old_ids)))
    if by_digest:
        connection.execute(
            sa.insert(_subject),
            [{"digest": d, "certificate_id": r["id"], "name": n}
             for r in new for d, n in by_digest.items()],
        )  # fmt: skip
    gone = [i for i in old_ids if i not in kept]
    connection.execute(sa.delete(_certificate).where(_certificate.c.id.in_(gone)))


def _pages(
    connection: sa.Connection, value: Any, keep: Callable[[Any], str]
) -> list[tuple[str, str]]:
    """``(id, keep(value))`` for every row, read a page at a time by id, so that only what
    ``keep`` makes of an envelope stays in memory and no cursor is open while writing."""
    out: list[tuple[str, str]] = []
    last = ""
    while True:
        page = connection.execute(
            sa.select(_certificate.c.id, value)
            .where(_certificate.c.id > last)
            .order_by(_certificate.c.id)
            .limit(_BATCH)
        ).all()
        if not page:
            return out
        out.extend((str(k), keep(v)) for k, v in page)
        last = page[-1][0]


def _rows(connection: sa.Connection, ids: Sequence[str]) -> list[dict[str, Any]]:
    result = connection.execute(sa.select(_certificate).where(_certificate.c.id.in_(ids)))
    return [dict(r._mapping) for r in result]


# --- the two id rules and the canonical envelope, written out here so this migration keeps
# its meaning whatever kcert.attest later becomes --------------------------------------------


def _b64(text: str) -> bytes:
    padded = text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4)
    if "-" in padded or "_" in padded:
        return base64.urlsafe_b64decode(padded)
    return base64.b64decode(padded, validate=True)


def _pae(envelope: Mapping[str, Any]) -> bytes:
    kind = str(envelope["payloadType"]).encode("utf-8")
    body = _b64(str(envelope["payload"]))
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(body), body)


def _envelope_pae_id(text: str) -> str:
    return _pae_id(json.loads(text))


def _pae_id(envelope: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(_pae(envelope)).hexdigest()


def _json_id(envelope: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(rfc8785.dumps(dict(envelope))).hexdigest()


def _canonical(envelopes: Sequence[str], keys: Mapping[str, Ed25519PublicKey]) -> str:
    """One envelope with every signature (from any of ``envelopes``) that verifies."""
    documents = [json.loads(e) for e in envelopes]
    message = _pae(documents[0])
    found: dict[str, str] = {}
    for document in documents:
        for signature in document.get("signatures", []):
            try:
                sig = _b64(str(signature["sig"]))
            except (KeyError, TypeError, ValueError, binascii.Error):
                continue
            for keyid, public in keys.items():
                if keyid in found or len(sig) != 64:
                    continue
                try:
                    public.verify(sig, message)
                except InvalidSignature:
                    continue
                found[keyid] = base64.standard_b64encode(sig).decode("ascii")
                break
    if not found:
        # Every stored envelope verified when pushed; one whose key left the table is
        # kept as it was rather than left with no signature at all.
        return envelopes[0]
    canonical = {
        "payload": base64.standard_b64encode(_b64(str(documents[0]["payload"]))).decode("ascii"),
        "payloadType": documents[0]["payloadType"],
        "signatures": [{"keyid": k, "sig": found[k]} for k in sorted(found)],
    }
    return rfc8785.dumps(canonical).decode("utf-8")

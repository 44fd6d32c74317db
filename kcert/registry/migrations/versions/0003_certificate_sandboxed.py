"""Certificates record whether their kernel ran in the certifier's sandbox.

``certificate.sandboxed`` is true only when the stored certificate's predicate
says ``certifier.confinement.sandbox: true``; ``--no-sandbox`` certificates and
those from certifiers that predate the record are false. Upgrade fills the
column for the rows already stored, from their envelopes.

Revision ID: 0003_certificate_sandboxed
Revises: 0002_audit_log
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0003_certificate_sandboxed"
down_revision = "0002_audit_log"
branch_labels = None
depends_on = None

#: Rows read, and rows updated, per statement (bounded pages and IN lists).
_BATCH = 500

_certificate = sa.table(
    "certificate",
    sa.column("id", sa.String()),
    sa.column("envelope", sa.Text()),
    sa.column("sandboxed", sa.Boolean()),
)


def upgrade() -> None:
    # NOT NULL with a false default: every existing row starts "not known to be sandboxed".
    op.add_column(
        "certificate",
        sa.Column("sandboxed", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    connection = op.get_bind()
    # Envelopes run to megabytes: read them a page at a time (by id), keep only the ids,
    # and write after reading (no cursor open on SQLite while it is written).
    sandboxed: list[str] = []
    last = ""
    while True:
        page = connection.execute(
            sa.select(_certificate.c.id, _certificate.c.envelope)
            .where(_certificate.c.id > last)
            .order_by(_certificate.c.id)
            .limit(_BATCH)
        ).all()
        if not page:
            break
        sandboxed.extend(cid for cid, envelope in page if _records_sandbox(envelope))
        last = page[-1][0]
    for start in range(0, len(sandboxed), _BATCH):
        connection.execute(
            sa.update(_certificate)
            .where(_certificate.c.id.in_(sandboxed[start : start + _BATCH]))
            .values(sandboxed=True)
        )


def downgrade() -> None:
    op.drop_column("certificate", "sandboxed")


def _records_sandbox(envelope: str) -> bool:
    """As ``kcert.registry.policy.records_sandbox`` on the envelope's predicate, written
    out here so this migration keeps its meaning whatever the package later becomes."""
    try:
        payload = json.loads(envelope)["payload"]
        statement: Any = json.loads(base64.b64decode(payload, validate=True))
        confinement = statement["predicate"]["certifier"]["confinement"]
        return bool(confinement["sandbox"] is True)
    except (KeyError, TypeError, ValueError, binascii.Error):
        # Stored envelopes were verified when pushed; anything unreadable is not known
        # to be sandboxed, which is what false means.
        return False

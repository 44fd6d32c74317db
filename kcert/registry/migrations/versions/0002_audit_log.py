"""The audit log: its one state row, its leaves and its perfect subtrees.

Revision ID: 0002_audit_log
Revises: 0001_registry
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_audit_log"
down_revision = "0001_registry"
branch_labels = None
depends_on = None

_INDEX = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    state = op.create_table(
        "log_state",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "log_entry",
        # On SQLite only INTEGER PRIMARY KEY is the rowid itself (one B-tree, not two).
        sa.Column("leaf_index", _INDEX, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("leaf", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_log_entry_kind", "log_entry", ["kind"])
    op.create_table(
        "log_node",
        sa.Column("level", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("position", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        # Small rows looked up by their key only: store them in the key's B-tree.
        sqlite_with_rowid=False,
    )
    # Appends lock this row, so it must exist before the first one.
    op.bulk_insert(state, [{"id": 1, "size": 0}])


def downgrade() -> None:
    op.drop_table("log_node")
    op.drop_index("ix_log_entry_kind", table_name="log_entry")
    op.drop_table("log_entry")
    op.drop_table("log_state")

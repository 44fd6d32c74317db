"""API tokens name the targets they may report for.

``api_token.targets`` (JSON list of target names, or null for every target)
binds an ``observations:write`` token to the targets whose guard reports and
perf samples it may send. Tokens made before this revision keep null: they
were made when a token could report for every target, and still can.

Revision ID: 0007_token_targets
Revises: 0006_registry_version
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_token_targets"
down_revision = "0006_registry_version"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN, never a batch rebuild: rebuilding api_token on SQLite would drop
    # the registry_version triggers of 0006, and the gate's cache would miss revocations.
    op.add_column("api_token", sa.Column("targets", sa.JSON(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        # SQLite 3.35+ drops a column in place (the triggers stay, as above).
        op.execute("ALTER TABLE api_token DROP COLUMN targets")
    else:
        op.drop_column("api_token", "targets")

"""API tokens name the targets they may report for.

``api_token.targets`` (JSON list of target names, or null for every target)
binds an ``observations:write`` token to the targets whose guard reports and
perf samples it may send. Tokens made before this revision keep null: they
were made when a token could report for every target, and still can.

Revision ID: 0006_token_targets
Revises: 0005_observations
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006_token_targets"
down_revision = "0005_observations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_token") as batch:
        batch.add_column(sa.Column("targets", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_token") as batch:
        batch.drop_column("targets")

"""The registry's tables: keys, certificates and their subjects, targets and their
history, stale marks, promotions and API tokens.

Revision ID: 0001_registry
Revises:
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_registry"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_token",
        sa.Column("id", sa.String(length=32), primary_key=True),
        sa.Column("description", sa.String(length=256), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("expires_at", _WHEN, nullable=True),
        sa.Column("revoked_at", _WHEN, nullable=True),
    )
    op.create_index("ix_api_token_token_hash", "api_token", ["token_hash"], unique=True)

    op.create_table(
        "trusted_key",
        sa.Column("keyid", sa.String(length=64), primary_key=True),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("public_key", sa.String(length=64), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("revoked_at", _WHEN, nullable=True),
        sa.Column("revoke_reason", sa.Text(), nullable=True),
    )

    op.create_table(
        "certificate",
        sa.Column("id", sa.String(length=71), primary_key=True),
        sa.Column("kernel_name", sa.String(length=256), nullable=False),
        sa.Column("source_digest", sa.String(length=71), nullable=False),
        sa.Column("keyid", sa.String(length=64), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("hw_class", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=71), nullable=False),
        sa.Column("envelope", sa.Text(), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("revoked_at", _WHEN, nullable=True),
        sa.Column("revoke_reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_certificate_keyid", "certificate", ["keyid"])
    # Drift looks up "certificates of this hardware in that environment".
    op.create_index("ix_certificate_hw_fingerprint", "certificate", ["hw_class", "fingerprint"])

    # The primary key leads with the digest: it is the gate's lookup.
    op.create_table(
        "certificate_subject",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("certificate_id", sa.String(length=71), nullable=False),
        sa.Column("name", sa.String(length=512), nullable=False),
        sa.ForeignKeyConstraint(["certificate_id"], ["certificate.id"]),
        sa.PrimaryKeyConstraint("digest", "certificate_id"),
    )

    op.create_table(
        "target",
        sa.Column("name", sa.String(length=128), primary_key=True),
        sa.Column("hw_class", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=71), nullable=False),
        sa.Column("drift_fields", sa.JSON(), nullable=True),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("updated_at", _WHEN, nullable=False),
    )

    op.create_table(
        "target_history",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("target_name", sa.String(length=128), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("hw_class", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=71), nullable=False),
        sa.Column("drift_fields", sa.JSON(), nullable=True),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("reported_at", _WHEN, nullable=False),
        sa.ForeignKeyConstraint(["target_name"], ["target.name"]),
    )
    op.create_index("ix_target_history_target_name", "target_history", ["target_name"])

    op.create_table(
        "stale_certificate",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("certificate_id", sa.String(length=71), nullable=False),
        sa.Column("target_name", sa.String(length=128), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("old_fingerprint", sa.String(length=71), nullable=False),
        sa.Column("new_fingerprint", sa.String(length=71), nullable=False),
        sa.Column("marked_at", _WHEN, nullable=False),
        sa.ForeignKeyConstraint(["certificate_id"], ["certificate.id"]),
        sa.ForeignKeyConstraint(["target_name"], ["target.name"]),
    )
    op.create_index("ix_stale_certificate_certificate_id", "stale_certificate", ["certificate_id"])
    op.create_index("ix_stale_certificate_target_name", "stale_certificate", ["target_name"])

    op.create_table(
        "promotion",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kernel", sa.String(length=71), nullable=False),
        sa.Column("target_name", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("certificate_id", sa.String(length=71), nullable=False),
        sa.Column("granted_at", _WHEN, nullable=False),
        sa.Column("suspended_at", _WHEN, nullable=True),
        sa.Column("suspend_reason", sa.Text(), nullable=True),
        sa.Column("log_index", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["certificate_id"], ["certificate.id"]),
        sa.ForeignKeyConstraint(["target_name"], ["target.name"]),
        # One promotion per (kernel, target); also the gate's lookup.
        sa.UniqueConstraint("kernel", "target_name", name="uq_promotion_kernel"),
    )
    op.create_index("ix_promotion_target_name", "promotion", ["target_name"])


def downgrade() -> None:
    op.drop_index("ix_promotion_target_name", table_name="promotion")
    op.drop_table("promotion")
    op.drop_index("ix_stale_certificate_target_name", table_name="stale_certificate")
    op.drop_index("ix_stale_certificate_certificate_id", table_name="stale_certificate")
    op.drop_table("stale_certificate")
    op.drop_index("ix_target_history_target_name", table_name="target_history")
    op.drop_table("target_history")
    op.drop_table("target")
    op.drop_table("certificate_subject")
    op.drop_index("ix_certificate_hw_fingerprint", table_name="certificate")
    op.drop_index("ix_certificate_keyid", table_name="certificate")
    op.drop_table("certificate")
    op.drop_table("trusted_key")
    op.drop_index("ix_api_token_token_hash", table_name="api_token")
    op.drop_table("api_token")

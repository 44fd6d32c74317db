"""The registry's version: one counter that every write to a table the gate reads raises.

The gate caches its answers per process and reuses one only while the
version it was computed at is still current. The counter is raised by
database triggers, not by application code, so no write can skip it: one
made through any helper, through raw SQL, from another process or from a
tool that knows nothing of kcert. It commits (or rolls back) with the
write that raised it, so a reader that sees the new rows also sees the new
version.

- ``registry_version``: one row (id 1) holding ``version``.
- A trigger on each table a gate answer or a gate token depends on
  (:data:`VERSIONED_TABLES`) raises it after every insert, update or delete
  (and truncate, on PostgreSQL). SQLite triggers run per row; PostgreSQL's
  per statement, since one raise per statement is all a reader needs.

Revision ID: 0006_registry_version
Revises: 0005_observations
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_registry_version"
down_revision = "0005_observations"
branch_labels = None
depends_on = None

#: What the gate reads: the target and promotion (one join), the kernel's certificates with
#: their subjects and signers, and the presented token.
VERSIONED_TABLES = (
    "api_token", "certificate", "certificate_subject", "promotion", "target", "trusted_key",
)  # fmt: skip
_BUMP = "UPDATE registry_version SET version = version + 1 WHERE id = 1"
_PG_FUNCTION = "kcert_bump_registry_version"


def upgrade() -> None:
    op.create_table(
        "registry_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
    )
    op.execute("INSERT INTO registry_version (id, version) VALUES (1, 0)")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"CREATE FUNCTION {_PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN {_BUMP}; RETURN NULL; END $$"
        )
        for table in VERSIONED_TABLES:
            op.execute(
                f"CREATE TRIGGER {_trigger(table)} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
                f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {_PG_FUNCTION}()"
            )
        return
    for table in VERSIONED_TABLES:
        for event in ("insert", "update", "delete"):
            op.execute(
                f"CREATE TRIGGER {_trigger(table, event)} AFTER {event.upper()} ON {table} "
                f"BEGIN {_BUMP}; END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in VERSIONED_TABLES:
            op.execute(f"DROP TRIGGER {_trigger(table)} ON {table}")
        op.execute(f"DROP FUNCTION {_PG_FUNCTION}()")
    else:
        for table in VERSIONED_TABLES:
            for event in ("insert", "update", "delete"):
                op.execute(f"DROP TRIGGER {_trigger(table, event)}")
    op.drop_table("registry_version")


def _trigger(table: str, event: str | None = None) -> str:
    return f"kcert_version_{table}" + (f"_{event}" if event else "")

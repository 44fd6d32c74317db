"""Tables of the audit log: its size, its leaves and its perfect subtrees.

The schema itself is made by the Alembic migration ``0002_audit_log``; these
classes only describe it to SQLAlchemy. ``log_state`` holds exactly one row:
appending takes that row's lock (``UPDATE ... RETURNING``), which is what keeps
the order of leaves total when several API processes write to PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Column, DateTime, Integer, LargeBinary, SmallInteger, String
from sqlmodel import Field, SQLModel

#: The id of the single ``log_state`` row.
LOG_STATE_ID = 1


class LogState(SQLModel, table=True):
    """How many leaves the log holds; the row every append locks."""

    __tablename__ = "log_state"

    id: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    size: int = Field(sa_column=Column(BigInteger, nullable=False))


class LogEntry(SQLModel, table=True):
    """One leaf: its exact canonical bytes, which are what the tree hashes."""

    __tablename__ = "log_entry"

    leaf_index: int = Field(
        sa_column=Column(
            BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=False
        )
    )
    kind: str = Field(sa_column=Column(String(64), nullable=False, index=True))
    leaf: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    recorded_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class LogNode(SQLModel, table=True):
    """The hash of the complete perfect subtree ``(level, position)``; level 0 holds leaf hashes."""

    __tablename__ = "log_node"
    __table_args__ = {"sqlite_with_rowid": False}

    level: int = Field(sa_column=Column(SmallInteger, primary_key=True, autoincrement=False))
    position: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    hash: bytes = Field(sa_column=Column(LargeBinary, nullable=False))

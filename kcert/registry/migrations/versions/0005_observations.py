"""Runtime observations: guard reports, mismatches with evidence, latency, target policies.

``observation_report`` holds each report of ``kcert.guard`` once (by digest),
``observation_mismatch`` each mismatch with its evidence bytes,
``latency_histogram`` the guard's histograms and ``latency_sample`` durations
ingested from traces (``kcert perf ingest``). ``target_policy`` says what a
confirmed mismatch does on a target and how much p99 a promotion may regress.

Revision ID: 0005_observations
Revises: 0004_certificate_pae_id
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_observations"
down_revision = "0004_certificate_pae_id"
branch_labels = None
depends_on = None


def _when(name: str) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "target_policy",
        sa.Column("target_name", sa.String(128), sa.ForeignKey("target.name"), primary_key=True),
        sa.Column("on_mismatch", sa.String(16), nullable=False),
        sa.Column("max_p99_regression_pct", sa.Float(), nullable=True),
        sa.Column("min_samples", sa.Integer(), nullable=False),
        _when("updated_at"),
        sa.Column("log_index", sa.Integer(), nullable=True),
    )
    op.create_table(
        "observation_report",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("digest", sa.String(71), nullable=False, unique=True),
        sa.Column("kernel", sa.String(71), nullable=False, index=True),
        sa.Column("target_name", sa.String(128), sa.ForeignKey("target.name"), nullable=False,
                  index=True),
        sa.Column("certificate_id", sa.String(71), sa.ForeignKey("certificate.id"),
                  nullable=False),
        _when("window_start"),
        _when("window_end"),
        sa.Column("calls_seen", sa.BigInteger(), nullable=False),
        sa.Column("calls_checked", sa.BigInteger(), nullable=False),
        sa.Column("dropped", sa.BigInteger(), nullable=False),
        sa.Column("out_of_scope", sa.BigInteger(), nullable=False),
        _when("received_at"),
    )  # fmt: skip
    op.create_table(
        "observation_mismatch",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("report_id", sa.Integer(), sa.ForeignKey("observation_report.id"),
                  nullable=False, index=True),
        sa.Column("kernel", sa.String(71), nullable=False),
        sa.Column("target_name", sa.String(128), sa.ForeignKey("target.name"), nullable=False),
        sa.Column("certificate_id", sa.String(71), sa.ForeignKey("certificate.id"),
                  nullable=False),
        _when("at"),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("confirmed", sa.Boolean(), nullable=False),
        sa.Column("suspended", sa.Boolean(), nullable=False),
        sa.Column("evidence", sa.LargeBinary(), nullable=True),
        sa.Column("log_index", sa.Integer(), nullable=True),
    )  # fmt: skip
    op.create_index(
        "ix_observation_mismatch_kernel_target", "observation_mismatch", ["kernel", "target_name"]
    )
    op.create_table(
        "latency_histogram",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("report_id", sa.Integer(), sa.ForeignKey("observation_report.id"),
                  nullable=False, index=True),
        sa.Column("kernel", sa.String(71), nullable=False),
        sa.Column("target_name", sa.String(128), sa.ForeignKey("target.name"), nullable=False),
        sa.Column("bounds", sa.JSON(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
    )  # fmt: skip
    op.create_index(
        "ix_latency_histogram_target_kernel", "latency_histogram", ["target_name", "kernel"]
    )
    op.create_table(
        "latency_sample",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kernel", sa.String(71), nullable=False),
        sa.Column("target_name", sa.String(128), sa.ForeignKey("target.name"), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("dur_us", sa.Float(), nullable=False),
        sa.Column("batch", sa.String(71), nullable=False, index=True),
        _when("recorded_at"),
    )
    op.create_index("ix_latency_sample_target_kernel", "latency_sample", ["target_name", "kernel"])


def downgrade() -> None:
    op.drop_index("ix_latency_sample_target_kernel", table_name="latency_sample")
    op.drop_table("latency_sample")
    op.drop_index("ix_latency_histogram_target_kernel", table_name="latency_histogram")
    op.drop_table("latency_histogram")
    op.drop_index("ix_observation_mismatch_kernel_target", table_name="observation_mismatch")
    op.drop_table("observation_mismatch")
    op.drop_table("observation_report")
    op.drop_table("target_policy")

"""The initial results schema: runs and everything recorded about them.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True)


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE",
                                   name=f"fk_{table}_run_id_runs")


def _stage_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["run_id", "stage_id"], ["stages.run_id", "stages.stage_id"],
                                   ondelete="CASCADE", name=f"fk_{table}_run_id_stage_id_stages")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),  # nightly | release | manual
        sa.Column("suite", sa.String(), nullable=False),
        sa.Column("broker_kind", sa.String(), nullable=False),
        sa.Column("broker_version", sa.String(), nullable=True),
        sa.Column("release_label", sa.String(), nullable=True),
        sa.Column("dag_run_id", sa.String(), nullable=True),
        sa.Column("artifact_dir", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),  # running | ok | failed | invalid
        sa.Column("excluded", sa.Boolean(), nullable=False),
        sa.Column("excluded_reason", sa.String(), nullable=True),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("run_id", name="pk_runs"),
    )
    op.create_index("ix_runs_started_at", "runs", ["started_at"])

    op.create_table(
        "host_fingerprints",
        _id(),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("fingerprint_hash", sa.String(), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_host_fingerprints"),
        _run_fk("host_fingerprints"),
        sa.UniqueConstraint("run_id", "host", name="uq_host_fingerprints_run_id_host"),
    )

    op.create_table(
        "tuning_snapshots",
        _id(),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("profile", sa.String(), nullable=False),
        sa.Column("entries", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tuning_snapshots"),
        _run_fk("tuning_snapshots"),
        sa.UniqueConstraint("run_id", "host", "profile",
                            name="uq_tuning_snapshots_run_id_host_profile"),
    )

    op.create_table(
        "stages",
        _id(),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("stage_id", sa.String(), nullable=False),
        sa.Column("scenario", sa.String(), nullable=False),
        sa.Column("stage_key", sa.String(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("validity", sa.String(), nullable=True),  # valid | invalid, NULL: no results
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("fingerprint_hash", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_stages"),
        _run_fk("stages"),
        sa.UniqueConstraint("run_id", "stage_id", name="uq_stages_run_id_stage_id"),
    )
    op.create_index("ix_stages_stage_key", "stages", ["stage_key"])

    op.create_table(
        "metrics",
        _id(),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("stage_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("unit", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_metrics"),
        _stage_fk("metrics"),
        sa.UniqueConstraint("run_id", "stage_id", "name", name="uq_metrics_run_id_stage_id_name"),
    )

    op.create_table(
        "series",
        _id(),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("stage_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_series"),
        _stage_fk("series"),
        sa.UniqueConstraint("run_id", "stage_id", "name", name="uq_series_run_id_stage_id_name"),
    )

    op.create_table(
        "baselines",
        _id(),
        sa.Column("kind", sa.String(), nullable=False),  # rolling | release | reset
        sa.Column("label", sa.String(), nullable=True),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_baselines"),
        _run_fk("baselines"),
        sa.UniqueConstraint("kind", "label", name="uq_baselines_kind_label"),
    )

    op.create_table(
        "comparisons",
        _id(),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("stage_id", sa.String(), nullable=False),
        sa.Column("metric", sa.String(), nullable=False),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("baseline_value", sa.Float(), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("change_pct", sa.Float(), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_comparisons"),
        _stage_fk("comparisons"),
        sa.UniqueConstraint("run_id", "stage_id", "metric",
                            name="uq_comparisons_run_id_stage_id_metric"),
    )

    op.create_table(
        "alerts",
        _id(),
        sa.Column("stage_key", sa.String(), nullable=False),
        sa.Column("metric", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("first_run_id", sa.String(), nullable=False),
        sa.Column("last_run_id", sa.String(), nullable=False),
        sa.Column("change_pct", sa.Float(), nullable=True),
        sa.Column("slack_ts", sa.String(), nullable=True),
        sa.Column("delivered", sa.Boolean(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
        sa.ForeignKeyConstraint(["first_run_id"], ["runs.run_id"],
                                name="fk_alerts_first_run_id_runs"),
        sa.ForeignKeyConstraint(["last_run_id"], ["runs.run_id"],
                                name="fk_alerts_last_run_id_runs"),
        sa.UniqueConstraint("stage_key", "metric", "first_run_id",
                            name="uq_alerts_stage_key_metric_first_run_id"),
    )


def downgrade() -> None:
    for table in ("alerts", "comparisons", "baselines", "series", "metrics", "stages",
                  "tuning_snapshots", "host_fingerprints", "runs"):
        op.drop_table(table)

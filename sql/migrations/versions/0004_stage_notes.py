"""stages.notes: what the aggregation said of a stage, valid or not, one note a line.

A stage can stay valid and still carry something its reader must know: its broker granted
a lower QoS than it asked for, its hosts' clocks are not trusted for latency across them,
its broker's cost came from its host rather than its processes. Before, those notes were
in the run folder's stage_metrics.json only.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN (SQLite has it for a nullable column): a batch copy of the table
    # would have to drop the views of 0003 that read it
    op.add_column("stages", sa.Column("notes", sa.String(), nullable=True))


def downgrade() -> None:
    # DROP COLUMN in place, as SQLite has it since 3.35 (a batch copy fails on the views)
    op.execute("ALTER TABLE stages DROP COLUMN notes")

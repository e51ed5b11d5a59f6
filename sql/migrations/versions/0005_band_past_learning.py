"""v_metric_history draws a noise band only for a verdict made past learning.

0003 left the band out for the verdicts `learning`, `no_baseline` and `invalid` only; a
change beyond doubt flagged while a stage learns (a `regression` or `suspected` with a
"learning: N of M nights" note) got a band from the few nights' sigma. A verdict judged
past learning carries its night's `score` in its detail; the band now needs it, as the
report's and the Bencher export's do (`tasks.metrics.noise_known`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import context, op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# the rule as each dialect reads the comparison's JSON detail
PAST_LEARNING = {"postgresql": "c.detail ->> 'score' IS NOT NULL",
                 "sqlite": "json_extract(c.detail, '$.score') IS NOT NULL"}


def _recreate(known: str | None) -> None:
    """v_metric_history again, built as 0003 builds it, its band given when `known`. On
    PostgreSQL replaced in place (same columns), which keeps what was granted on it (the
    Grafana reader's SELECT: a dropped view loses its grants); SQLite has no OR REPLACE."""
    conn = op.get_bind()
    statement = context.script.get_revision("0003").module._statements(conn, known)[0]
    if conn.dialect.name == "postgresql":
        op.execute(statement.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1))
        return
    op.execute("DROP VIEW IF EXISTS v_metric_history")
    op.execute(statement)


def upgrade() -> None:
    _recreate(PAST_LEARNING[op.get_bind().dialect.name])


def downgrade() -> None:
    _recreate(None)

"""Views over the results for Grafana's PostgreSQL data source (and any SQL reader).

- `v_metric_history`: one row per stored metric of every stage of every run: "time" (the
  run's start), the run (id, kind, status, excluded), the stage (key, id, scenario,
  fingerprint, validity), metric, unit, value, and where the run was compared: baseline,
  the baseline's noise band (band_low, band_high: baseline x exp(-/+ sigma), sigma the
  night-to-night noise the detector measured, `noise_pct`; only for verdicts past
  learning, as `tasks.views.history.noise_band`), verdict, change_pct, confidence.
- `v_open_alerts`: the alerts still open (`tasks.metrics.OPEN_ALERT_STATUSES`), with when
  their first and last runs started.
- `v_runs`: every run with its status, duration, and counts of stages, invalid stages,
  regressions and suspicions.

The same views on SQLite (the embedded default), from its JSON and date functions; the
noise band needs SQLite's math functions (`exp`), and is NULL on a SQLite built without
them. A later migration that changes what a view reads drops it and creates it again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from tasks.metrics import OPEN_ALERT_STATUSES

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

VIEWS = ("v_metric_history", "v_open_alerts", "v_runs")


def _has_exp(conn: Connection) -> bool:
    if conn.dialect.name != "sqlite":
        return True
    try:
        conn.exec_driver_sql("SELECT exp(0)")
    except OperationalError:
        return False
    return True


def _dialect_sql(conn: Connection) -> dict[str, str]:
    if conn.dialect.name == "postgresql":
        return {"sigma": "CAST(c.detail ->> 'noise_pct' AS DOUBLE PRECISION) / 100",
                "duration": "CAST(EXTRACT(EPOCH FROM (r.finished_at - r.started_at)) "
                            "AS DOUBLE PRECISION)"}
    return {"sigma": "json_extract(c.detail, '$.noise_pct') / 100.0",
            "duration": "(julianday(r.finished_at) - julianday(r.started_at)) * 86400.0"}


def _band(conn: Connection, sign: str, sigma: str, known: str | None) -> str:
    """The band's bound; `known`: when the noise is known (a later revision's rule, as SQL)."""
    if not _has_exp(conn):
        return "CAST(NULL AS REAL)"
    if known is not None:
        return f"CASE WHEN {known} THEN c.baseline_value * exp({sign}({sigma})) ELSE NULL END"
    return (f"CASE WHEN c.verdict IN ('learning', 'no_baseline', 'invalid') THEN NULL "
            f"ELSE c.baseline_value * exp({sign}({sigma})) END")


def _statements(conn: Connection, known: str | None = None) -> list[str]:
    """The views' statements, v_metric_history first; `known`: see `_band` (0005 uses it)."""
    d = _dialect_sql(conn)
    open_statuses = ", ".join(f"'{s}'" for s in OPEN_ALERT_STATUSES)
    return [
        f"""CREATE VIEW v_metric_history AS
SELECT r.started_at AS "time", r.run_id, r.kind AS run_kind, r.status AS run_status,
       r.excluded, r.broker_kind, r.broker_version,
       s.stage_key, s.stage_id, s.scenario, s.fingerprint_hash, s.validity,
       m.name AS metric, m.unit, m.value,
       c.baseline_value AS baseline,
       {_band(conn, '-', d['sigma'], known)} AS band_low,
       {_band(conn, '', d['sigma'], known)} AS band_high,
       c.verdict, c.change_pct, c.confidence
FROM metrics m
JOIN stages s ON s.run_id = m.run_id AND s.stage_id = m.stage_id
JOIN runs r ON r.run_id = m.run_id
LEFT JOIN comparisons c
       ON c.run_id = m.run_id AND c.stage_id = m.stage_id AND c.metric = m.name""",
        f"""CREATE VIEW v_open_alerts AS
SELECT a.id, a.stage_key, a.metric, a.status, a.change_pct,
       a.first_run_id, f.started_at AS first_seen, a.last_run_id, l.started_at AS last_seen,
       a.delivered, a.created_at, a.updated_at
FROM alerts a
JOIN runs f ON f.run_id = a.first_run_id
JOIN runs l ON l.run_id = a.last_run_id
WHERE a.status IN ({open_statuses})""",
        f"""CREATE VIEW v_runs AS
SELECT r.started_at AS "time", r.run_id, r.kind, r.suite, r.broker_kind, r.broker_version,
       r.release_label, r.status, r.excluded, r.excluded_reason, r.warning, r.finished_at,
       {d['duration']} AS duration_s,
       (SELECT count(*) FROM stages s WHERE s.run_id = r.run_id) AS stages,
       (SELECT count(*) FROM stages s
         WHERE s.run_id = r.run_id AND s.validity = 'invalid') AS invalid_stages,
       (SELECT count(*) FROM comparisons c
         WHERE c.run_id = r.run_id AND c.verdict = 'regression') AS regressions,
       (SELECT count(*) FROM comparisons c
         WHERE c.run_id = r.run_id AND c.verdict = 'suspected') AS suspected
FROM runs r""",
    ]


def create_views() -> None:
    conn = op.get_bind()
    for statement in _statements(conn):
        op.execute(statement)


def drop_views() -> None:
    for view in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {view}")


def upgrade() -> None:
    create_views()


def downgrade() -> None:
    drop_views()

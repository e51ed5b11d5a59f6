"""The results schema as SQLAlchemy 2 declarative models.

`migrations/versions/` must describe exactly these tables; `tests/test_store.py` checks
that with Alembic's autogenerate comparison. Enum-like columns are plain strings checked
by the store (`ALLOWED`), so adding a value needs no migration.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    MetaData,
    String,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tasks.metrics import ALERT_STATUSES, RUN_KINDS, RUN_STATUSES, VERDICTS

UTC = timezone.utc  # datetime.UTC needs Python 3.11

# Allowed values of the enum-like columns, by "table.column".
ALLOWED: dict[str, tuple[str, ...]] = {
    "runs.kind": RUN_KINDS,
    "runs.status": RUN_STATUSES,
    "stages.validity": ("valid", "invalid"),
    "comparisons.verdict": VERDICTS,
    "baselines.kind": ("rolling", "release", "reset"),
    "alerts.status": ALERT_STATUSES,
}

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    PostgreSQL keeps the zone (timestamptz); SQLite stores naive text, so values are
    normalised to UTC on the way in and given back their UTC zone on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {str: String(), float: Float(), datetime: UTCDateTime(),
                           dict[str, Any]: JSON(), list[Any]: JSON(), bool: Boolean()}


def _run_fk(**kw: Any) -> Any:
    return ForeignKey("runs.run_id", ondelete="CASCADE", **kw)


def _stage_fk() -> ForeignKeyConstraint:
    return ForeignKeyConstraint(["run_id", "stage_id"], ["stages.run_id", "stages.stage_id"],
                                ondelete="CASCADE")


class Run(Base):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(primary_key=True)
    kind: Mapped[str]
    suite: Mapped[str]
    broker_kind: Mapped[str]
    broker_version: Mapped[str | None]
    release_label: Mapped[str | None]
    dag_run_id: Mapped[str | None]
    artifact_dir: Mapped[str]
    status: Mapped[str] = mapped_column(default="running")
    excluded: Mapped[bool] = mapped_column(default=False)
    # Why the run is excluded or did not finish ok: it never feeds a baseline.
    excluded_reason: Mapped[str | None]
    # What went wrong in a run that still measured well (Slack not told): shown, not excluded.
    warning: Mapped[str | None]
    started_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    finished_at: Mapped[datetime | None]


class HostFingerprint(Base):
    __tablename__ = "host_fingerprints"
    __table_args__ = (UniqueConstraint("run_id", "host"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(_run_fk())
    host: Mapped[str]
    fingerprint_hash: Mapped[str]
    fingerprint: Mapped[dict[str, Any]]


class TuningSnapshot(Base):
    __tablename__ = "tuning_snapshots"
    __table_args__ = (UniqueConstraint("run_id", "host", "profile"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(_run_fk())
    host: Mapped[str]
    profile: Mapped[str]
    entries: Mapped[list[Any]]


class Stage(Base):
    __tablename__ = "stages"
    __table_args__ = (UniqueConstraint("run_id", "stage_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(_run_fk())
    stage_id: Mapped[str]
    scenario: Mapped[str]
    # The like-with-like key: runs are only compared on stages with the same key.
    stage_key: Mapped[str] = mapped_column(index=True)
    params: Mapped[dict[str, Any]]
    validity: Mapped[str | None]  # None until results are recorded
    reason: Mapped[str | None]  # why it is invalid
    # what the aggregation said of it, one note a line (a lower QoS granted, clocks not
    # trusted, where the broker's cost came from), valid or not; None when nothing
    notes: Mapped[str | None]
    fingerprint_hash: Mapped[str | None]


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("run_id", "stage_id", "name"), _stage_fk())

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str]
    stage_id: Mapped[str]
    name: Mapped[str]
    value: Mapped[float | None]
    unit: Mapped[str]


class Series(Base):
    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("run_id", "stage_id", "name"), _stage_fk())

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str]
    stage_id: Mapped[str]
    name: Mapped[str]
    values: Mapped[list[Any]]


class Baseline(Base):
    """kind 'release': pinned release run (label = release label); kind 'reset': the
    history of a stage key that `run_id` is a night of starts there (label `<stage
    key>@<run id>`, `sql.histories.reset_label`), or one metric's (an accepted change:
    `<stage key>@<run id>#<metric>`); a label of the stage key alone, written before
    histories were kept apart, starts every one of its histories)."""

    __tablename__ = "baselines"
    __table_args__ = (UniqueConstraint("kind", "broker_kind", "label"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str]
    # a release pin's broker kind (its run's): one label per broker kind; "" for resets
    broker_kind: Mapped[str] = mapped_column(default="", server_default="")
    label: Mapped[str | None]
    run_id: Mapped[str] = mapped_column(_run_fk())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Comparison(Base):
    __tablename__ = "comparisons"
    __table_args__ = (UniqueConstraint("run_id", "stage_id", "metric"), _stage_fk())

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str]
    stage_id: Mapped[str]
    metric: Mapped[str]
    verdict: Mapped[str]
    baseline_value: Mapped[float | None]
    value: Mapped[float | None]
    change_pct: Mapped[float | None]
    confidence: Mapped[float | None]
    detail: Mapped[dict[str, Any]]


class Alert(Base):
    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("stage_key", "metric", "first_run_id"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    stage_key: Mapped[str]
    metric: Mapped[str]
    status: Mapped[str]
    first_run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"))
    last_run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"))
    change_pct: Mapped[float | None]
    slack_ts: Mapped[str | None]
    delivered: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

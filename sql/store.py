"""The results store: every read and write of run results goes through `Store`.

Each public call is one transaction. Every write is idempotent (upsert, or delete-then-
insert in one transaction), so a retried Airflow task never duplicates rows or fails.
SQLite (the embedded default) and PostgreSQL (production) are supported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine, delete, event, insert, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from tasks import metrics as metric_defs
from tasks.fingerprint import fingerprint_hash
from tasks.locks import held

from . import alerts, queries
from .common import (
    StoreError,
    StoreUnavailable,
    check,
    finite,
    json_safe,
    row_dict,
    sample,
    upsert,
    upsert_baseline,
)
from .histories import History, reset_label
from .models import (
    Alert,
    Baseline,
    Comparison,
    HostFingerprint,
    Metric,
    Run,
    Series,
    Stage,
    TuningSnapshot,
    utcnow,
)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_MIGRATE_LOCK = 0x70657266  # pg advisory lock key: concurrent migrate() calls take turns
_FINISHED = tuple(s for s in metric_defs.RUN_STATUSES if s != "running")
log = logging.getLogger(__name__)

DB_RETRY_S = 60.0  # how long a database down or locked is waited for (PERFPIPE_DB_RETRY_S)
CONNECT_TIMEOUT_S = 10  # one connection attempt to PostgreSQL
# PostgreSQL connections that stop answering mid-query end within ~15 s (libpq options)
_PG_DEADLINES = {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 5,
                 "keepalives_interval": 5, "keepalives_count": 2, "tcp_user_timeout": 15000}


# A server that answered a connection with one of these is busy, not refusing: try again.
_BUSY = ("is starting up", "is shutting down", "in recovery mode", "too many clients",
         "remaining connection slots")


def _unreachable(exc: Exception) -> bool:
    """A connection that failed because the server is away (no answer, refused, starting
    up or shutting down), not because it said no (authentication, unknown database: the
    server's FATAL answer). psycopg gives no SQLSTATE for connection errors, so the
    message tells."""
    message = str(exc)
    return "FATAL:" not in message or any(busy in message for busy in _BUSY)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def alembic_config() -> Config:
    """Alembic's configuration for perfpipe's migrations (its connection given by the
    caller, in ``attributes["connection"]``)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    return cfg


class Store:
    """Results store on one database URL (sqlite:///path or postgresql[+psycopg]://...).

    Call `migrate()` once before use. Errors are StoreError, whose messages show the URL
    only through `url_for_display` (password masked).

    A database that is down or locked is waited for, up to `retry_s`: a PostgreSQL
    connection is tried again (connecting changes nothing, so it is always safe to retry;
    every write being idempotent, a step retried after a failure is safe too), and a
    locked SQLite file is waited on by SQLite itself for as long.
    """

    def __init__(self, url: str, *, retry_s: float = DB_RETRY_S) -> None:
        bare_at = StoreError("the database URL has an '@' besides the one before its host "
                             "(not shown: it may be in the password): write an '@' in the "
                             "user name or password as %40")
        try:
            parsed = make_url(url)
        except ValueError:  # a port read from a password's tail: '...@y:SECRET@host'
            raise bare_at from None
        except SQLAlchemyError:
            raise StoreError("cannot parse the database URL (not shown: it may hold a "
                             "password)") from None
        if parsed.drivername == "postgresql":  # psycopg 3 is the installed driver
            parsed = parsed.set(drivername="postgresql+psycopg")
        backend = parsed.get_backend_name()
        # a password's own '@' makes the rest of it the host, or part of the database name
        if backend != "sqlite" and "@" in url.split("://", 1)[-1].replace("@", "", 1):
            raise bare_at
        self._url: URL = parsed
        if backend not in ("sqlite", "postgresql"):
            raise StoreError(f"unsupported database {self.url_for_display}: "
                             "use sqlite or postgresql")
        self._retry_s = retry_s
        kwargs: dict[str, Any] = {"pool_pre_ping": True}  # a restarted server: reconnect
        if backend == "sqlite":
            kwargs["connect_args"] = {"timeout": retry_s}  # waits out a writer's lock
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        else:
            kwargs["connect_args"] = dict(_PG_DEADLINES)
        try:
            self._engine = create_engine(parsed, **kwargs)
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot use database {self.url_for_display}: {exc}") from None
        if backend == "sqlite":
            event.listen(self._engine, "connect", _sqlite_pragmas)
        else:
            event.listen(self._engine, "do_connect", self._connect_retrying)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)

    def _connect_retrying(self, dialect: Any, _record: Any, cargs: tuple,
                          cparams: dict) -> Any:
        """Connect, trying again with growing pauses while the server cannot be reached,
        the last time `retry_s` after the first; then one line that says how long it was
        tried."""
        started, pause, tries = time.monotonic(), 0.5, 0
        while True:
            tries += 1
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as exc:
                if not _unreachable(exc):
                    raise  # e.g. a wrong password: no wait makes it right
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                waited = time.monotonic() - started
                if waited >= self._retry_s:
                    raise StoreUnavailable(
                        f"database {self.url_for_display} unreachable: {first} (tried "
                        f"{tries} times in {waited:.0f} s; PERFPIPE_DB_RETRY_S sets how "
                        "long)") from None
                wait = min(pause, self._retry_s - waited)  # the last try at retry_s
                log.warning("database %s unreachable (%s): trying again in %.1f s",
                            self.url_for_display, first, wait)
                time.sleep(wait)
                pause = min(2 * pause, 8.0)

    @property
    def url_for_display(self) -> str:
        """The URL with its password masked and no query (which may hold one too)."""
        return self._url.set(query={}).render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"Store({self.url_for_display!r})"

    def close(self) -> None:
        self._engine.dispose()

    def _error(self, exc: SQLAlchemyError) -> StoreError:
        detail = exc.orig if isinstance(exc, DBAPIError) else exc
        first = str(detail).strip().splitlines()[0] if str(detail).strip() else type(detail).__name__
        message = f"database error on {self.url_for_display}: {first}"
        if "database is locked" in first:  # SQLite waited `retry_s` for another writer
            return StoreUnavailable(f"{message} (waited {self._retry_s:.0f} s; "
                                    "PERFPIPE_DB_RETRY_S sets how long)")
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:  # lost mid-query
            return StoreUnavailable(message)
        return StoreError(message)

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        try:
            with self._sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            raise self._error(exc) from exc

    def _run(self, s: Session, run_id: str) -> Run:
        run = s.get(Run, run_id)
        if run is None:
            raise StoreError(f"unknown run {run_id!r}")
        return run

    # -- schema -----------------------------------------------------------------------
    def migrate(self) -> None:
        """alembic upgrade head, in one transaction; a no-op when already at head."""
        cfg = alembic_config()
        try:
            with self._sqlite_migrate_lock(), self._engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATE_LOCK})
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except SQLAlchemyError as exc:
            raise self._error(exc) from exc
        except CommandError as exc:  # e.g. the database is at a revision this code lacks
            raise StoreError(f"cannot migrate {self.url_for_display}: {exc}") from exc

    def open_for_commands(self) -> None:
        """A store a command reads or manages (`perfpipe show`, `alerts`, `baseline`, ...):
        made when nothing wrote to it yet, else left at its revision, which must be this
        perfpipe's. A command never migrates a database runs share: a newer checkout's
        `perfpipe show` upgraded it, and every older worker then refused it."""
        try:
            with self._engine.connect() as conn:
                current = MigrationContext.configure(conn).get_current_revision()
        except SQLAlchemyError as exc:
            raise self._error(exc) from exc
        if current is None:
            self.migrate()
            return
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        if current != head:
            raise StoreError(f"{self.url_for_display} is at schema revision {current}, this "
                             f"perfpipe's is {head}: use the perfpipe its runs use (a run of "
                             "this one migrates it; a command does not)")

    def _sqlite_migrate_lock(self):
        """SQLite has no advisory lock: runs that migrate one file at once (the first
        night's concurrent runs) take turns on a lock file beside it."""
        database = self._url.database
        if self._url.get_backend_name() != "sqlite" or not database or database == ":memory:":
            return nullcontext()
        path = Path(database)
        return held(path.with_name(path.name + ".migrate.lock"), {"migrating": str(path)},
                    wait_s=120, say=lambda _line: None, what=f"the migration of {path}")

    # -- runs -------------------------------------------------------------------------
    def create_run(self, run_id: str, *, kind: str, suite: str, broker_kind: str,
                   artifact_dir: str, broker_version: str | None = None,
                   release_label: str | None = None, dag_run_id: str | None = None,
                   started_at: datetime | None = None) -> None:
        """Insert the run as 'running'. Again for the same run_id: descriptive fields are
        refreshed (None keeps the stored value); status, start and exclusion stay."""
        check("runs.kind", kind)
        values = {"run_id": run_id, "kind": kind, "suite": suite, "broker_kind": broker_kind,
                  "artifact_dir": artifact_dir, "broker_version": broker_version,
                  "release_label": release_label, "dag_run_id": dag_run_id,
                  "status": "running", "excluded": False, "started_at": started_at or utcnow()}
        with self._tx() as s:
            upsert(s, Run, values, ("run_id",), keep=("status", "excluded", "started_at"),
                   keep_if_none=("broker_version", "release_label", "dag_run_id"))

    def set_broker_version(self, run_id: str, version: str) -> None:
        with self._tx() as s:
            self._run(s, run_id).broker_version = version

    def finish_run(self, run_id: str, status: str, *, excluded: bool = False,
                   reason: str | None = None, warning: str | None = None) -> None:
        """Close the run. `reason` (kept in excluded_reason) says why it is excluded or not
        ok; `warning`, what went wrong that leaves its results good. finished_at is set
        once, so a retry does not move it."""
        check("runs.status", status, _FINISHED)
        with self._tx() as s:
            run = self._run(s, run_id)
            run.status, run.excluded, run.excluded_reason = status, excluded, reason
            run.warning = warning
            run.finished_at = run.finished_at or utcnow()

    def run(self, run_id: str) -> dict[str, Any] | None:
        with self._tx() as s:
            run = s.get(Run, run_id)
            return None if run is None else row_dict(run, skip=())

    def latest_runs(self, limit: int = 10, *, kind: str | None = None) -> list[dict[str, Any]]:
        with self._tx() as s:
            q = select(Run).order_by(Run.started_at.desc(), Run.run_id.desc()).limit(limit)
            if kind is not None:
                q = q.where(Run.kind == kind)
            return [row_dict(r, skip=()) for r in s.scalars(q)]

    # -- hosts ------------------------------------------------------------------------
    def record_fingerprint(self, run_id: str, host: str, fingerprint: dict[str, Any]) -> str:
        """Record a host's comparable facts; returns their hash (`tasks.fingerprint`)."""
        digest = fingerprint_hash(fingerprint)
        with self._tx() as s:
            upsert(s, HostFingerprint, {"run_id": run_id, "host": host,
                                        "fingerprint_hash": digest,
                                        "fingerprint": fingerprint}, ("run_id", "host"))
        return digest

    def fingerprints(self, run_id: str) -> list[dict[str, Any]]:
        """Each host's recorded fingerprint: {"host", "hash", **fingerprint}, by host name."""
        with self._tx() as s:
            q = select(HostFingerprint).where(HostFingerprint.run_id == run_id)
            return [{"host": f.host, "hash": f.fingerprint_hash, **f.fingerprint}
                    for f in s.scalars(q.order_by(HostFingerprint.host))]

    def tuning(self, run_id: str) -> list[dict[str, Any]]:
        """Each host's tuning snapshot: {"host", "profile", "entries"}, by host name."""
        with self._tx() as s:
            q = select(TuningSnapshot).where(TuningSnapshot.run_id == run_id)
            return [row_dict(t, skip=("id", "run_id"))
                    for t in s.scalars(q.order_by(TuningSnapshot.host))]

    def record_tuning(self, run_id: str, host: str, profile: str,
                      entries: list[dict[str, Any]]) -> None:
        with self._tx() as s:
            upsert(s, TuningSnapshot, {"run_id": run_id, "host": host, "profile": profile,
                                       "entries": entries}, ("run_id", "host", "profile"))

    # -- stages and results -----------------------------------------------------------
    def record_stage(self, run_id: str, stage_id: str, *, scenario: str, stage_key: str,
                     params: dict[str, Any], fingerprint_hash: str | None) -> None:
        """Upsert the stage's plan; its validity and results are left as they are."""
        with self._tx() as s:
            upsert(s, Stage, {"run_id": run_id, "stage_id": stage_id, "scenario": scenario,
                              "stage_key": stage_key, "params": params,
                              "fingerprint_hash": fingerprint_hash}, ("run_id", "stage_id"))

    def keep_stages(self, run_id: str, stage_ids: set[str]) -> list[str]:
        """The run's stages are `stage_ids` from now on: drop any other stage of the run,
        with its metrics, series, comparisons and the alerts the run opened of it (what an
        earlier attempt of the stages step loaded and judged that this one did not run: a
        probe of another search path, a stage it skipped); returns the stage ids dropped."""
        with self._tx() as s:
            self._run(s, run_id)
            gone = {row.stage_id: row.stage_key for row in s.execute(
                select(Stage.stage_id, Stage.stage_key).where(Stage.run_id == run_id))
                if row.stage_id not in stage_ids}
            alerts.drop_opened(s, run_id, set(gone.values()))
            for model in (Comparison, Metric, Series, Stage):
                s.execute(delete(model).where(model.run_id == run_id,
                                              model.stage_id.in_(gone)))
            return sorted(gone)

    def record_results(self, run_id: str, stage_id: str, *, metrics: dict[str, float | None],
                       series: dict[str, list[float]], validity: str,
                       reason: str | None, notes: Sequence[str] = ()) -> None:
        """Replace the stage's metrics, series and `notes` (what the aggregation said of
        it) and set its validity, atomically. Non-finite numbers are stored as NULL;
        integers in series stay integers."""
        check("stages.validity", validity)
        try:
            clean = {name: [sample(v) for v in values] for name, values in series.items()}
        except (TypeError, ValueError):
            raise StoreError(f"series of stage {stage_id!r}: values must be numbers") from None
        units = {}
        for name in metrics:
            try:
                units[name] = metric_defs.metric(name).unit
            except KeyError:
                raise StoreError(f"unknown metric {name!r}: add it to tasks.metrics") from None
        with self._tx() as s:
            stage = s.scalars(select(Stage).where(Stage.run_id == run_id,
                                                  Stage.stage_id == stage_id)).first()
            if stage is None:
                raise StoreError(f"unknown stage {stage_id!r} of run {run_id!r}: "
                                 "record_stage first")
            stage.validity, stage.reason = validity, reason
            stage.notes = "\n".join(notes) or None
            for model in (Metric, Series):
                s.execute(delete(model).where(model.run_id == run_id, model.stage_id == stage_id))
            key = {"run_id": run_id, "stage_id": stage_id}
            if metrics:
                s.execute(insert(Metric), [{**key, "name": n, "value": finite(v), "unit": units[n]}
                                           for n, v in metrics.items()])
            if clean:
                s.execute(insert(Series), [{**key, "name": n, "values": v}
                                           for n, v in clean.items()])

    def record_comparisons(self, run_id: str, verdicts: list[dict[str, Any]]) -> None:
        """Replace the run's comparisons. Each dict: stage_id, metric, verdict and optional
        baseline_value, value, change_pct, confidence, detail."""
        rows, seen = [], set()
        for v in verdicts:
            check("comparisons.verdict", v["verdict"])
            if v["metric"] not in metric_defs.METRICS:
                raise StoreError(f"unknown metric {v['metric']!r}: add it to tasks.metrics")
            if (v["stage_id"], v["metric"]) in seen:
                raise StoreError(f"two verdicts for {v['stage_id']} {v['metric']}")
            seen.add((v["stage_id"], v["metric"]))
            rows.append({"run_id": run_id, "stage_id": v["stage_id"], "metric": v["metric"],
                         "verdict": v["verdict"], "detail": json_safe(v.get("detail") or {}),
                         **{k: finite(v.get(k)) for k in
                            ("baseline_value", "value", "change_pct", "confidence")}})
        with self._tx() as s:
            self._run(s, run_id)
            s.execute(delete(Comparison).where(Comparison.run_id == run_id))
            if rows:
                s.execute(insert(Comparison), rows)

    def stages(self, run_id: str) -> list[dict[str, Any]]:
        """The run's stages in recorded order, each with metrics, units, series and
        comparisons."""
        with self._tx() as s:
            return queries.stages(s, run_id)

    # -- history and baselines --------------------------------------------------------
    def history(self, stage_key: str, fingerprint_hash: str | None, *, before_run: str,
                limit: int = 30, setup: dict | None = None) -> list[dict[str, Any]]:
        """Comparable earlier results for one stage key, newest first.

        Runs that finished ok, are not excluded, are not release runs, started before
        `before_run` and have a valid stage with this key (and this fingerprint hash when
        given). History starts at its newest reset, if any, and a metric's at its newest
        accepted change (`queries.reset_starts`), of those on nights before `before_run`.
        Each entry's `held_out` names the metrics whose values must not feed a baseline: its
        own night flagged them (suspected or regression) and no human accepted them or
        called them a false positive, nor did the next night clear the suspicion; or they
        come before that metric's accepted change. Its
        `params` are the stage's as recorded that night. Given `setup` (tonight's params),
        only the nights that measured it count, the newest `limit` of them
        (`tasks.fingerprint.measured_alike`): nights of another setup are another history.
        """
        with self._tx() as s:
            before = self._run(s, before_run).started_at
            return queries.history(s, stage_key, fingerprint_hash, before=before, limit=limit,
                                   setup=setup)

    def full_history(self, stage_key: str, fingerprint_hash: str | None, *,
                     before_run: str) -> list[dict[str, Any]]:
        """Every comparable earlier result of `stage_key`, oldest first: {"run_id",
        "started_at", "kind", "broker_version", "metrics", "params"}; unlike `history`, no
        window, no reset marker and no value held out (`queries.full_history`)."""
        with self._tx() as s:
            before = self._run(s, before_run).started_at
            return queries.full_history(s, stage_key, fingerprint_hash, before=before)

    def last_fingerprint(self, stage_key: str, *, before_run: str) -> str | None:
        """The fingerprint of the newest earlier comparable run of `stage_key`, any fingerprint."""
        with self._tx() as s:
            before = self._run(s, before_run).started_at
            return queries.last_fingerprint(s, stage_key, before=before)

    def previous_verdicts(self, stage_key: str, fingerprint_hash: str | None, *,
                          before_run: str, baseline: str = "rolling",
                          setup: dict | None = None) -> dict[str, dict[str, Any]]:
        """metric -> the newest earlier verdict of this stage key that a night can confirm
        or clear (not invalid, not no_baseline), made against the same baseline (and on a
        night that measured `setup`, when given; against the rolling history, on a run of
        `before_run`'s kind, release or not), with its run's start and the stage's params
        that night (`queries.previous_verdicts`)."""
        with self._tx() as s:
            tonight = self._run(s, before_run)
            return queries.previous_verdicts(s, stage_key, fingerprint_hash,
                                             before=tonight.started_at, baseline=baseline,
                                             setup=setup, release_runs=tonight.kind == "release")

    def reset_history(self, stage_key: str, run_id: str) -> None:
        """The history of `stage_key` that `run_id` is a night of (its fingerprint and
        setup) starts at `run_id` (inclusive) from now on, unless it starts later."""
        with self._tx() as s:
            self._run(s, run_id)
            upsert_baseline(s, "reset", reset_label(stage_key, run_id), run_id)

    def pin_release_baseline(self, label: str, run_id: str) -> str | None:
        """Pin `run_id` as release `label`'s baseline; returns the run it was pinned to
        before (None: a new label)."""
        if not metric_defs.is_release_label(label):
            raise StoreError(f"label {label!r}: a release label, as the release DAG takes "
                             f"it ({metric_defs.RELEASE_LABEL_RULE})")
        with self._tx() as s:
            run = self._run(s, run_id)
            if not metric_defs.feeds_baselines(run.status, run.excluded):
                raise StoreError(f"run {run_id!r} is {run.status}"
                                 f"{' and excluded' if run.excluded else ''}: only an ok, "
                                 "not excluded run can be a release baseline")
            before = s.scalar(select(Baseline.run_id).where(
                Baseline.kind == "release", Baseline.broker_kind == run.broker_kind,
                Baseline.label == label))
            upsert_baseline(s, "release", label, run_id, run.broker_kind)
            return before

    def release_baseline(self, label: str, broker_kind: str) -> str | None:
        """The run pinned as release `label`'s baseline of this broker kind, or None."""
        with self._tx() as s:
            return s.scalar(select(Baseline.run_id).where(
                Baseline.kind == "release", Baseline.broker_kind == broker_kind,
                Baseline.label == label))

    def release_baseline_for(self, run_id: str) -> tuple[str, str] | None:
        """(label, run_id) of the release baseline of the run's broker kind pinned most
        recently when the run started: what a release run whose trigger named no baseline
        is compared with."""
        with self._tx() as s:
            run = self._run(s, run_id)
            return queries.release_baseline_at(s, run.started_at, run.broker_kind)

    def release_baselines(self, broker_kind: str | None = None) -> list[dict[str, Any]]:
        """The pinned release baselines, oldest first; given `broker_kind`, of its runs only."""
        with self._tx() as s:
            q = select(Baseline).where(Baseline.kind == "release").order_by(Baseline.created_at)
            if broker_kind is not None:
                q = q.where(Baseline.broker_kind == broker_kind)
            return [row_dict(b, skip=("id",)) for b in s.scalars(q)]

    # -- alerts (see sql/alerts.py) ---------------------------------------------------
    def upsert_alert(self, *, stage_key: str, metric: str, run_id: str, status: str,
                     change_pct: float | None) -> tuple[int, bool]:
        with self._tx() as s:
            return alerts.upsert_alert(s, stage_key=stage_key, metric=metric, run_id=run_id,
                                       status=status, change_pct=change_pct)

    def follow_verdict(self, *, stage_key: str, metric: str, run_id: str, verdict: str,
                       change_pct: float | None, judged_on: History | None = None
                       ) -> tuple[int, bool] | None:
        """Open, update or close the alert of stage_key+metric in tonight's history (see
        `sql.alerts.follow_verdict`); (alert id, changed) or None."""
        with self._tx() as s:
            return alerts.follow_verdict(s, stage_key=stage_key, metric=metric, run_id=run_id,
                                         verdict=verdict, change_pct=change_pct,
                                         judged_on=judged_on)

    def alert(self, alert_id: int) -> dict[str, Any]:
        with self._tx() as s:
            return alerts.get(s, alert_id)

    def alerts(self, *, open_only: bool = False) -> list[dict[str, Any]]:
        with self._tx() as s:
            return alerts.listing(s, open_only=open_only)

    def set_alert_status(self, alert_id: int, status: str) -> None:
        """Set by a human (a closed alert is not opened again). 'accepted' (the new normal)
        also restarts the alert's metric's history the alert's first run is a night of
        there (its fingerprint and setup; the others of the stage key, and the stage's other
        metrics, go on), unless it already starts later; not for an alert against a pinned
        release, whose baseline is the release run (promote another to move it). An
        accepted alert set to another status takes that restart back."""
        with self._tx() as s:
            was = getattr(s.get(Alert, alert_id), "status", None)  # set_status says if none
            alert = alerts.set_status(s, alert_id, status)
            if alerts.release_of(alert.stage_key) or (status == "accepted") == (was == "accepted"):
                return
            label = reset_label(alert.stage_key, alert.first_run_id, alert.metric)
            if status == "accepted":
                upsert_baseline(s, "reset", label, alert.first_run_id)
            else:
                s.execute(delete(Baseline).where(Baseline.kind == "reset", Baseline.label == label))

    def alerts_flagged_with(self, alert_id: int) -> list[int]:
        """The open alerts the run's stages flagged with this one (`alerts.flagged_with`)."""
        with self._tx() as s:
            return alerts.flagged_with(s, alert_id)

    def undelivered_alerts(self) -> list[dict[str, Any]]:
        with self._tx() as s:
            return alerts.listing(s, undelivered=True)

    def mark_alert_delivered(self, alert_id: int, slack_ts: str | None) -> None:
        with self._tx() as s:
            alerts.mark_delivered(s, alert_id, slack_ts)

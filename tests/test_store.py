"""The results store against real databases: SQLite (a file) and a throwaway PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    create_engine,
    func,
    insert,
    inspect,
    select,
    text,
)

from sql import Store, StoreError
from sql.alerts import alert_key
from sql.models import Base, Baseline
from sql.store import alembic_config
from tests.pg import PostgresUnavailable, create_database, start_postgres

T0 = datetime(2025, 1, 1, 2, 0, tzinfo=timezone.utc)
TABLES = ("runs", "host_fingerprints", "tuning_snapshots", "stages", "metrics", "series",
          "baselines", "comparisons", "alerts")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory):
    try:
        url, stop = start_postgres(tmp_path_factory.mktemp("pg"))
    except PostgresUnavailable as exc:
        problem = str(exc)  # fail, never skip: CI must run against PostgreSQL
    else:
        problem = None
    if problem:
        pytest.fail(problem, pytrace=False)
    yield url
    stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'results.db'}"
    return create_database(request.getfixturevalue("pg_server"), f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(db_url: str):
    s = Store(db_url)
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def count(db_url: str):
    engine = create_engine(db_url)

    def rows(table: str) -> int:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(text(table))).scalar_one()

    yield rows
    engine.dispose()


def new_run(store: Store, run_id: str, day: int = 0, **kw) -> None:
    store.create_run(run_id, kind=kw.pop("kind", "nightly"), suite="smoke",
                     broker_kind="mosquitto", artifact_dir=f"/runs/{run_id}",
                     started_at=T0 + timedelta(days=day), **kw)


def stage(store: Store, run_id: str, stage_id: str = "fanin.q1", *, key: str = "fanin.q1",
          fp: str | None = "fp1", validity: str = "valid", rate: float = 100.0,
          params: dict | None = None) -> None:
    store.record_stage(run_id, stage_id, scenario="fanin", stage_key=key,
                       params=params or {"qos": 1}, fingerprint_hash=fp)
    store.record_results(run_id, stage_id, metrics={"delivered_rate": rate},
                         series={"delivered_rate": [rate, rate]}, validity=validity,
                         reason=None if validity == "valid" else "backlog rising")


def nightly(store: Store, run_id: str, day: int, status: str = "ok", **kw) -> None:
    new_run(store, run_id, day)
    stage(store, run_id, rate=float(day), **kw)
    store.finish_run(run_id, status)


def test_migrate_on_empty_db_then_again(db_url: str) -> None:
    store = Store(db_url)
    store.migrate()
    store.migrate()
    engine = create_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() \
            == ["0006"]
    # back to 0003 and up again: the stages' notes column goes and comes back beside the
    # views of 0003 (a copy of the table, as a batch drop makes on SQLite, fails on them)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0003")
        assert "notes" not in {c["name"] for c in inspect(conn).get_columns("stages")}
        command.upgrade(config, "head")
        assert conn.execute(text("SELECT count(*) FROM v_metric_history")).scalar() == 0
    engine.dispose()
    store.close()


def test_release_pins_stored_before_0006_take_their_runs_broker_kind(db_url: str) -> None:
    """0006 keys a release pin by broker kind: a pin stored before takes its run's, a
    reset marker takes none, and the stores' reads find both."""
    Store(db_url).close()  # (an SQLite file's folder made)
    engine = create_engine(db_url)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0005")
        conn.execute(text("INSERT INTO runs (run_id, kind, suite, broker_kind, status, "
                          "excluded, artifact_dir, started_at) VALUES ('rel1', 'release', "
                          "'smoke', 'rabbitmq', 'ok', false, '/x', :t)"), {"t": T0})
        conn.execute(text("INSERT INTO baselines (kind, label, run_id, created_at) VALUES "
                          "('release', '3.12', 'rel1', :t), ('reset', 'k@rel1', 'rel1', :t)"),
                     {"t": T0})
        command.upgrade(config, "head")
        rows = conn.execute(text("SELECT kind, broker_kind FROM baselines ORDER BY kind")).all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [("release", "rabbitmq"), ("reset", "")]
    store = Store(db_url)
    assert store.release_baseline("3.12", "rabbitmq") == "rel1"
    assert store.release_baseline("3.12", "mosquitto") is None
    store.close()


def test_models_match_migrations(store: Store, db_url: str) -> None:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(ctx, Base.metadata) == []
        # and the comparison does see a drift
        drifted = MetaData(naming_convention=Base.metadata.naming_convention)
        for table in Base.metadata.tables.values():
            table.to_metadata(drifted)
        drifted.tables["runs"].append_column(Column("extra", Integer()))
        assert [d[0] for d in compare_metadata(ctx, drifted)] == ["add_column"]
    engine.dispose()


def test_round_trip(store: Store) -> None:
    new_run(store, "r1", release_label="v2", dag_run_id="manual__1")
    store.set_broker_version("r1", "2.0.11")
    fp = store.record_fingerprint("r1", "lab1", {"cpu": "x86", "mem": 8, "kernel": "6.1"})
    assert fp == store.record_fingerprint("r1", "lab2", {"kernel": "6.1", "mem": 8, "cpu": "x86"})
    assert len(fp) == 16 and fp != store.record_fingerprint("r1", "lab3", {"cpu": "arm"})
    store.record_tuning("r1", "lab1", "throughput", [{"key": "net.core.somaxconn",
                                                      "before": "128", "after": "4096"}])
    store.record_stage("r1", "s1", scenario="fanin", stage_key="k1", params={"qos": 1},
                       fingerprint_hash=fp)
    store.record_stage("r1", "s2", scenario="fanin", stage_key="k2", params={"qos": 0},
                       fingerprint_hash=fp)
    store.record_results("r1", "s1", metrics={"delivered_rate": 1234.5, "lost": float("nan"),
                                              "e2e_latency_p99": None},
                         series={"delivered_rate": [1200.0, 1269.0, float("inf")],
                                 "seconds": [1700000000, 1700000001, 1700000002]},
                         validity="valid", reason=None)
    store.record_results("r1", "s2", metrics={}, series={}, validity="invalid",
                         reason="driver CPU saturated")
    store.record_comparisons("r1", [
        {"stage_id": "s1", "metric": "delivered_rate", "verdict": "regression",
         "baseline_value": 1300.0, "value": 1234.5, "change_pct": -5.04, "confidence": 0.99,
         "detail": {"nights": 1, "mad": float("nan")}},
        {"stage_id": "s2", "metric": "delivered_rate", "verdict": "invalid"}])
    store.finish_run("r1", "ok")

    run = store.run("r1")
    assert run is not None and store.run("nope") is None
    assert (run["broker_version"], run["release_label"], run["dag_run_id"], run["status"]) \
        == ("2.0.11", "v2", "manual__1", "ok")
    assert run["started_at"] == T0 and run["finished_at"].tzinfo is not None
    s1, s2 = store.stages("r1")
    assert s1["metrics"] == {"delivered_rate": 1234.5, "lost": None, "e2e_latency_p99": None}
    assert s1["units"]["delivered_rate"] == "msg/s" and s1["units"]["e2e_latency_p99"] == "us"
    assert s1["series"] == {"delivered_rate": [1200.0, 1269.0, None],
                            "seconds": [1700000000, 1700000001, 1700000002]}
    assert all(type(x) is int for x in s1["series"]["seconds"])  # integers stay integers
    assert (s1["validity"], s1["params"], s1["fingerprint_hash"]) == ("valid", {"qos": 1}, fp)
    assert s1["comparisons"] == [{"metric": "delivered_rate", "verdict": "regression",
                                  "baseline_value": 1300.0, "value": 1234.5,
                                  "change_pct": -5.04, "confidence": 0.99,
                                  "detail": {"nights": 1, "mad": None}}]
    assert (s2["validity"], s2["reason"], s2["comparisons"][0]["verdict"]) \
        == ("invalid", "driver CPU saturated", "invalid")
    assert [r["run_id"] for r in store.latest_runs()] == ["r1"]


def test_retried_writes_do_not_duplicate(store: Store, count) -> None:
    verdicts = [{"stage_id": "s1", "metric": "delivered_rate", "verdict": "unchanged"}]
    for attempt in range(2):
        new_run(store, "r1")
        store.record_fingerprint("r1", "lab1", {"cpu": "x86"})
        store.record_tuning("r1", "lab1", "throughput", [{"key": "a", "after": "1"}])
        store.record_stage("r1", "s1", scenario="fanin", stage_key="k1", params={},
                           fingerprint_hash=None)
        store.record_results("r1", "s1", metrics={"delivered_rate": 1.0, "lost": 0.0},
                             series={"delivered_rate": [1.0]}, validity="valid", reason=None)
        store.record_comparisons("r1", verdicts)
        store.finish_run("r1", "ok")
        store.pin_release_baseline("v1", "r1")
        store.reset_history("k1", "r1")
        store.upsert_alert(stage_key="k1", metric="delivered_rate", run_id="r1",
                           status="suspected", change_pct=-6.0)
    expected = {"runs": 1, "host_fingerprints": 1, "tuning_snapshots": 1, "stages": 1,
                "metrics": 2, "series": 1, "baselines": 2, "comparisons": 1, "alerts": 1}
    assert {t: count(t) for t in TABLES} == expected
    # a retry of create_run does not reopen a finished run
    assert store.run("r1")["status"] == "ok"
    # results are replaced, not merged
    store.record_results("r1", "s1", metrics={"lost": 0.0}, series={}, validity="valid",
                         reason=None)
    assert store.stages("r1")[0]["metrics"] == {"lost": 0.0} and count("series") == 0


def test_record_results_is_atomic(store: Store) -> None:
    new_run(store, "r1")
    stage(store, "r1", "s1", rate=5.0)
    with pytest.raises(StoreError):  # fails after the old rows were deleted: rolled back
        store.record_results("r1", "s1", metrics={"lost": 1.0}, series={None: [1.0]},
                             validity="invalid", reason="x")
    with pytest.raises(StoreError, match="must be numbers"):
        store.record_results("r1", "s1", metrics={}, series={"x": [object()]},
                             validity="valid", reason=None)
    (s1,) = store.stages("r1")
    assert (s1["metrics"], s1["validity"]) == ({"delivered_rate": 5.0}, "valid")
    with pytest.raises(StoreError, match="unknown metric 'bogus_rate'"):
        store.record_results("r1", "s1", metrics={"bogus_rate": 1.0}, series={},
                             validity="valid", reason=None)
    with pytest.raises(StoreError, match="record_stage first"):
        store.record_results("r1", "nope", metrics={}, series={}, validity="valid", reason=None)
    with pytest.raises(StoreError):  # foreign keys are enforced (SQLite too)
        store.record_stage("no-such-run", "s1", scenario="x", stage_key="k", params={},
                           fingerprint_hash=None)


def test_history(store: Store, count) -> None:
    nightly(store, "n1", 1)
    nightly(store, "n2", 2)
    nightly(store, "n3", 3, status="failed")
    nightly(store, "n4", 4)
    store.finish_run("n4", "ok", excluded=True, reason="noisy neighbour")
    nightly(store, "n5", 5, validity="invalid")
    nightly(store, "n6", 6, fp="fp2")
    nightly(store, "n7", 7, key="other")
    nightly(store, "n8", 8)
    nightly(store, "n9", 9)
    new_run(store, "tonight", 10)
    judged = {"stage_id": "fanin.q1", "metric": "delivered_rate", "verdict": "unchanged",
              "baseline_value": 8.5, "value": 9.0, "change_pct": 5.9, "confidence": 0.5,
              "detail": {"noise_pct": 3.0}}
    store.record_comparisons("n9", [judged])

    hist = store.history("fanin.q1", "fp1", before_run="tonight")
    assert [h["run_id"] for h in hist] == ["n9", "n8", "n2", "n1"]
    assert hist[0] == {"run_id": "n9", "started_at": T0 + timedelta(days=9),
                       "metrics": {"delivered_rate": 9.0},
                       "verdicts": {"delivered_rate": {k: v for k, v in judged.items()
                                                       if k != "stage_id"}},
                       "held_out": [], "params": {"qos": 1}}
    assert hist[1]["verdicts"] == {}  # what each night was judged, for the report
    assert [h["run_id"] for h in store.history("fanin.q1", None, before_run="tonight")] \
        == ["n9", "n8", "n6", "n2", "n1"]
    assert [h["run_id"] for h in store.history("fanin.q1", "fp1", before_run="n8")] == ["n2", "n1"]
    assert [h["run_id"] for h in store.history("fanin.q1", "fp1", before_run="tonight",
                                               limit=2)] == ["n9", "n8"]
    assert store.history("fanin.q1", "fp1", before_run="n1") == []
    with pytest.raises(StoreError, match="unknown run"):
        store.history("fanin.q1", "fp1", before_run="nope")

    store.reset_history("fanin.q1", "n8")  # an accepted change: history restarts at n8
    assert [h["run_id"] for h in store.history("fanin.q1", "fp1", before_run="tonight")] \
        == ["n9", "n8"]
    assert [h["run_id"] for h in store.history("other", "fp1", before_run="tonight")] == ["n7"]

    # a reset does not reach back to the nights judged before it (n8 itself included)
    assert [h["run_id"] for h in store.history("fanin.q1", "fp1", before_run="n8")] \
        == ["n2", "n1"]

    # accepting an alert moves its metric's start to the alert's first run, never
    # backwards: that metric's earlier nights stay out of its baseline, the others' stay in
    alert_id, _ = store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate",
                                     run_id="n9", status="confirmed", change_pct=-8.0)
    store.set_alert_status(alert_id, "accepted")

    def held_out() -> dict[str, list[str]]:
        return {h["run_id"]: h["held_out"]
                for h in store.history("fanin.q1", "fp1", before_run="tonight")}

    assert held_out() == {"n9": [], "n8": ["delivered_rate"]}
    # a person who accepted it, then called it a false positive (or fixed): the reset
    # goes with the acceptance, and its metric's earlier nights feed the baseline again
    store.set_alert_status(alert_id, "false_positive")
    assert held_out() == {"n9": [], "n8": []}
    store.set_alert_status(alert_id, "accepted")
    assert held_out() == {"n9": [], "n8": ["delivered_rate"]}
    old_id, _ = store.upsert_alert(stage_key="fanin.q1", metric="lost", run_id="n2",
                                   status="new", change_pct=None)
    store.set_alert_status(old_id, "accepted")
    assert held_out() == {"n9": [], "n8": ["delivered_rate"]}
    # an alert against a pinned release: its baseline is the release run; no reset is
    # written (nothing reads one of a `vs release` key)
    vs_release, _ = store.upsert_alert(stage_key=alert_key("fanin.q1", {"baseline": "release:v1"}),
                                       metric="lost", run_id="n2", status="new", change_pct=None)
    resets = count("baselines")
    store.set_alert_status(vs_release, "accepted")
    assert count("baselines") == resets and store.alert(vs_release)["status"] == "accepted"


def test_accepting_one_metrics_change_leaves_the_stages_other_regressions_standing(
        store: Store) -> None:
    """Two metrics of a stage regress together; a person accepts the throughput drop as the
    new normal. The broker's memory regression goes on being judged against its own
    nights: it stays a confirmed regression, not "recovered" against a history that had
    restarted with the regressed nights alone (which then became its baseline)."""
    from tasks.steps.compare import compare_stored

    jitter = (1.0, 1.008, 0.993, 1.004, 0.997, 1.006, 0.99, 1.002, 0.996, 1.01, 0.995, 1.003)

    def night(day: int, rate: float, rss: float) -> dict[str, str]:
        run_id = f"n{day:02d}"
        new_run(store, run_id, day)
        j = jitter[day % len(jitter)]
        store.record_stage(run_id, "fanin.q1", scenario="fanin", stage_key="fanin.q1",
                           params={"qos": 1}, fingerprint_hash="fp1")
        store.record_results(run_id, "fanin.q1", series={}, validity="valid", reason=None,
                             metrics={"delivered_rate": rate * j,
                                      "broker_rss_per_1k_conn": rss / j})
        verdicts = compare_stored(store, run_id, {})["verdicts"]
        store.finish_run(run_id, "ok")
        return {v["metric"]: v["verdict"] for v in verdicts}

    for day in range(12):
        night(day, 1000.0, 5e6)
    for day in (12, 13):
        night(day, 800.0, 6.5e6)
    alerts = {a["metric"]: a for a in store.alerts()}
    assert {m: a["status"] for m, a in alerts.items()} == {
        "delivered_rate": "confirmed", "broker_rss_per_1k_conn": "confirmed"}
    store.set_alert_status(alerts["delivered_rate"]["id"], "accepted")
    for day in (14, 15):
        tonight = night(day, 800.0, 6.5e6)
        assert tonight == {"delivered_rate": "learning", "broker_rss_per_1k_conn": "regression"}
    assert store.alert(alerts["broker_rss_per_1k_conn"]["id"])["status"] == "confirmed"


def test_a_regression_acked_for_months_stays_one_and_never_becomes_the_baseline(
        store: Store) -> None:
    """A person acks a throughput drop and nobody fixes it for months. Every night is
    judged a regression and held out; the 60-night window once filled with those held
    nights alone, the metric went back to learning, the alert closed as "recovered" and
    the regressed level became the baseline. The window now reaches back past the held
    nights to the ones before the change."""
    from tasks.analysis.policy import Policy
    from tasks.steps.compare import compare_stored

    jitter = (1.0, 1.008, 0.993, 1.004, 0.997, 1.006, 0.99, 1.002, 0.996, 1.01, 0.995, 1.003)

    def night(day: int, rate: float) -> str:
        run_id = f"n{day:03d}"
        new_run(store, run_id, day)
        store.record_stage(run_id, "fanin.q1", scenario="fanin", stage_key="fanin.q1",
                           params={"qos": 1}, fingerprint_hash="fp1")
        store.record_results(run_id, "fanin.q1", series={}, validity="valid", reason=None,
                             metrics={"delivered_rate": rate * jitter[day % len(jitter)]})
        (verdict,) = [v["verdict"] for v in compare_stored(store, run_id, {})["verdicts"]
                      if v["metric"] == "delivered_rate"]
        store.finish_run(run_id, "ok")
        return verdict

    for day in range(10):
        night(day, 1000.0)
    assert night(10, 800.0) == "suspected"
    (alert,) = store.alerts()
    store.set_alert_status(alert["id"], "acked")
    nights = Policy().history_nights + 10  # past the point where the window was all held
    said = [night(day, 800.0) for day in range(11, 11 + nights)]
    assert said == ["regression"] * nights
    assert store.alert(alert["id"])["status"] == "acked"


def test_an_older_night_judged_again_leaves_the_alerts_as_they_are(store: Store) -> None:
    """A regression confirmed on n12 and n13; n09's compare is run again (a cleared DAG
    task, a new detector). Its verdict closed today's alert as "recovered", its last night
    n09, and the next night opened a second alert for the same regression."""
    from tasks.steps.compare import compare_stored

    jitter = (1.0, 1.008, 0.993, 1.004, 0.997, 1.006, 0.99, 1.002, 0.996, 1.01, 0.995, 1.003)
    for day in range(14):
        run_id = f"n{day:02d}"
        new_run(store, run_id, day)
        store.record_stage(run_id, "fanin.q1", scenario="fanin", stage_key="fanin.q1",
                           params={"qos": 1}, fingerprint_hash="fp1")
        rate = (1000.0 if day < 12 else 800.0) * jitter[day % len(jitter)]
        store.record_results(run_id, "fanin.q1", series={}, validity="valid", reason=None,
                             metrics={"delivered_rate": rate})
        compare_stored(store, run_id, {})
        store.finish_run(run_id, "ok")
    (alert,) = store.alerts()
    assert (alert["status"], alert["last_run_id"]) == ("confirmed", "n13")
    compare_stored(store, "n09", {})
    assert store.alerts() == [alert]


def test_release_baseline(store: Store) -> None:
    new_run(store, "rel1", kind="release", release_label="v1")
    with pytest.raises(StoreError, match="running"):
        store.pin_release_baseline("v1", "rel1")
    store.finish_run("rel1", "failed")
    with pytest.raises(StoreError, match="failed"):
        store.pin_release_baseline("v1", "rel1")
    nightly(store, "rel2", 2)
    store.pin_release_baseline("v1", "rel2")
    assert store.release_baseline("v1", "mosquitto") == "rel2" and store.release_baseline("v0", "mosquitto") is None
    # a release run started since the pin keeps it when the same run is pinned again (a
    # retried promote): the pin's time is not moved past the run's start
    store.create_run("rel3", kind="release", suite="smoke", broker_kind="mosquitto",
                     artifact_dir="/runs/rel3", release_label="v2")
    assert store.release_baseline_for("rel3") == ("v1", "rel2")
    store.pin_release_baseline("v1", "rel2")
    assert store.release_baseline_for("rel3") == ("v1", "rel2")
    store.finish_run("rel2", "ok", excluded=True, reason="bad host")
    with pytest.raises(StoreError, match="excluded"):
        store.pin_release_baseline("v1", "rel2")


def test_alerts(store: Store) -> None:
    for day in range(1, 6):
        new_run(store, f"n{day}", day)
    key = dict(stage_key="fanin.q1", metric="delivered_rate")
    a1, changed = store.upsert_alert(**key, run_id="n1", status="suspected", change_pct=-6.0)
    assert changed
    assert store.upsert_alert(**key, run_id="n1", status="suspected", change_pct=-6.0) == (a1, False)
    assert store.upsert_alert(**key, run_id="n2", status="confirmed", change_pct=-6.0) == (a1, True)
    # one more night of about the same change is no news; a change grown 1.5x is
    assert store.upsert_alert(**key, run_id="n2", status="confirmed", change_pct=-7.5) == (a1, False)
    assert store.upsert_alert(**key, run_id="n3", status="confirmed", change_pct=-9.5) == (a1, True)
    assert store.upsert_alert(**key, run_id="n3", status="confirmed", change_pct=-9.0) == (a1, False)
    assert store.alert(a1)["change_pct"] == -9.5  # the change as last reported
    other, _ = store.upsert_alert(stage_key="fanin.q1", metric="lost", run_id="n3",
                                  status="new", change_pct=None)
    (open1, open2) = store.alerts(open_only=True)
    assert (open1["id"], open1["status"], open1["first_run_id"], open1["last_run_id"]) \
        == (a1, "confirmed", "n1", "n3")
    assert open2["id"] == other and open1["created_at"].tzinfo is not None

    assert [a["id"] for a in store.undelivered_alerts()] == [a1, other]
    store.mark_alert_delivered(a1, "1700000000.0001")
    store.mark_alert_delivered(a1, "1700000099.0002")  # a thread reply: keep the root ts
    assert [a["id"] for a in store.undelivered_alerts()] == [other]

    store.set_alert_status(a1, "acked")  # a human saw it: the same regression is no news
    assert store.upsert_alert(**key, run_id="n4", status="confirmed", change_pct=-7.5) == (a1, False)
    assert store.upsert_alert(**key, run_id="n4", status="recovered", change_pct=0.0) == (a1, True)
    assert store.upsert_alert(**key, run_id="n4", status="recovered", change_pct=0.0) == (a1, False)
    recovered = next(a for a in store.undelivered_alerts() if a["id"] == a1)
    assert (recovered["status"], recovered["slack_ts"]) == ("recovered", "1700000000.0001")
    assert [a["id"] for a in store.alerts(open_only=True)] == [other]

    # a new change after recovery is a new alert; a retry of a closed run's alert is not
    a2, changed = store.upsert_alert(**key, run_id="n5", status="suspected", change_pct=-9.0)
    assert changed and a2 != a1
    store.set_alert_status(a2, "false_positive")
    assert store.upsert_alert(**key, run_id="n5", status="suspected", change_pct=-9.0) == (a2, False)
    assert [a["id"] for a in store.alerts(open_only=True)] == [other]

    # a person's ack does not open a closed alert again (it would absorb the next regression)
    with pytest.raises(StoreError, match=rf"alert {a2} is closed \(false_positive\): it "
                                         r"cannot be set acked"):
        store.set_alert_status(a2, "acked")
    store.set_alert_status(a1, "fixed")  # one closing status for another: a person's record
    assert store.alert(a1)["status"] == "fixed"
    with pytest.raises(StoreError, match="unknown alert"):
        store.set_alert_status(9999, "acked")
    with pytest.raises(StoreError, match="no alert"):
        store.upsert_alert(stage_key="x", metric="lost", run_id="n1", status="recovered",
                           change_pct=None)


def flag(store: Store, run_id: str, verdict: str, metric: str = "delivered_rate",
         hold: bool = True) -> None:
    store.record_comparisons(run_id, [{"stage_id": "fanin.q1", "metric": metric,
                                       "verdict": verdict, "detail": {"hold": hold}}])


def held(store: Store, before: str = "tonight") -> dict[str, list[str]]:
    return {h["run_id"]: h["held_out"] for h in store.history("fanin.q1", "fp1", before_run=before)}


def test_flagged_values_stay_out_of_the_baseline_until_a_human_or_the_next_night_says(
        store: Store) -> None:
    for day in range(1, 7):
        nightly(store, f"n{day}", day)
    new_run(store, "tonight", 10)
    key = dict(stage_key="fanin.q1", metric="delivered_rate")
    flag(store, "n2", "suspected")  # cleared by n3
    store.follow_verdict(**key, run_id="n2", verdict="suspected", change_pct=-6.0)
    store.follow_verdict(**key, run_id="n3", verdict="unchanged", change_pct=-1.0)
    flag(store, "n4", "suspected")  # confirmed by n5: a regression
    flag(store, "n5", "regression")
    a4, _ = store.follow_verdict(**key, run_id="n4", verdict="suspected", change_pct=-6.0)
    store.follow_verdict(**key, run_id="n5", verdict="regression", change_pct=-6.5)
    flag(store, "n6", "suspected", hold=False)  # flagged before the noise was known
    assert held(store) == {"n6": [], "n5": ["delivered_rate"], "n4": ["delivered_rate"],
                           "n3": [], "n2": [], "n1": []}
    assert store.alert(a4)["status"] == "confirmed"
    store.set_alert_status(a4, "fixed")  # fixed: the bad nights stay out
    assert held(store)["n4"] == ["delivered_rate"]
    store.set_alert_status(a4, "false_positive")  # not a regression after all: back in
    assert held(store)["n4"] == [] and held(store)["n5"] == []
    store.set_alert_status(a4, "accepted")  # the new normal: its history restarts at n4
    assert held(store) == {"n6": [], "n5": [], "n4": [], "n3": ["delivered_rate"],
                           "n2": ["delivered_rate"], "n1": ["delivered_rate"]}


def test_follow_verdict_opens_confirms_clears_and_recovers(store: Store) -> None:
    for day in range(1, 7):
        new_run(store, f"n{day}", day)
    key = dict(stage_key="k", metric="e2e_latency_p99")
    assert store.follow_verdict(**key, run_id="n1", verdict="unchanged", change_pct=1.0) is None
    assert store.follow_verdict(**key, run_id="n1", verdict="no_baseline", change_pct=None) is None
    a1, changed = store.follow_verdict(**key, run_id="n1", verdict="suspected", change_pct=12.0)
    assert changed and store.alert(a1)["status"] == "suspected"
    assert store.follow_verdict(**key, run_id="n2", verdict="improvement", change_pct=-3.0) \
        == (a1, True)
    assert store.alert(a1)["status"] == "cleared"
    a2, _ = store.follow_verdict(**key, run_id="n3", verdict="suspected", change_pct=12.0)
    assert store.follow_verdict(**key, run_id="n4", verdict="regression", change_pct=13.0) \
        == (a2, True)
    assert store.follow_verdict(**key, run_id="n5", verdict="regression", change_pct=12.0) \
        == (a2, False)  # the same regression again: not re-posted
    assert store.follow_verdict(**key, run_id="n5", verdict="invalid", change_pct=None) is None
    assert store.follow_verdict(**key, run_id="n6", verdict="unchanged", change_pct=0.5) \
        == (a2, True)
    assert (store.alert(a2)["status"], store.alert(a2)["last_run_id"]) == ("recovered", "n6")
    assert [a["id"] for a in store.alerts()] == [a1, a2] and store.alerts(open_only=True) == []


def test_previous_verdicts_and_last_fingerprint(store: Store) -> None:
    for day in range(1, 5):
        nightly(store, f"n{day}", day, fp="fp1" if day < 4 else "fp2")
    new_run(store, "tonight", 10)
    store.record_comparisons("n1", [
        {"stage_id": "fanin.q1", "metric": "delivered_rate", "verdict": "suspected",
         "detail": {"nights": 1}},
        {"stage_id": "fanin.q1", "metric": "e2e_latency_p99", "verdict": "unchanged"}])
    store.record_comparisons("n2", [
        {"stage_id": "fanin.q1", "metric": "delivered_rate", "verdict": "invalid"},
        {"stage_id": "fanin.q1", "metric": "e2e_latency_p99", "verdict": "regression",
         "detail": {"baseline": "release:9.4.4"}}])
    prev = store.previous_verdicts("fanin.q1", "fp1", before_run="tonight")
    assert {m: (p["run_id"], p["verdict"]) for m, p in prev.items()} == {
        "delivered_rate": ("n1", "suspected"), "e2e_latency_p99": ("n1", "unchanged")}
    assert prev["delivered_rate"]["detail"] == {"nights": 1}
    release = store.previous_verdicts("fanin.q1", "fp1", before_run="tonight",
                                      baseline="release:9.4.4")
    assert list(release) == ["e2e_latency_p99"] and release["e2e_latency_p99"]["run_id"] == "n2"
    assert store.previous_verdicts("fanin.q1", "fp1", before_run="n1") == {}
    # a night that failed, or was excluded afterwards, is no evidence for tonight
    for run_id, day, status, excluded in (("n5", 5, "failed", False), ("n6", 6, "ok", True)):
        new_run(store, run_id, day)
        stage(store, run_id)
        store.record_comparisons(run_id, [{"stage_id": "fanin.q1", "metric": "delivered_rate",
                                           "verdict": "regression"}])
        store.finish_run(run_id, status, excluded=excluded, reason="noisy neighbour")
        assert store.previous_verdicts("fanin.q1", "fp1", before_run="tonight")[
            "delivered_rate"]["run_id"] == "n1"
    # a suspicion a person called a false positive is no evidence either: tonight's bad
    # night is then its first, not the second in a row (a regression at once)
    fp_alert, _ = store.follow_verdict(stage_key="fanin.q1", metric="delivered_rate",
                                       run_id="n1", verdict="suspected", change_pct=-6.0)
    store.set_alert_status(fp_alert, "false_positive")
    assert "delivered_rate" not in store.previous_verdicts("fanin.q1", "fp1", before_run="tonight")
    assert store.last_fingerprint("fanin.q1", before_run="tonight") == "fp2"
    assert store.last_fingerprint("fanin.q1", before_run="n4") == "fp1"
    assert store.last_fingerprint("other", before_run="tonight") is None


def test_each_setup_keeps_its_own_history_in_the_compare_step_and_the_report(
        store: Store) -> None:
    """Nights of two setups, n1 n2 (one driver), n3 n4 (two), n5 n6 (one again): each
    setup's nights are one history, and a night of the other between them neither joins it
    nor ends it (before, n5 started anew and n2's suspicion and alert were left behind),
    as a manual run of another suite between two nightlies does."""
    from tasks.analysis.policy import Policy
    from tasks.steps.compare import record_verdicts, release_stages, stage_inputs
    from tasks.steps.report import stored_histories

    one = {"qos": 1, "groups": [{"group": "pub", "role": "pub", "count": 10, "topics": ["t"],
                                 "rate_per_client": 5.0}], "measure_s": 10,
           "drivers": {"here": 1}}
    two = {**one, "drivers": {"here": 2}}
    setups = {1: one, 2: one, 3: two, 4: two, 5: one}
    for day, params in setups.items():
        new_run(store, f"n{day}", day)
        stage(store, f"n{day}", params=params)
        store.finish_run(f"n{day}", "ok")

    def judged(run_id: str, verdict: str) -> None:
        store.record_comparisons(run_id, [{"stage_id": "fanin.q1", "metric": "delivered_rate",
                                           "verdict": verdict, "detail": {"nights": 1}}])

    # n3 and n4 judged nothing a later night could confirm
    for run_id, verdict in (("n1", "unchanged"), ("n2", "suspected"), ("n3", "no_baseline"),
                            ("n4", "no_baseline")):
        judged(run_id, verdict)

    def inputs(run_id: str, release=None) -> dict:
        (row,) = store.stages(run_id)
        return stage_inputs(store, run_id, row, Policy(), release)

    assert [h["run_id"] for h in inputs("n2")["history"]] == ["n1"]
    first = inputs("n3")
    assert first["history"] == [] and first["noise_history"] == []
    assert first["new_history"] == "setup changed (drivers.here: 1 -> 2): a new history starts here"
    assert first["previous"] == {}  # n2's suspicion is not n3's to confirm
    later = inputs("n4")
    assert [h["run_id"] for h in later["history"]] == ["n3"] and later["new_history"] is None
    assert later["previous"] == {}  # n2's is still another setup's
    assert [h["run_id"] for h in stored_histories(store, "n4", store.stages("n4"))["fanin.q1"]] \
        == ["n3"]  # the report shows the nights the compare step judged on
    # back to n2's setup: its history goes on past the other setup's nights
    again = inputs("n5")
    assert [h["run_id"] for h in again["history"]] == ["n2", "n1"]
    assert again["new_history"] is None and again["previous"]["delivered_rate"]["run_id"] == "n2"
    # n2's suspicion holds its value out: the nights reach back to one that holds nothing
    assert [h["run_id"] for h in store.history("fanin.q1", "fp1", before_run="n5", limit=1,
                                               setup=one)] == ["n2", "n1"]
    assert [h["run_id"] for h in store.history("fanin.q1", "fp1", before_run="n5", limit=1)] \
        == ["n4"]

    # the alert n2 opened is its setup's: n4's change opens one of its own beside it and
    # n4's quiet night leaves it alone; n5, of n2's setup, confirms it
    n2s, _ = store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate", run_id="n2",
                                status="suspected", change_pct=-6.0)

    def follow(run_id: str, verdict: str) -> list[int]:
        row = {"stage_id": "fanin.q1", "metric": "delivered_rate", "verdict": verdict,
               "change_pct": -6.5, "detail": {}}
        return record_verdicts(store, run_id, [row], {"fanin.q1": "fanin.q1"},
                               {"fanin.q1": inputs(run_id)})

    (n4s,) = follow("n4", "suspected")
    assert n4s != n2s and store.alert(n2s)["last_run_id"] == "n2"
    assert follow("n4", "unchanged") == [n4s] and store.alert(n4s)["status"] == "cleared"
    assert store.alert(n2s)["status"] == "suspected"
    assert follow("n5", "regression") == [n2s] and store.alert(n2s)["status"] == "confirmed"
    assert [h["run_id"] for h in stored_histories(store, "n5", store.stages("n5"))["fanin.q1"]] \
        == ["n1", "n2"]  # the report's history of n5: its setup's nights

    store.pin_release_baseline("9.4.4", "n2")
    release = release_stages(store, store.run("n4"), {"options": {"baseline": "9.4.4"}})
    judged_vs = inputs("n4", release)
    assert judged_vs["release"] is None and judged_vs["history"] == []
    assert judged_vs["new_history"] == "setup differs from release 9.4.4's (drivers.here: 1 -> 2)"


def test_what_one_setups_history_holds_does_not_reach_another(store: Store,
                                                              db_url: str) -> None:
    """Nightly setup A (n1 n2 n3) with manual runs of setup B between (m1 m2). B's alert,
    cleared, spans A's n2, whose value A's history flagged: it stays held out of A's
    baseline (before, B's alert released it). Accepting B's alert restarts B's history, not
    A's (before, one marker per stage key sent A back to learning); A's own accepted change
    still restarts A's."""
    a = {"qos": 1, "measure_s": 5}
    b = {"qos": 1, "measure_s": 60}
    for run_id, day, params in (("n1", 1, a), ("m1", 2, b), ("n2", 3, a), ("m2", 4, b),
                                ("n3", 5, a), ("tonight", 6, a)):
        nightly(store, run_id, day, params=params)
    flag(store, "n2", "suspected")
    b_alert, _ = store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate",
                                    run_id="m1", status="suspected", change_pct=-6.0)
    store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate", run_id="m2",
                       status="cleared", change_pct=-1.0)  # B's next night cleared it

    def history(setup: dict) -> dict[str, list[str]]:
        return {h["run_id"]: h["held_out"] for h in
                store.history("fanin.q1", "fp1", before_run="tonight", setup=setup)}

    assert history(a) == {"n3": [], "n2": ["delivered_rate"], "n1": []}
    assert history(b) == {"m2": [], "m1": []}

    store.set_alert_status(b_alert, "accepted")
    assert list(history(a)) == ["n3", "n2", "n1"] and list(history(b)) == ["m2", "m1"]
    store.reset_history("fanin.q1", "m2")
    assert list(history(a)) == ["n3", "n2", "n1"] and list(history(b)) == ["m2"]
    a_alert, _ = store.upsert_alert(stage_key="fanin.q1", metric="e2e_latency_p50",
                                    run_id="n2", status="confirmed", change_pct=9.0)
    store.set_alert_status(a_alert, "accepted")  # that metric's history only, of A's nights
    assert history(a) == {"n3": [], "n2": ["delivered_rate"], "n1": ["e2e_latency_p50"]}
    assert list(history(b)) == ["m2"]
    # a marker written before histories were kept apart (the stage key alone) starts all
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(insert(Baseline).values(kind="reset", label="fanin.q1", run_id="n3",
                                             created_at=T0))
    engine.dispose()
    assert list(history(a)) == ["n3"] and history(b) == {}


def test_a_release_runs_verdicts_are_not_the_rolling_historys_to_confirm(store: Store) -> None:
    """A release run whose trigger chose the rolling history (or found no release pinned)
    is judged against it but feeds none: the next nightly does not confirm its suspicion,
    and its alert and the nightlies' are each left to their own runs."""
    for run_id, day, kind in (("n1", 1, "nightly"), ("rel", 2, "release"), ("n3", 3, "nightly"),
                              ("rel2", 4, "release"), ("n5", 5, "nightly")):
        new_run(store, run_id, day, kind=kind)
        stage(store, run_id)
        store.finish_run(run_id, "ok")
    store.record_comparisons("n1", [{"stage_id": "fanin.q1", "metric": "delivered_rate",
                                     "verdict": "unchanged"}])
    store.record_comparisons("rel", [
        {"stage_id": "fanin.q1", "metric": "delivered_rate", "verdict": "suspected"},
        {"stage_id": "fanin.q1", "metric": "e2e_latency_p50", "verdict": "suspected",
         "detail": {"baseline": "release:9.4.4"}}])
    rolling = store.previous_verdicts("fanin.q1", "fp1", before_run="n3")
    assert rolling["delivered_rate"]["run_id"] == "n1"
    pinned = store.previous_verdicts("fanin.q1", "fp1", before_run="n3",
                                     baseline="release:9.4.4")
    assert pinned["e2e_latency_p50"]["run_id"] == "rel"  # the release's own lifecycle
    for day in range(6):  # nightlies judged against the rolling history between
        new_run(store, f"x{day}", 2 + (day + 1) / 10)
        stage(store, f"x{day}")
        store.record_comparisons(f"x{day}", [{"stage_id": "fanin.q1", "metric": "lost",
                                              "verdict": "unchanged"}])
    assert store.previous_verdicts("fanin.q1", "fp1", before_run="n3",
                                   baseline="release:9.4.4")["e2e_latency_p50"]["run_id"] \
        == "rel"  # they are not counted in the look-back of five

    rel_alert, _ = store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate",
                                      run_id="rel", status="suspected", change_pct=-6.0)
    (n3_alert,) = judge_one(store, "n3", "suspected", -6.5)  # its own, beside rel's
    assert n3_alert != rel_alert and store.alert(rel_alert)["last_run_id"] == "rel"
    # a release run's previous verdicts are release runs', not the nightlies' (n3's)
    assert store.previous_verdicts("fanin.q1", "fp1", before_run="rel2")["delivered_rate"][
        "run_id"] == "rel"
    assert judge_one(store, "rel2", "unchanged") == [rel_alert]  # a release run clears it
    assert store.alert(rel_alert)["status"] == "cleared"
    assert store.alert(n3_alert)["status"] == "suspected"
    assert judge_one(store, "n5", "unchanged") == [n3_alert]
    assert store.alert(n3_alert)["status"] == "cleared"


def judge_one(store: Store, run_id: str, verdict: str = "learning",
              change_pct: float = 0.5) -> list[int]:
    """Record one delivered_rate verdict for the run's only stage through the compare step's
    own inputs (its setup and host fingerprint); returns the changed alerts' ids."""
    from tasks.analysis.policy import Policy
    from tasks.steps.compare import record_verdicts, stage_inputs

    (tonight,) = store.stages(run_id)
    inputs = stage_inputs(store, run_id, tonight, Policy(), None)
    assert inputs["judged_on"].fingerprint_hash == tonight["fingerprint_hash"]
    row = {"stage_id": "fanin.q1", "metric": "delivered_rate", "verdict": verdict,
           "change_pct": change_pct, "detail": {}}
    return record_verdicts(store, run_id, [row], {"fanin.q1": "fanin.q1"}, {"fanin.q1": inputs})


def test_an_alert_opened_on_another_fingerprint_is_left_to_a_person(store: Store) -> None:
    """n2 on fp1 opens an alert; n3 to n5 run on fp2. n5's verdict, judged on fp2's nights,
    neither clears nor recovers it (before, fp2's first learning night cleared it); back on
    fp1, whose history it belongs to, n6's verdict clears it. An alert fp2's own night
    opened is cleared by fp2's nights as usual."""
    for day in range(1, 5):
        nightly(store, f"n{day}", day, fp="fp1" if day < 3 else "fp2")
    for day, fp in ((5, "fp2"), (6, "fp1")):
        new_run(store, f"n{day}", day)
        stage(store, f"n{day}", fp=fp)
    judged = partial(judge_one, store)

    old, _ = store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate", run_id="n2",
                                status="suspected", change_pct=-6.0)
    judged("n5")
    assert store.alert(old)["status"] == "suspected"
    judged("n6")  # fp1 again: its own history's verdict
    assert store.alert(old)["status"] == "cleared"
    new, _ = store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate", run_id="n4",
                                status="suspected", change_pct=-6.0)
    judged("n6")
    assert store.alert(new)["status"] == "suspected"
    judged("n5")
    assert store.alert(new)["status"] == "cleared"


def test_a_change_in_a_new_history_opens_its_own_alert_beside_the_old_one(store: Store) -> None:
    """n2 on fp1 opened a suspicion; n3 to n6 run on fp2. fp2's own suspicion and regression
    open and confirm an alert of their own, and fp1's is left as it was (before, fp2's
    suspicion only moved the old alert's last night: nothing new was told); back on fp1,
    n7's regression confirms fp1's alert (a setup's likewise: the test of each setup's own
    history above)."""
    for day in range(1, 5):
        nightly(store, f"n{day}", day, fp="fp1" if day < 3 else "fp2")
    for day, fp in ((5, "fp2"), (6, "fp2"), (7, "fp1")):
        new_run(store, f"n{day}", day)
        stage(store, f"n{day}", fp=fp)
    judged = partial(judge_one, store)

    old, _ = store.upsert_alert(stage_key="fanin.q1", metric="delivered_rate", run_id="n2",
                                status="suspected", change_pct=-6.0)
    (new,) = judged("n5", "suspected", -6.5)
    assert new != old and store.alert(new)["first_run_id"] == "n5"
    assert judged("n6", "regression", -7.0) == [new]
    assert store.alert(new)["status"] == "confirmed"
    assert (store.alert(old)["status"], store.alert(old)["last_run_id"]) == ("suspected", "n2")
    assert judged("n7", "regression", -6.2) == [old]  # fp1 again: its own history
    assert store.alert(old)["status"] == "confirmed" and store.alert(new)["last_run_id"] == "n6"
    assert [a["id"] for a in store.alerts(open_only=True)] == [old, new]


def test_release_runs_never_feed_the_rolling_history_and_pick_their_baseline(
        store: Store) -> None:
    now = datetime.now(timezone.utc)
    for i, (run_id, kind) in enumerate((("n1", "nightly"), ("rel1", "release"))):
        store.create_run(run_id, kind=kind, suite="smoke", broker_kind="mosquitto",
                         artifact_dir="/x", started_at=now - timedelta(days=5 - i))
        stage(store, run_id)
        store.finish_run(run_id, "ok")
    store.pin_release_baseline("9.4.4", "rel1")
    store.create_run("rel2", kind="release", suite="smoke", broker_kind="mosquitto",
                     artifact_dir="/x", started_at=now + timedelta(days=1))
    assert [h["run_id"] for h in store.history("fanin.q1", "fp1", before_run="rel2")] == ["n1"]
    assert store.release_baseline_for("rel2") == ("9.4.4", "rel1")
    assert store.release_baseline_for("n1") is None  # nothing was pinned when it ran
    assert [b["label"] for b in store.release_baselines()] == ["9.4.4"]
    # another broker's release pinned since: none of its stage keys are this broker's
    store.create_run("e1", kind="release", suite="smoke", broker_kind="emqx",
                     artifact_dir="/x", started_at=now - timedelta(days=1))
    store.finish_run("e1", "ok")
    store.pin_release_baseline("emqx-5.8", "e1")
    assert store.release_baseline_for("rel2") == ("9.4.4", "rel1")
    assert [b["label"] for b in store.release_baselines("mosquitto")] == ["9.4.4"]
    assert [b["label"] for b in store.release_baselines()] == ["9.4.4", "emqx-5.8"]
    # the same label pinned for another broker: its own pin, beside Mosquitto's (the
    # second pin moved the first, and Mosquitto's release runs lost their baseline)
    assert store.pin_release_baseline("9.4.4", "e1") is None  # new for emqx
    assert (store.release_baseline("9.4.4", "mosquitto"), store.release_baseline("9.4.4", "emqx")
            ) == ("rel1", "e1")
    assert store.release_baseline_for("rel2") == ("9.4.4", "rel1")
    assert [(b["broker_kind"], b["label"]) for b in store.release_baselines()] == [
        ("mosquitto", "9.4.4"), ("emqx", "emqx-5.8"), ("emqx", "9.4.4")]


def test_a_stage_invalid_in_the_pinned_release_run_is_no_reference(store: Store) -> None:
    """A run ends ok with one valid stage, so it can be pinned with others invalid: those
    compare with nothing, and say why (before, an invalid 40% drop read as the reference,
    and the same drop in the release run as unchanged)."""
    from tasks.analysis.policy import Policy
    from tasks.steps.compare import release_stages, stage_inputs

    new_run(store, "rel1", 1, kind="release")
    stage(store, "rel1", "fanin.q1", rate=6000.0, validity="invalid")
    stage(store, "rel1", "fanout.q1", key="fanout.q1", rate=9000.0)
    store.finish_run("rel1", "ok")
    store.pin_release_baseline("9.4.5", "rel1")
    new_run(store, "rel2", 2, kind="release")
    for stage_id in ("fanin.q1", "fanout.q1"):
        stage(store, "rel2", stage_id, key=stage_id, rate=6000.0)
    release = release_stages(store, store.run("rel2"), {"options": {"baseline": "9.4.5"}})
    tonight = {s["stage_id"]: s for s in store.stages("rel2")}
    invalid = stage_inputs(store, "rel2", tonight["fanin.q1"], Policy(), release)
    assert invalid["release"] is None and invalid["history"] == []
    assert invalid["new_history"] == ("invalid in release 9.4.5's run rel1 (backlog rising): "
                                      "no reference")
    valid = stage_inputs(store, "rel2", tonight["fanout.q1"], Policy(), release)
    assert valid["release"]["metrics"]["delivered_rate"] == 9000.0


@pytest.mark.parametrize("call, field", [
    (lambda s: new_run(s, "r9", kind="weekly"), "runs.kind"),
    (lambda s: s.finish_run("r1", "running"), "runs.status"),
    (lambda s: s.record_results("r1", "s1", metrics={}, series={}, validity="meh",
                                reason=None), "stages.validity"),
    (lambda s: s.record_comparisons("r1", [{"stage_id": "s1", "metric": "lost",
                                            "verdict": "worse"}]), "comparisons.verdict"),
    (lambda s: s.upsert_alert(stage_key="k", metric="lost", run_id="r1", status="open",
                              change_pct=None), "alerts.status"),
    (lambda s: s.set_alert_status(1, "snoozed"), "alerts.status"),
])
def test_bad_enum_names_the_field(store: Store, call, field: str) -> None:
    new_run(store, "r1")
    stage(store, "r1", "s1")
    with pytest.raises(StoreError, match=rf"^{field} must be one of") as err:
        call(store)
    assert "," in str(err.value)  # the allowed values are listed


def test_a_password_in_the_query_or_with_a_bare_at_is_never_shown() -> None:
    """A password given as a query parameter is not shown with the URL; one holding a
    bare '@' (which ends the password early, and makes the rest look like the host) is
    refused, naming the fix, without showing any of it."""
    shown = Store("postgresql://u:pw@127.0.0.1:1/db?password=zz9&sslmode=require",
                  retry_s=0).url_for_display
    assert shown == "postgresql+psycopg://u:***@127.0.0.1:1/db"
    for url in ("postgresql://u:s3cr@tXY@127.0.0.1:1/db", "postgresql://u:s3cr@t/XY@127.0.0.1:1/db",
                "postgresql://u:x@y:SECRET@127.0.0.1:1/db"):
        with pytest.raises(StoreError, match="as %40$") as err:
            Store(url, retry_s=0)
        assert not [part for part in ("s3cr", "XY", "SECRET") if part in str(err.value)]
    assert Store("postgresql://u:a%40b@127.0.0.1:1/db", retry_s=0).url_for_display \
        == "postgresql+psycopg://u:***@127.0.0.1:1/db"


def test_password_never_shown(pg_server: str) -> None:
    url = create_database(pg_server, "t_secret")
    password = url.split(":")[2].split("@")[0]
    store = Store(url)
    assert password not in store.url_for_display and "***" in store.url_for_display
    assert password not in repr(store)
    store.migrate()
    with pytest.raises(StoreError) as err:
        store.finish_run("nope", "ok")
    assert password not in str(err.value)
    store.close()

    wrong = url.replace(password, "hunter2-wrong")
    bad = Store(wrong)
    with pytest.raises(StoreError) as err:
        bad.migrate()
    assert "hunter2" not in str(err.value) and "password authentication failed" in str(err.value)
    cause = err.value.__cause__
    while cause is not None:
        assert "hunter2" not in str(cause)
        cause = cause.__cause__
    bad.close()
    with pytest.raises(StoreError) as err:
        Store("mysql://u:hunter2@host/db")
    assert "hunter2" not in str(err.value)
    with pytest.raises(StoreError) as err:
        Store("::not a url hunter2")
    assert "hunter2" not in str(err.value)


def test_fingerprint_hash_is_stable() -> None:
    from tasks.fingerprint import fingerprint_hash
    assert fingerprint_hash({"b": 1, "a": [1, 2]}) == fingerprint_hash({"a": [1, 2], "b": 1})
    assert fingerprint_hash({"a": 1}) != fingerprint_hash({"a": 2})
    assert fingerprint_hash({"a": 1}) == hashlib.sha256(b'{"a":1}').hexdigest()[:16]


def test_the_results_db_can_come_from_an_airflow_connection(pg_server, monkeypatch, perfpipe_env) -> None:
    from sqlalchemy.engine import make_url

    from tasks.settings import load_settings

    url = make_url(create_database(pg_server, f"t_{uuid.uuid4().hex[:12]}"))
    # its libpq extras reach the connection: TLS asked of a server without it is refused
    # (they were dropped, so sslmode=require quietly became libpq's `prefer`)
    conn = {"conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username,
            "password": url.password, "schema": url.database,
            "extra": {"sslmode": "require", "application_name": "perfpipe-test"}}
    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_RESULTS", json.dumps(conn))
    monkeypatch.setenv("PERFPIPE_DB_CONN_ID", "perfpipe_results")
    asked = make_url(load_settings().database_url()).query
    assert (asked["sslmode"], asked["application_name"]) == ("require", "perfpipe-test")
    monkeypatch.setenv("PERFPIPE_DB_RETRY_S", "0")  # refused for good: no wait
    with pytest.raises(StoreError, match="SSL"):
        load_settings().store().migrate()
    monkeypatch.delenv("PERFPIPE_DB_RETRY_S")
    conn["extra"] = {"sslmode": "disable"}
    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_RESULTS", json.dumps(conn))
    store = Store(load_settings().database_url())
    store.migrate()
    store.create_run("r1", kind="manual", suite="smoke", broker_kind="mosquitto", artifact_dir="/x")
    assert Store(url.render_as_string(hide_password=False)).run("r1")["suite"] == "smoke"
    assert url.password is None or url.password not in repr(store)
    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_RESULTS", json.dumps({"conn_type": "http", "host": "x"}))
    with pytest.raises(ValueError, match="make it a postgres Connection"):
        load_settings().database_url()
    monkeypatch.setenv("PERFPIPE_DB_CONN_ID", "perfpipe_resluts")  # misspelt: said, named
    with pytest.raises(ValueError, match="PERFPIPE_DB_CONN_ID='perfpipe_resluts': no such "
                                         "Airflow Connection"):
        load_settings().database_url()


def test_runs_migrating_a_new_sqlite_file_at_once_all_succeed(tmp_path):
    """Fault: the first night's runs (six of them here) migrate one new SQLite file at once."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'results.db'}"
    script = f"from sql import Store; Store({url!r}).migrate()"
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent) for _ in range(6)]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 6, errors
    Store(url).create_run("r", kind="manual", suite="s", broker_kind="mosquitto",
                          artifact_dir=str(tmp_path))

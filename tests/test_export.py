"""Results other tools read: the Bencher and Otava exports of a stored run, and the SQL views
(migration 0003) that Grafana's dashboard queries, on a real SQLite and a real PostgreSQL.

The history is judged by the real comparison (`tasks.steps.compare`): twelve quiet nights,
then two with 20% less throughput, so the last run has a flagged verdict and an open alert.
"""

from __future__ import annotations

import csv
import json
import math
import re
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from sql import Store
from tasks.export import export_run
from tasks.metrics import FLAGGED, METRICS
from tasks.steps.compare import compare_stored
from tasks.views import export as views
from tasks.views.history import noise_band
from tests import test_store
from tests.pg import create_database
from tests.test_store import T0

# the results store's fixtures: a real PostgreSQL server, a database on it or a SQLite file
pg_server, db_url, store = test_store.pg_server, test_store.db_url, test_store.store
REPO = Path(__file__).resolve().parent.parent
GRAFANA = REPO / "infra" / "grafana"
KEY, STAGE = "mosquitto|fanin.q1", "fanin.q1"
NIGHTS = 14  # the last two have 20% less throughput
JITTER = (1.0, 1.012, 0.991, 1.006, 0.995, 1.009, 0.988, 1.004, 0.997, 1.011, 0.993, 1.002,
          1.0, 1.007)
# The JSON schema Bencher publishes for BMF (bencher.dev/bmf.json).
BMF_SCHEMA = {"type": "object", "patternProperties": {".+": {
    "type": "object", "patternProperties": {".+": {
        "type": "object", "required": ["value"],
        "properties": {k: {"type": "number"} for k in ("value", "lower_value", "upper_value")},
        "additionalProperties": False}}}}}


def night(store: Store, day: float, run_id: str = "", *, fp: str = "fp1", extra: bool = False,
          status: str = "ok", skip: tuple[str, ...] = (), params: dict | None = None) -> str:
    """One nightly run of the stage on `day` (days after T0), judged and recorded as the
    compare step does; nights after NIGHTS - 2 have 20% less throughput."""
    run_id = run_id or f"n{int(day):02d}"
    store.create_run(run_id, kind="nightly", suite="smoke", broker_kind="mosquitto",
                     artifact_dir=f"/runs/{run_id}", started_at=T0 + timedelta(days=day))
    drop = 0.8 if day > NIGHTS - 2 else 1.0
    j = JITTER[int(day - 1) % len(JITTER)]
    metrics = {"delivered_rate": 1000.0 * drop * j, "e2e_latency_p50": 150.0 / j,
               "broker_cpu_s_per_10k": 0.4 * j, "target_rate": 1000.0, "lost": 0.0}
    store.record_stage(run_id, STAGE, scenario="fanin", stage_key=KEY,
                       params=params or {"qos": 1}, fingerprint_hash=fp)
    store.record_results(run_id, STAGE, series={}, validity="valid", reason=None,
                         metrics={k: v for k, v in metrics.items() if k not in skip})
    if extra:  # a search probe and an invalid stage: never exported
        for stage_id, validity, params in (("cap.p1", "valid", {"probe_of": "cap"}),
                                           ("burst", "invalid", {})):
            store.record_stage(run_id, stage_id, scenario="x", stage_key=f"mosquitto|{stage_id}",
                               params=params, fingerprint_hash=fp)
            store.record_results(run_id, stage_id, metrics={"delivered_rate": 5.0}, series={},
                                 validity=validity, reason=None if validity == "valid" else "x")
    compare_stored(store, run_id, {})
    store.finish_run(run_id, status)
    return run_id


def history(store: Store) -> str:
    """Nights 1..NIGHTS on fingerprint fp1 (the last with extra stages), night 3 without
    broker_cpu_s_per_10k, a failed run and a run on another fingerprint between them;
    returns the last run id."""
    for day in range(1, NIGHTS + 1):
        night(store, day, extra=day == NIGHTS, skip=("broker_cpu_s_per_10k",) if day == 3 else ())
        if day == 5:
            night(store, day + 0.5, "failed", status="failed")  # never comparable
        if day == 7:
            night(store, day + 0.5, "other-host", fp="fp2")
    return f"n{NIGHTS:02d}"


@pytest.fixture
def sqlite_store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'results.db'}")
    s.migrate()
    yield s
    s.close()


def last_stage(store: Store, run_id: str) -> dict:
    return next(s for s in store.stages(run_id) if s["stage_id"] == STAGE)


# -- Bencher -------------------------------------------------------------------------------
def test_perfpipe_export_writes_both_formats_and_names_a_bad_run_in_one_line(
        perfpipe_env: Path, tmp_path: Path, capsys) -> None:
    from tasks.cli import main
    from tasks.settings import load_settings

    store = Store(load_settings().database_url())
    store.migrate()
    last = history(store)
    bmf = tmp_path / "bmf.json"
    assert main(["export", last, "--format", "bencher", "--out", str(bmf)]) == 0
    assert KEY in json.loads(bmf.read_text())
    assert main(["export", last, "--format", "otava", "--out", str(tmp_path / "otava")]) == 0
    assert (tmp_path / "otava" / "otava.yaml").exists()
    capsys.readouterr()
    assert main(["export", "nope", "--format", "bencher", "--out", str(bmf)]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("perfpipe")]
    assert len(said) == 1 and said[0].startswith("perfpipe: no run 'nope'; recent: ['n14'")
    # a failed night is no night for Bencher's or Otava's history, unless asked for
    assert main(["export", "failed", "--format", "bencher", "--out", str(bmf)]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("perfpipe")]
    assert said == ["perfpipe: run failed is failed: other tools would take it for a good "
                    "night; export it anyway with --force"], said
    assert main(["export", "failed", "--format", "bencher", "--out", str(bmf), "--force"]) == 0

    # an --out of the wrong kind, or where nothing can be written: one line, exit 2 (it
    # was a traceback, and exit 1, which says a run did not end ok)
    for argv, message in (
            (["export", last, "--format", "bencher", "--out", str(tmp_path)],
             f"--out {tmp_path}: a folder; bencher writes one JSON file"),
            (["export", last, "--format", "otava", "--out", str(bmf)],
             f"--out {bmf}: a file; otava writes a folder of CSVs"),
            (["report", last, "--out", str(tmp_path)],
             f"--out {tmp_path}: a folder; the report is one HTML file"),
            (["report", last, "--out", str(bmf / "r.html")], f"{bmf}: File exists")):
        assert main(argv) == 2, argv
        said = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("perfpipe")]  # (beside any log lines tests may see)
        assert len(said) == 1 and said[0].startswith(f"perfpipe: {message}"), said


def test_bencher_export_holds_the_stored_metrics_in_bencher_units(sqlite_store, tmp_path):
    run_id = history(sqlite_store)
    out = tmp_path / "out" / "bmf.json"
    said: list[str] = []
    assert export_run(sqlite_store, run_id, "bencher", out, said.append) == 0
    bmf = json.loads(out.read_text())
    jsonschema.validate(bmf, BMF_SCHEMA)
    assert list(bmf) == [KEY]  # the probe and the invalid stage are left out
    stage = last_stage(sqlite_store, run_id)
    stored, measures = stage["metrics"], bmf[KEY]
    assert measures["throughput"]["value"] == stored["delivered_rate"]
    assert measures["latency"]["value"] == pytest.approx(stored["e2e_latency_p50"] * 1000)
    assert measures["broker-cpu-s-per-10k"]["value"] == stored["broker_cpu_s_per_10k"]
    assert measures["lost"]["value"] == 0.0
    assert "target-rate" not in measures  # recorded, no better-direction: not a benchmark
    assert all(re.fullmatch(r"[a-z0-9-]{1,64}", slug) for slug in measures)
    # the spread: tonight's value x exp(-/+ the noise the comparison measured)
    comparison = {c["metric"]: c for c in stage["comparisons"]}["delivered_rate"]
    assert comparison["verdict"] in FLAGGED
    sigma = comparison["detail"]["noise_pct"] / 100
    assert measures["throughput"]["lower_value"] == pytest.approx(stored["delivered_rate"] * math.exp(-sigma))
    assert measures["throughput"]["upper_value"] == pytest.approx(stored["delivered_rate"] * math.exp(sigma))
    assert "lower_value" not in measures["lost"]  # never compared: no spread
    assert "--testbed fp1" in said[-1] and str(out) in said[-1]


def test_no_spread_while_the_noise_is_not_known(sqlite_store, tmp_path):
    run_id = night(sqlite_store, 1)  # the first night: no baseline
    out = tmp_path / "bmf.json"
    export_run(sqlite_store, run_id, "bencher", out, lambda _: None)
    assert json.loads(out.read_text())[KEY]["throughput"] == {"value": 1000.0}


def test_export_refuses_what_it_cannot_write(sqlite_store, tmp_path):
    with pytest.raises(ValueError, match="no run 'nope'"):
        export_run(sqlite_store, "nope", "bencher", tmp_path / "x.json")
    run_id = night(sqlite_store, 1)
    with pytest.raises(ValueError, match="--format 'csv': use one of bencher, otava"):
        export_run(sqlite_store, run_id, "csv", tmp_path / "x")
    sqlite_store.record_results(run_id, STAGE, metrics={"lost": 3.0}, series={},
                                validity="invalid", reason="lost messages at QoS 1")
    with pytest.raises(ValueError, match="has no valid stage"):
        export_run(sqlite_store, run_id, "otava", tmp_path / "x")


# -- Otava ---------------------------------------------------------------------------------
def read_like_otava(test: dict) -> tuple[list[datetime], dict[str, list[float]], dict]:
    """What Otava's CsvImporter takes from a file: the time column, every metric column as
    floats (an empty or non-numeric cell is an error there too), the attributes."""
    with open(test["file"], newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    times = [datetime.fromisoformat(r[header.index(test["time_column"])]) for r in body]
    metrics = {name: [float(r[header.index(m["column"])]) for r in body]
               for name, m in test["metrics"].items()}
    attributes = {a: [r[header.index(a)] for r in body] for a in test["attributes"]}
    assert all(len(r) == len(header) for r in body)
    return times, metrics, attributes


def test_otava_export_is_one_series_per_stage_with_perfpipes_directions(sqlite_store, tmp_path):
    night(sqlite_store, 0.25, "before-that")  # tonight's setup, before a night of another
    night(sqlite_store, 0.5, "other-setup", params={"qos": 0})  # measured something else
    run_id = history(sqlite_store)
    said: list[str] = []
    export_run(sqlite_store, run_id, "otava", tmp_path / "otava", said.append)
    config = yaml.safe_load((tmp_path / "otava" / "otava.yaml").read_text())
    name = views.otava_name(KEY, "fp1")
    # one series, the exported stage key+fingerprint: a file of the metrics every night
    # has, and one for the metric night 3 lacks, so that night keeps its place in the first
    assert list(config["tests"]) == [name, f"{name}__broker_cpu_s_per_10k"]
    test = config["tests"][name]
    assert (test["type"], test["time_column"]) == ("csv", "time")
    assert Path(test["file"]) == (tmp_path / "otava" / f"{name}.csv").resolve()
    assert test["metrics"]["delivered_rate"] == {"column": "delivered_rate", "direction": 1}
    assert test["metrics"]["e2e_latency_p50"]["direction"] == -1
    cost = config["tests"][f"{name}__broker_cpu_s_per_10k"]
    assert list(cost["metrics"]) == ["broker_cpu_s_per_10k"]
    assert cost["metrics"]["broker_cpu_s_per_10k"]["direction"] == -1
    assert all(m["direction"] == {"higher": 1, "lower": -1}[METRICS[n].better]
               for t in config["tests"].values() for n, m in t["metrics"].items())
    assert "target_rate" not in test["metrics"] and "lost" not in test["metrics"]  # not judged

    times, metrics, attributes = read_like_otava(test)
    assert times == sorted(times) and len(set(times)) == len(times)
    # comparable nights on fp1, oldest first: one run failed, one is on fp2, and the night
    # of another setup is another history (the one before it is tonight's setup's)
    expected = ["before-that", *(f"n{d:02d}" for d in range(1, NIGHTS + 1))]
    assert attributes["run_id"] == expected
    assert set(attributes["kind"]) == {"nightly"}
    stored = {r: last_stage(sqlite_store, r)["metrics"] for r in expected}
    assert metrics["delivered_rate"] == [stored[r]["delivered_rate"] for r in expected]
    assert metrics["delivered_rate"][-1] < 0.85 * metrics["delivered_rate"][0]  # the drop is there
    _, costs, cost_attributes = read_like_otava(cost)  # every night but the one without it
    assert cost_attributes["run_id"] == [r for r in expected if r != "n03"]
    assert costs["broker_cpu_s_per_10k"] == [stored[r]["broker_cpu_s_per_10k"]
                                             for r in expected if r != "n03"]
    assert any(f"{name}.csv: 15 runs, 2 metrics (1 earlier runs left out: another setup)"
               in line for line in said), said
    assert any("__broker_cpu_s_per_10k.csv: 14 runs, 1 metrics (1 runs without it) (1 earlier "
               "runs left out: another setup)" in line for line in said), said


# -- the views and Grafana's dashboard ------------------------------------------------------
def rows(url: str, sql: str, **params) -> list[dict]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(sql), params).mappings()]
    finally:
        engine.dispose()


def test_views_show_history_alerts_and_runs(store: Store, db_url: str):
    run_id = history(store)
    stage = last_stage(store, run_id)
    got = {r["metric"]: r for r in rows(db_url, "SELECT * FROM v_metric_history WHERE "
                                        "run_id = :r AND stage_id = :s", r=run_id, s=STAGE)}
    assert {m: r["value"] for m, r in got.items()} == stage["metrics"]
    comparisons = {c["metric"]: c for c in stage["comparisons"]}
    for metric, row in got.items():
        c = comparisons.get(metric)
        assert row["verdict"] == (c and c["verdict"])
        assert row["baseline"] == (c and c["baseline_value"])
        spread = noise_band(c["baseline_value"], c) if c else None
        if spread is None:
            assert (row["band_low"], row["band_high"]) == (None, None)
        else:
            assert (row["band_low"], row["band_high"]) == (pytest.approx(spread[0]),
                                                           pytest.approx(spread[1]))
    assert got["delivered_rate"]["verdict"] in FLAGGED and got["delivered_rate"]["band_low"] is not None
    assert (got["lost"]["unit"], got["lost"]["stage_key"], got["lost"]["fingerprint_hash"]) \
        == ("msg", KEY, "fp1")
    # learning nights carry a baseline but no band
    early = rows(db_url, "SELECT verdict, baseline, band_low FROM v_metric_history WHERE "
                 "run_id = 'n03' AND metric = 'delivered_rate'")
    assert early[0]["verdict"] == "learning" and early[0]["baseline"] and early[0]["band_low"] is None
    # nor does a change flagged beyond doubt while learning: its sigma is a few nights'
    doubt = {"stage_id": STAGE, "metric": "e2e_latency_p50", "verdict": "regression",
             "baseline_value": 150.0, "value": 300.0, "change_pct": 100.0,
             "detail": {"noise_pct": 0.8, "history": 3, "note": "learning: 3 of 8 nights"}}
    store.record_comparisons("n03", [doubt])
    (flagged,) = rows(db_url, "SELECT verdict, band_low, band_high FROM v_metric_history "
                      "WHERE run_id = 'n03' AND metric = 'e2e_latency_p50'")
    assert flagged == {"verdict": "regression", "band_low": None, "band_high": None}
    assert noise_band(150.0, doubt) is None
    assert views.bencher_bmf([{**stage, "metrics": {"e2e_latency_p50": 300.0},
                               "comparisons": [doubt]}])[KEY]["latency"] == {"value": 300_000.0}
    # a run stored before a metric was renamed away: its old name is not sent, not a crash
    assert views.bencher_bmf([{**stage, "metrics": {"e2e_latency_p50": 300.0,
                                                    "broker_cpu_per_10k": 1.0},
                               "comparisons": []}])[KEY] == {"latency": {"value": 300_000.0}}

    alerts = rows(db_url, "SELECT * FROM v_open_alerts")
    assert [(a["stage_key"], a["metric"], a["id"]) for a in alerts] \
        == [(a["stage_key"], a["metric"], a["id"]) for a in store.alerts(open_only=True)]
    assert any(a["metric"] == "delivered_rate" and a["last_run_id"] == run_id for a in alerts)
    for a in alerts:
        store.set_alert_status(a["id"], "fixed")
    assert rows(db_url, "SELECT * FROM v_open_alerts") == []

    runs = {r["run_id"]: r for r in rows(db_url, "SELECT * FROM v_runs")}
    assert len(runs) == NIGHTS + 2 and runs["failed"]["status"] == "failed"
    last = runs[run_id]
    assert (last["status"], last["stages"], last["invalid_stages"]) == ("ok", 3, 1)
    assert last["regressions"] + last["suspected"] == sum(
        c["verdict"] in FLAGGED for c in stage["comparisons"]) >= 1
    assert last["duration_s"] >= 0


def grafana_sql(sql: str, variables: dict[str, list[str]]) -> str:
    """A panel's SQL as Grafana sends it: macros expanded, variables quoted (a multi-value
    variable as a comma-separated list); anything left with a $ is an error."""
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)",
                 r"\1 BETWEEN '2000-01-01T00:00:00Z' AND '2100-01-01T00:00:00Z'", sql)
    for name, values in variables.items():
        sql = sql.replace(f"'${name}'", f"'{values[0]}'").replace(f'"${name}"', f'"{values[0]}"')
        sql = sql.replace(f"${name}", ", ".join(f"'{v}'" for v in values))
    assert "$" not in sql, sql
    return sql


def dashboard_queries(dashboard: dict) -> dict[str, str]:
    queries = {f"panel {p['title']}": t["rawSql"] for p in dashboard["panels"] for t in p["targets"]}
    queries.update({f"annotation {a['name']}": a["target"]["rawSql"]
                    for a in dashboard["annotations"]["list"]})
    queries.update({f"variable {v['name']}": v["query"] for v in dashboard["templating"]["list"]})
    return queries


def test_every_dashboard_query_runs_on_postgresql(pg_server: str):
    url = create_database(pg_server, "t_grafana")
    store = Store(url)
    store.migrate()
    run_id = history(store)
    dashboard = json.loads((GRAFANA / "perfpipe-dashboard.json").read_text())
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources"
                                  / "perfpipe-results.yml").read_text())["datasources"][0]
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {provisioned["uid"]} and provisioned["type"] == "grafana-postgresql-datasource"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["stage", "metric"]

    # Grafana's user may read the views and nothing else (README)
    reader, password = f"grafana_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {reader} LOGIN PASSWORD '{password}'"))
        conn.execute(text(f"GRANT SELECT ON v_metric_history, v_open_alerts, v_runs TO {reader}"))
    # a migration that redefines a view (0005's band) keeps what was granted on it
    from alembic import command

    from sql.store import alembic_config

    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0004")
        command.upgrade(config, "head")
    engine.dispose()
    as_reader = make_url(url).set(username=reader, password=password)
    as_reader = as_reader.render_as_string(hide_password=False)
    with pytest.raises(ProgrammingError, match="permission denied"):
        rows(as_reader, "SELECT * FROM runs")

    variables = {"stage": [KEY], "metric": ["delivered_rate"]}
    results = {}
    for where, sql in dashboard_queries(dashboard).items():
        results[where] = rows(as_reader, grafana_sql(sql, variables))
    assert [r["stage_key"] for r in results["variable stage"]] \
        == sorted({KEY, "mosquitto|cap.p1", "mosquitto|burst"})
    assert {"delivered_rate", "e2e_latency_p50"} <= {r["metric"] for r in results["variable metric"]}
    history_rows = results["panel $metric per stage"]
    assert len(history_rows) == NIGHTS + 1  # valid stages of ok runs, either fingerprint
    assert [r["time"] for r in history_rows] == sorted(r["time"] for r in history_rows)
    band = results["panel $stage: $metric, baseline and noise band"]
    assert band[-1]["delivered_rate"] == last_stage(store, run_id)["metrics"]["delivered_rate"]
    assert band[-1]["band_low"] < band[-1]["baseline"] < band[-1]["band_high"]
    assert any(r["verdict"] in FLAGGED and r["run_id"] == run_id
               for r in results["panel Verdicts that moved"])
    assert any(r["metric"] == "delivered_rate" for r in results["panel Open alerts"])
    assert results["panel Runs"][0]["run_id"] == run_id
    assert "regression" in " ".join(r["text"] for r in results["annotation regressions"]) \
        or "suspected" in " ".join(r["text"] for r in results["annotation regressions"])
    store.close()

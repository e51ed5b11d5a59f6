"""A release DAG run through Airflow's dag.test() on the lab: the broker on broker1 and the
drivers on driver1 and driver2, all over SSH; Slack through the Airflow Connection
`perfpipe_slack`, pointed at a local server that speaks the Slack Web API. It runs the
shipped `rated` suite, the rated half of the nightly (checked by tests/lab_nightly.py),
promotes itself and posts its summary. The nightly and release DAGs share one graph
(dags/perfpipe_graph.py); the nightly's capacity half runs on this machine in
tests/test_slowdown.py, where a search's capacity is known exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sql import Store
from tests.lab import INVENTORY
from tests.lab_nightly import check_rated_suite

# a release DAG over SSH on the lab: about 135 s
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.xdist_group("lab")]

REPO = Path(__file__).resolve().parent.parent

TOKEN = "xoxb-lab-token-never-logged"


@pytest.fixture
def slack_connection(slack, monkeypatch):
    conn = {"conn_type": "slack", "password": TOKEN, "extra": {"base_url": slack.base_url}}
    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_SLACK", json.dumps(conn))
    return slack


def run_dag(dag_id: str, kind: str, conf: dict) -> tuple[str, str]:
    from tasks.airflow_glue.dag_test import test_dag
    from tasks.steps.plan import new_run_id

    airflow_run, state = test_dag(dag_id, conf)
    return new_run_id(kind, f"{dag_id}/{airflow_run}"), state


def ssh_threads() -> int:
    """Live SSH connections of this process: paramiko runs a thread for each."""
    import threading

    import paramiko

    return sum(isinstance(t, paramiko.Transport) for t in threading.enumerate())


def assert_spread_over_the_lab(run_dir: Path, stages: list[dict]) -> None:
    cpus = json.loads((run_dir / "hosts" / "driver2.json").read_text())["usable_cpus"]
    for stage in stages:
        plan = json.loads((run_dir / "raw" / stage["stage_id"] / "stage.json").read_text())
        hosts = Counter(p["host"] for p in plan["processes"])
        assert hosts == {"driver1": 1, "driver2": cpus}  # driver2 has procs: auto
        counts = []
        for proc in plan["processes"]:
            summary = json.loads((run_dir / "raw" / stage["stage_id"] / proc["host"]
                                  / str(proc["proc"]) / "summary.json").read_text())
            counts.append(summary["clients"]["publishers"] + summary["clients"]["subscribers"])
        assert max(counts) - min(counts) <= 1  # clients spread within one of even


def test_a_release_runs_the_rated_suite_over_ssh_on_the_lab(lab, perfpipe_env, slack_connection,
                                                           capfd, caplog):
    import os

    from tasks.settings import load_settings

    caplog.set_level("DEBUG", logger="slack_sdk")
    settings = load_settings()
    store = Store(settings.database_url())
    ssh_before = ssh_threads()
    release, state = run_dag("mqtt_perf_release", "release",
                             {"release_label": "lab-rc1", "suite": "rated", "promote": True,
                              "inventory": str(INVENTORY), "broker_version": "2.0.11"})
    assert state == "success"
    assert store.run(release)["status"] == "ok"
    # each task closed the SSH connections it opened (dag.test runs them in this process)
    assert ssh_threads() <= ssh_before
    print(check_rated_suite(settings, release))
    stages = store.stages(release)
    assert all(s["metrics"]["broker_cpu_avg"] is not None for s in stages)  # sampled on broker1
    run_dir = settings.run_dir(release)
    assert (run_dir / "report.html").exists()
    assert_spread_over_the_lab(run_dir, stages)
    hosts = {p.stem: json.loads(p.read_text()) for p in (run_dir / "hosts").glob("*.json")}
    assert set(hosts) == {"broker1", "driver1", "driver2"}
    assert all(h["pythonpath"].startswith("/opt/perfpipe/perfpipe-driver-") for h in hosts.values())
    # one kernel clock behind every lab host: the NTP-style exchange must see (almost) no offset
    assert all(abs(h["clock_offset_s"]) < 0.001 and h["clock_trusted"] for h in hosts.values())
    tuning = json.loads((run_dir / "tuning" / "driver1.json").read_text())
    assert tuning["mode"] == "apply" and any(e["action"] == "applied" for e in tuning["entries"])
    assert not (Path(settings.state_dir) / "tuning" / "driver1.json").exists()  # restored
    # the raw files collect brought over are gone from the SSH hosts; the broker's log stays
    from tasks.catalog.inventory import connect, load_inventory

    lab = load_inventory(INVENTORY)
    for name in ("driver1", "driver2", "broker1"):
        host = connect(lab, name, work_root="/tmp")
        try:
            assert not host.exists(f"{host.work_root}/{release}/raw"), name
        finally:
            host.close()
    broker1 = connect(lab, "broker1", work_root="/tmp")
    try:
        assert broker1.exists(f"{broker1.work_root}/{release}/broker/mosquitto.log")
    finally:
        broker1.close()
    assert store.release_baseline("lab-rc1", "mosquitto") == release

    (summary,) = slack_connection.posts()  # a release run always posts its summary
    assert summary.headers["Authorization"] == f"Bearer {TOKEN}"
    verdicts = [c["verdict"] for s in stages for c in s["comparisons"]]
    assert set(verdicts) == {"no_baseline"}  # nothing earlier to compare with
    assert summary.body["text"] == (f"perfpipe release lab-rc1 run {release}: no regressions "
                                    "(mosquitto 2.0.11, suite rated)")
    counts = Counter(verdicts)
    assert summary.body["blocks"][1]["text"]["text"] == "verdicts: " + ", ".join(
        f"{n} {verdict.replace('_', ' ')}" for verdict, n in counts.items())
    # the token is in no log line, no file of the run, and not in Airflow's DB (XCom)
    out, err = capfd.readouterr()
    assert f"alert: perfpipe release lab-rc1 run {release}" in out  # the task output was captured
    assert TOKEN not in caplog.text + out + err
    files = [p for p in Path(settings.state_dir).rglob("*") if p.is_file()]
    for path in files + [Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"]:
        assert TOKEN.encode() not in path.read_bytes(), path

"""The release DAG through Airflow's dag.test(): a dry run and a failing stage (promote is
tested on the lab, in tests/test_lab_pipeline.py)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from sql import Store

pytestmark = pytest.mark.xdist_group("airflow-db")

REPO = Path(__file__).resolve().parent.parent


def release(conf: dict) -> tuple[str, str]:
    from tasks.airflow_glue.dag_test import test_dag
    from tasks.steps.plan import new_run_id

    airflow_run, state = test_dag("mqtt_perf_release", conf)
    return new_run_id("release", f"mqtt_perf_release/{airflow_run}"), state


def store() -> Store:
    from tasks.settings import load_settings

    return Store(load_settings().database_url())


def test_dry_run_plans_and_loads_no_host(tiny_suite):
    run_id, state = release({"release_label": "dry", "suite": "tiny", "dry_run": True})
    assert state == "success"
    run = store().run(run_id)
    assert run["status"] == "invalid" and run["excluded"]
    assert not (Path(run["artifact_dir"]) / "raw").exists()
    assert not (Path(run["artifact_dir"]) / "broker.json").exists()


def test_a_release_gate_that_fails_closes_the_run_it_planned(tiny_suite):
    """The gate (the stage table, after plan) failing leaves teardown, whose setup comes
    after it, unrun: the gate closes the run itself, or it stayed `running` for good."""
    from tasks import rundir
    from tasks.settings import load_settings
    from tasks.steps.plan import goes_on, plan_run

    settings = load_settings()
    run_id = plan_run(settings, suite="tiny", kind="release", release_label="9.9")
    (settings.run_dir(run_id) / rundir.PLAN).unlink()  # the run's plan, gone
    with pytest.raises(FileNotFoundError):
        goes_on(run_id, dry_run=False)
    run = store().run(run_id)
    assert (run["status"], run["excluded"]) == ("failed", True), run


def test_a_failing_stage_still_tears_down_and_alerts(tiny_suite, tmp_path, slack, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_SLACK", json.dumps(
        {"conn_type": "slack", "password": "xoxb-failure", "extra": {"base_url": slack.base_url}}))
    crashing = tmp_path / "python-with-crashing-driver"
    crashing.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = tasks.driver ] && { echo "driver crashed" >&2; exit 3; }; done\n'
        f'exec {sys.executable} "$@"\n')
    crashing.chmod(0o755)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        f"hosts: [{{name: localhost, transport: local, roles: [broker, driver], python: {crashing}}}]\n"
        "broker: {host: localhost, address: 127.0.0.1}\n")
    run_id, state = release({"release_label": "broken", "suite": "tiny",
                             "inventory": str(inventory), "promote": True})
    assert state == "failed"
    run = store().run(run_id)
    assert run["status"] == "failed" and run["excluded"]  # never a baseline
    assert store().release_baseline("broken", "mosquitto") is None
    run_dir = Path(run["artifact_dir"])
    assert json.loads((run_dir / "broker.json").read_text())["stopped"]  # teardown ran
    messages = [json.loads(p.read_text()) for p in (run_dir / "failures").glob("*.json")]
    assert any(m["text"].startswith("perfpipe mqtt_perf_release: stages failed")
               and "driver localhost/0 exited before it was ready" in m["text"]
               for m in messages), messages
    posted = [c.body["text"] for c in slack.posts()]
    assert any(t.startswith("perfpipe mqtt_perf_release: stages failed") for t in posted), posted
    # promote was asked: it says why not, and is no second alert
    assert not any("promote" in t for t in posted), posted


def test_a_broker_that_does_not_start_still_closes_the_run(tiny_suite, tmp_path):
    """The broker step fails after provision and tune have touched the hosts: teardown must
    still run (restore the tuning, close the run), whatever Airflow's setup/teardown rules."""
    with socket.socket() as taken:  # the broker's port, already bound: Mosquitto cannot bind
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(
            f"hosts: [{{name: localhost, transport: local, roles: [broker, driver], "
            f"python: {sys.executable}}}]\n"
            f"broker: {{host: localhost, address: 127.0.0.1, port: {port}}}\n")
        run_id, state = release({"release_label": "no-broker", "suite": "tiny",
                                 "inventory": str(inventory)})
    assert state == "failed"
    run = store().run(run_id)
    assert run["status"] == "failed" and run["excluded"], run["status"]  # closed by teardown
    from tasks.run_context import RunContext
    from tasks.settings import load_settings

    ctx = RunContext.load(load_settings(), run_id)
    assert ctx.finished("tune", "localhost") and ctx.finished("teardown", None)
    assert not ctx.finished("broker", None)
    failure = json.loads(next(Path(run["artifact_dir"], "failures").glob("*broker.json"))
                         .read_text())["text"]  # said at once, before anything was started
    assert f"port {port} is taken by another process" in failure, failure

"""End to end on the embedded default: real Mosquitto, real Spark, real SQLite, real Airflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sql import Store

REPO = Path(__file__).resolve().parent.parent

TINY = """
name: tiny_fanin
source: "lab-scale IBM fan-in, shortened for tests"
qos: [0, 1]
publishers:
  - {group: pub, count: 20, topic: "perfpipe/test/{scenario}", rate_per_client: 25}
subscribers:
  - {group: sub, count: 1, topics: ["perfpipe/test/{scenario}"]}
stages: {clients_pct: [100], warmup_s: 1, measure_s: 4, cooldown_s: 1}
"""


@pytest.fixture
def tiny_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, perfpipe_env: Path) -> Path:
    scenarios = tmp_path / "scenarios"
    (scenarios / "catalog").mkdir(parents=True)
    (scenarios / "catalog" / "tiny_fanin.yml").write_text(TINY)
    (scenarios / "suites.yml").write_text("suites: {tiny: [tiny_fanin]}\n")
    monkeypatch.setenv("PERFPIPE_SCENARIOS_DIR", str(scenarios))
    return perfpipe_env


def assert_plausible(store: Store, run_id: str) -> list[dict]:
    run = store.run(run_id)
    assert run["status"] == "ok", run
    assert run["finished_at"] is not None
    stages = store.stages(run_id)
    assert len(stages) == 2
    for stage in stages:
        metrics = stage["metrics"]
        assert stage["validity"] == "valid", stage["reason"]
        assert metrics["target_rate"] == 500.0
        assert 0.9 < metrics["delivered_rate"] / 500.0 < 1.1  # messages really crossed the broker
        assert 0 < metrics["e2e_latency_p50"] <= metrics["e2e_latency_p99"] < 1_000_000
        assert metrics["errors"] == 0
    return stages


def test_nightly_dag_runs_end_to_end_and_compares_the_second_night(tiny_suite: Path):
    from tasks.airflow_run import test_dag
    from tasks.plan import new_run_id
    from tasks.settings import load_settings

    store = Store(load_settings().database_url())
    first_airflow, state = test_dag("mqtt_perf_nightly", {"suite": "tiny"})
    assert state == "success"
    first = new_run_id("nightly", f"mqtt_perf_nightly/{first_airflow}")
    stages = assert_plausible(store, first)
    assert {c["verdict"] for s in stages for c in s["comparisons"]} == {"no_baseline"}
    run_dir = Path(store.run(first)["artifact_dir"])
    assert (run_dir / "report.html").exists()
    message = json.loads((run_dir / "slack_message.json").read_text())
    assert "no regressions" in message["text"]
    manifest = json.loads((run_dir / "raw" / "MANIFEST.json").read_text())
    assert manifest["missing"] == [] and len(manifest["files"]) > 10

    second_airflow, state = test_dag("mqtt_perf_nightly", {"suite": "tiny"})
    assert state == "success"
    second = new_run_id("nightly", f"mqtt_perf_nightly/{second_airflow}")
    assert second != first
    stages = assert_plausible(store, second)
    verdicts = {c["metric"]: c for s in stages for c in s["comparisons"]}
    assert verdicts["delivered_rate"]["baseline_value"] is not None
    assert verdicts["delivered_rate"]["verdict"] in ("unchanged", "improvement", "suspected")


def test_cli_run_uses_an_already_running_broker_and_leaves_it_running(tiny_suite, broker, tmp_path):
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
        f"broker: {{kind: mosquitto, host: localhost, managed: false, address: 127.0.0.1, "
        f"port: {broker.port}}}\n")
    lines: list[str] = []
    outcome = run_pipeline(load_settings(), suite="tiny", inventory=inventory, say=lines.append)
    assert outcome.status == "ok"
    assert broker.process.poll() is None, "perfpipe stopped a broker it did not start"
    stages = assert_plausible(Store(load_settings().database_url()), outcome.run_id)
    assert all(s["metrics"]["broker_cpu_avg"] is None for s in stages)  # not its process
    output = "\n".join(lines)
    assert "no baseline yet" in output and outcome.report in output

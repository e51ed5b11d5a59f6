"""End to end on the embedded default: real Mosquitto, real Spark, real SQLite, real Airflow."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from sql import Store
from tests.checks import assert_plausible

pytestmark = pytest.mark.slow  # a night and a nightly DAG run (about 50 s), a CLI run (20 s)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.alone
@pytest.mark.xdist_group("airflow-db")
def test_nightly_dag_runs_end_to_end_and_compares_the_second_night(tiny_suite: Path, capfd,
                                                                   spark_connect, monkeypatch):
    from tasks.cli import main
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings
    from tasks.steps import STEPS

    store = Store(load_settings().database_url())
    # the first night without Airflow (its Spark job on the session's Spark Connect server),
    # the second through the nightly DAG as `make run` runs it (spark-submit, as deployed)
    first = run_pipeline(load_settings(), suite="tiny", kind="nightly", say=lambda _: None).run_id
    monkeypatch.delenv("PERFPIPE_SPARK_MASTER")
    stages = assert_plausible(store, first)
    assert {c["verdict"] for s in stages for c in s["comparisons"]} == {"no_baseline"}
    run_dir = Path(store.run(first)["artifact_dir"])
    assert (run_dir / "report.html").exists()
    message = json.loads((run_dir / "slack_message.json").read_text())
    assert "no regressions" in message["text"]
    manifest = json.loads((run_dir / "raw" / "MANIFEST.json").read_text())
    assert manifest["missing"] == [] and len(manifest["files"]) > 10

    capfd.readouterr()
    assert main(["nightly", "--suite", "tiny"]) == 0  # the second night as `make run` runs it
    out, err = capfd.readouterr()
    second = re.search(r"^plan +success .* run id: (\S+)$", out, re.M).group(1)
    assert second != first
    # quiet: a line per step, the stages' progress, the summary; Airflow's own lines go to
    # its log file, which the last line names
    assert err == "" and len(out.splitlines()) <= 40, out + err
    assert not re.search(r"^\d{4}-\d\d-\d\dT\S+ \[", out, re.M), out  # no Airflow log line
    for step in STEPS:
        assert re.search(rf"^{step.name}(@localhost)? +success +[\d.]+ s", out, re.M), step.name
    assert "verdicts: " in out and f"report: {store.run(second)['artifact_dir']}" in out
    last = out.splitlines()[-1]
    assert re.match(r"Airflow run manual__\S+: success \(Airflow's log: .+\.log\)$", last), last
    log = Path(last.split("Airflow's log: ")[1][:-1]).read_text()
    assert "[DAG TEST] end task task_id=teardown" in log and log.count("[info") > 100
    stages = assert_plausible(store, second)
    verdicts = {c["metric"]: c for s in stages for c in s["comparisons"]}
    assert verdicts["delivered_rate"]["baseline_value"] is not None
    # one night of history: learning the noise, no verdict from it
    assert verdicts["delivered_rate"]["verdict"] == "learning"
    assert verdicts["delivered_rate"]["detail"]["note"].startswith("learning: 1 of 8 nights")
    report = (Path(store.run(second)["artifact_dir"]) / "report.html").read_text()
    assert f'id="history-{stages[0]["stage_id"]}-delivered_rate"' in report  # two nights drawn


@pytest.mark.alone
def test_cli_run_uses_an_already_running_broker_and_leaves_it_running(tiny_suite, broker, tmp_path,
                                                                      spark_connect, capsys):
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
    for stage in stages:  # its processes found by the adapter's pattern, as a user's own broker
        metrics = stage["metrics"]
        assert metrics["broker_processes"] == 1 and metrics["broker_cpu_avg"] > 0
        assert metrics["broker_rss_avg"] > 1_000_000
        cost = metrics["broker_cpu_avg"] / 100 / (metrics["delivered_rate"] / 10_000)
        assert metrics["broker_cpu_s_per_10k"] == pytest.approx(cost, rel=1e-6)
        assert metrics["broker_rss_per_1k_conn"] == pytest.approx(
            metrics["broker_rss_avg"] / (21 / 1000), rel=1e-6)  # 20 publishers, 1 subscriber
        assert metrics["broker_connections_max"] >= 21  # $SYS: what the broker itself counts
        assert metrics["host_cpu_avg"] >= metrics["broker_cpu_avg"] * 0.5
        assert 10 < metrics["host_pace_us"] < 50_000  # the host's pace was read each second
        assert metrics["host_steal_pct"] is not None and metrics["host_steal_pct"] >= 0
        # the drivers run on the broker's host: the broker's CPU over theirs, whose sum lies
        # between the busiest one's and that times their number
        (procs,) = stage["params"]["drivers"].values()
        ratio, busiest = metrics["broker_cpu_per_driver_cpu"], metrics["driver_cpu_max"]
        assert metrics["broker_cpu_avg"] / (procs * busiest) * (1 - 1e-9) <= ratio
        assert ratio <= metrics["broker_cpu_avg"] / busiest * (1 + 1e-9)
    output = "\n".join(lines)
    assert "nothing compared: no earlier valid run" in output and outcome.report in output
    report = Path(outcome.report).read_text()
    assert "broker CPU / 10K msgs (CPU-s)" in report and "RSS / 1K conns (MiB)" in report
    assert "broker CPU / driver CPU" in report
    # teardown wrote it again with the run's final status; buckets and per-second series
    # were stored, so the latency curve and the p99 and CPU per second are drawn
    assert '<b class="status-ok">ok</b>' in report and "status <b>running</b>" not in report
    assert report.count('<svg id="latency-') == len(stages)
    assert report.count(": e2e p99 per second</title>") == len(stages)  # a chart each
    assert report.count(": broker CPU per second</title>") == len(stages)

    # teardown again over the closed run (an Airflow task cleared, or the command run
    # twice): the status stands, though a step's mark is gone now, and it says so
    from tasks import rundir
    from tasks.cli import main

    run_dir = Path(Store(load_settings().database_url()).run(outcome.run_id)["artifact_dir"])
    (run_dir / rundir.step_mark("report")).unlink()
    capsys.readouterr()
    assert main(["step", "teardown", outcome.run_id]) == 0
    assert f"run {outcome.run_id} was already closed (ok)" in capsys.readouterr().out
    assert Store(load_settings().database_url()).run(outcome.run_id)["status"] == "ok"


@pytest.mark.alone
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="broker.cpus needs 2 CPUs here")
def test_a_broker_kept_on_its_cpus_runs_there_and_perfpipes_processes_on_the_others(
        tiny_suite, tmp_path, spark_connect):
    """`broker.cpus` starts the broker on the CPUs it names, read back from /proc and
    recorded; the drivers on its host run on the others, and the fingerprint says so. A
    CPU the host lacks fails the run at the broker step, naming the field and the fix."""
    from tasks import rundir
    from tasks.catalog import cpus
    from tasks.fingerprint import run_hash
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    first = min(os.sched_getaffinity(0))
    rest = sorted(os.sched_getaffinity(0) - {first})
    embedded = yaml.safe_load((REPO / "infra/inventories/local.yml").read_text())
    inventory = tmp_path / "pinned.yml"
    inventory.write_text(yaml.safe_dump({**embedded, "broker": {**embedded["broker"],
                                                               "cpus": str(first)}}))
    settings = load_settings()
    outcome = run_pipeline(settings, suite="tiny", inventory=inventory, say=lambda _: None)
    assert outcome.status == "ok"
    run_dir = settings.run_dir(outcome.run_id)
    broker = json.loads((run_dir / rundir.BROKER).read_text())
    assert broker["cpus"] == str(first) and cpus.parse(broker["host_cpus"]) == {first, *rest}
    summaries = list((run_dir / rundir.RAW_DIR).glob("**/summary.json"))
    assert summaries and all(json.loads(p.read_text())["cpus"] == rest for p in summaries)
    (stage, *_) = Store(settings.database_url()).stages(outcome.run_id)
    hosts = [json.loads(p.read_text())["hash"]
             for p in sorted((run_dir / rundir.HOSTS_DIR).glob("*.json"))]
    tuned = [json.loads(p.read_text())["values_hash"]
             for p in sorted((run_dir / rundir.TUNING_DIR).glob("*.json"))]
    assert stage["fingerprint_hash"] == run_hash(hosts, tuned, "mosquitto",
                                                 broker_cpus=str(first))
    assert stage["fingerprint_hash"] != run_hash(hosts, tuned, "mosquitto")
    # the drivers' CPU is read over the CPUs they were left: their sum over those
    ran = [json.loads(p.read_text()) for p in summaries]
    ran = [d for d in ran if d["stage_id"] == stage["stage_id"]]
    used = sum(100 * d["publish_cpu"]["cpu_s"] / d["publish_cpu"]["wall_s"] for d in ran)
    assert stage["metrics"]["drivers_cpus_used_pct"] == pytest.approx(used / len(rest))

    absent = len(os.sched_getaffinity(0)) + 64
    inventory.write_text(yaml.safe_dump({**embedded, "broker": {**embedded["broker"],
                                                               "cpus": str(absent)}}))
    failed = run_pipeline(settings, suite="tiny", inventory=inventory, say=lambda _: None)
    assert failed.status == "failed"
    error = (settings.run_dir(failed.run_id) / rundir.ERROR_LOG).read_text()
    assert f"broker.cpus: '{absent}' names CPUs localhost does not let perfpipe use" in error


SEARCHED = """
name: tiny_search
source: "a max-rate search, shortened for tests"
qos: [0]
publishers:
  - {group: pub, count: 4, topic: "perfpipe/test/{scenario}", aggregate_rate: 400}
subscribers:
  - {group: sub, count: 1, topics: ["perfpipe/test/{scenario}"]}
stages:
  warmup_s: 1
  measure_s: 1
  cooldown_s: 0
  search: {growth: 2.0, max_probes: 2, hold_s: 1, holds: 1}
"""
RATED = """
name: tiny_rated
source: "a rated stage, shortened for tests"
qos: [0, 1]
publishers:
  - {group: pub, count: 10, topic: "perfpipe/test/{scenario}", rate_per_client: 20}
subscribers:
  - {group: sub, count: 1, topics: ["perfpipe/test/{scenario}"]}
stages: {warmup_s: 1, measure_s: 1, cooldown_s: 0}
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="broker.cpus needs 2 CPUs here")
def test_a_broker_kept_on_its_cpus_for_capacity_only_is_let_go_for_the_rated_stages(
        tiny_suite, tmp_path, spark_connect):
    """`broker.cpus_for: capacity` starts the broker anywhere, keeps it and perfpipe's
    processes apart through a max-rate search only (each of the broker's threads read from
    /proc while the search runs, and after it, as the next stages start), and records
    where: search.json, the drivers' summaries, the run's fingerprint. Not `alone`: it
    asserts where processes ran, not how fast."""
    from tasks import rundir
    from tasks.catalog import cpus
    from tasks.fingerprint import run_hash
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    scenarios = Path(os.environ["PERFPIPE_SCENARIOS_DIR"])
    (scenarios / "catalog" / "tiny_search.yml").write_text(SEARCHED)
    (scenarios / "catalog" / "tiny_rated.yml").write_text(RATED)
    (scenarios / "suites.yml").write_text("suites: {mixed: [tiny_search, tiny_rated]}\n")
    usable = os.sched_getaffinity(0)
    first, everywhere = min(usable), cpus.as_list(usable)
    rest = sorted(usable - {first})
    embedded = yaml.safe_load((REPO / "infra/inventories/local.yml").read_text())
    inventory = tmp_path / "capacity-pinned.yml"
    inventory.write_text(yaml.safe_dump({**embedded, "broker": {
        **embedded["broker"], "cpus": str(first), "cpus_for": "capacity"}}))
    settings = load_settings()
    seen: list[tuple[str, set[str]]] = []  # (what was said, the broker's threads' CPUs then)

    def watch(line: str) -> None:
        runs = list(settings.runs_dir.glob(f"*/{rundir.BROKER}"))
        if runs and (line.startswith("stage ") or "msg/s kept up" in line
                     or "msg/s fell behind" in line):
            pid = json.loads(max(runs, key=os.path.getmtime).read_text()).get("pid")
            status = "".join(p.read_text() for p in Path(f"/proc/{pid}/task").glob("*/status"))
            seen.append((line, {cpus.as_list(t) for t in cpus.allowed(status)}))

    outcome = run_pipeline(settings, suite="mixed", inventory=inventory, say=watch)
    assert outcome.status != "failed", outcome  # valid or not: where it ran is the point
    probes = [on for line, on in seen if line.startswith("  tiny_search")]
    stages = [(line.split()[2].rstrip(":"), on) for line, on in seen if line.startswith("stage ")]
    assert probes and all(on == {str(first)} for on in probes), seen
    assert stages == [("tiny_search.q0.c100.search", {everywhere}),  # started anywhere
                      ("tiny_rated.q0.c100.r100", {everywhere}),  # let go after the search
                      ("tiny_rated.q1.c100.r100", {everywhere})], seen
    run_dir = settings.run_dir(outcome.run_id)
    broker = json.loads((run_dir / rundir.BROKER).read_text())
    assert (broker["cpus"], broker["cpus_for"]) == (str(first), "capacity")
    search = json.loads((run_dir / rundir.SEARCH).read_text())
    assert list(search["broker_cpus"].values()) == [str(first)]
    ran = {}
    for path in (run_dir / rundir.RAW_DIR).glob("**/summary.json"):
        summary = json.loads(path.read_text())
        ran.setdefault("search" if "tiny_search" in summary["stage_id"] else "rated",
                       set()).add(tuple(summary["cpus"]))
    assert ran == {"search": {tuple(rest)}, "rated": {tuple(sorted(usable))}}, ran
    hosts = [json.loads(p.read_text())["hash"]
             for p in sorted((run_dir / rundir.HOSTS_DIR).glob("*.json"))]
    tuned = [json.loads(p.read_text())["values_hash"]
             for p in sorted((run_dir / rundir.TUNING_DIR).glob("*.json"))]
    recorded = Store(settings.database_url()).stages(outcome.run_id)
    assert {s["fingerprint_hash"] for s in recorded} == {
        run_hash(hosts, tuned, "mosquitto", broker_cpus=f"{first} for capacity")}
    assert run_hash(hosts, tuned, "mosquitto", broker_cpus=f"{first} for capacity") != run_hash(
        hosts, tuned, "mosquitto", broker_cpus=str(first))
    (searched,) = [s for s in recorded if s["stage_id"] == "tiny_search.q0.c100.search"]
    assert searched["params"]["drivers"] == {"localhost": 2}  # search_procs: 2, as recorded

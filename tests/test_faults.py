"""Faults injected into real runs (issue #17): a broken night never passes as a good one,
loses nothing, and leaves no run half-done. Real Mosquitto, real driver processes, real
SQLite; each test says which fault it injects."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from sql import Store
from tests.conftest import planned_run, unmanaged_run


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` with its SHA-256: what a step must leave as it was."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _one_stage_suite(tiny_suite: Path) -> str:
    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(
        "suites: {tiny0: [{scenario: tiny_fanin, qos: [0]}]}\n")
    return "tiny0"


def test_a_teardown_that_could_not_stop_the_broker_fails_its_airflow_task(
        tmp_path: Path, tiny_suite: Path) -> None:
    """Fault: the run's broker is on a host teardown cannot reach (here a broker record
    naming a host the inventory lacks). Teardown still closes the run, failed, naming it;
    under Airflow its task then fails too, so its failure alert tells the team (before,
    the task succeeded and nobody was told)."""
    from sql import Store
    from tasks import rundir
    from tasks.settings import load_settings
    from tasks.steps import Call, execute
    from tasks.steps.teardown import TeardownIncomplete

    ctx = planned_run(tmp_path, "hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
                      "broker: {kind: mosquitto, managed: false, address: 127.0.0.1, "
                      "port: 1}\n", "tiny")
    ctx.write_json(rundir.BROKER, {"kind": "mosquitto", "managed": True, "host": "ghost",
                                   "group_pid": 1, "pid": 1})
    with pytest.raises(TeardownIncomplete, match=r"closed failed, teardown incomplete: "
                                                 r"broker not stopped: .*ghost"):
        execute("teardown", ctx, Call(airflow=True))
    run = Store(load_settings().database_url()).run(ctx.run_id)
    assert run["status"] == "failed" and "teardown: broker not stopped" in run["excluded_reason"]


def test_the_airflow_aggregate_task_refuses_a_closed_run(tmp_path: Path, tiny_suite: Path
                                                         ) -> None:
    """Cleared over a closed run, the Spark operator re-ran the job and rewrote metrics/
    under the stored verdicts (it ran outside the steps' checks): now it is refused before
    spark-submit, as every other step is. The context is a stand-in for Airflow's: the
    operator reads only the plan task's XCom from it."""
    from sql import Store
    from tasks.airflow_glue.spark import AggregateOperator
    from tasks.settings import load_settings
    from tasks.steps import RunClosed

    ctx = planned_run(tmp_path, "hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
                      "broker: {kind: mosquitto, managed: false, address: 127.0.0.1, "
                      "port: 1}\n", "tiny")
    Store(load_settings().database_url()).finish_run(ctx.run_id, "ok")

    class PlanTask:  # what the operator asks of Airflow's TaskInstance
        def xcom_pull(self, task_ids: str) -> str:
            assert task_ids == "plan"
            return ctx.run_id

    operator = AggregateOperator(task_id="aggregate", application="spark/aggregate.py")
    with pytest.raises(RunClosed, match="step aggregate does not run over a finished run"):
        operator.execute({"ti": PlanTask()})
    assert not (ctx.run_dir / "metrics").exists()


@pytest.mark.slow  # about 16 s
def test_a_stages_step_run_again_starts_clean_and_a_closed_run_refuses_every_step(
        tmp_path: Path, tiny_suite: Path, broker, capsys):
    """Fault: the stages step run twice in one run (an Airflow task cleared after it ran,
    or `perfpipe step stages` typed again), the first attempt having found the broker gone
    (its broker_gone.json), then once more after teardown closed the run."""
    from sql import Store
    from tasks import rundir
    from tasks.cli import main
    from tasks.steps import Call, execute
    from tasks.steps.load_metrics import stage_failures
    from tasks.steps.plan import load_settings

    ctx = unmanaged_run(tmp_path, broker.port, _one_stage_suite(tiny_suite))
    [first] = execute("stages", ctx)
    execute("collect", ctx)
    stage_dir = ctx.run_dir / "raw" / first["stage_id"]
    first_files = _tree(stage_dir)
    first_window = json.loads((stage_dir / "stage.json").read_text())["windows"]

    gone = {"reason": "the broker died (pid 1 on localhost gone)",
            "stage_id": first["stage_id"], "skipped": []}
    ctx.write_json(rundir.BROKER_GONE, gone)  # as the first attempt would have written it
    assert first["stage_id"] in stage_failures(ctx)

    said: list[str] = []
    [second] = execute("stages", ctx, Call(say=said.append))
    assert any("starting from clean folders" in line and "discarded/1/" in line
               for line in said), said
    assert _tree(ctx.run_dir / "discarded" / "1" / "raw" / first["stage_id"]) == first_files
    # the broker the second attempt found is what counts: the first one's death is kept
    # with what it left, not told again
    assert json.loads((ctx.run_dir / "discarded" / "1" / rundir.BROKER_GONE).read_text()) == gone
    assert stage_failures(ctx) == {}
    window = json.loads((stage_dir / "stage.json").read_text())["windows"]
    assert window["start"] > first_window["end"], "the second attempt measured nothing new"
    summary = json.loads((stage_dir / "localhost" / "0" / "summary.json").read_text())
    assert summary["totals"]["published"] > 0 and second["stage_id"] == first["stage_id"]
    assert not ctx.finished("collect"), "collect's mark outlived the data it collected"
    assert ctx.finished("stages")

    execute("teardown", ctx)
    status = Store(load_settings().database_url()).run(ctx.run_id)["status"]
    assert status == "failed"  # collect and the rest never ran on the second attempt
    kept = _tree(ctx.run_dir)
    capsys.readouterr()
    for step in ("stages", "collect", "aggregate", "load_metrics"):
        assert main(["step", step, ctx.run_id]) == 2
        err = capsys.readouterr().err
        assert f"run {ctx.run_id} is closed (failed): step {step} does not run over a " \
               f"finished run" in err and "start a new run" in err
    assert _tree(ctx.run_dir) == kept, "a refused step changed the closed run's files"
    assert Store(load_settings().database_url()).run(ctx.run_id)["status"] == "failed"


def test_load_metrics_keeps_only_the_stages_of_the_attempt_it_loads(tmp_path: Path,
                                                                  tiny_suite: Path, broker):
    """Fault: the stages step run again after load_metrics had loaded its earlier attempt,
    which ran a stage (a search's probe on another path, or one the new attempt skipped)
    that this one did not. Its rows, its verdicts and the alerts they opened are dropped
    when this attempt is loaded: no value of a discarded attempt is judged or fed to a
    baseline, and no alert is left that no night can follow. The Spark job's
    output is written as the aggregate step writes it (the job is tests/test_aggregate.py's)."""
    from tasks import rundir
    from tasks.steps import Call, execute

    ctx = unmanaged_run(tmp_path, broker.port, _one_stage_suite(tiny_suite))
    [ran] = ctx.measured_stages
    store, stale = ctx.store(), f"{ran.stage_id}.p7"
    for stage_id in (ran.stage_id, stale):  # what loading the earlier attempt left
        store.record_stage(ctx.run_id, stage_id, scenario=ran.scenario,
                           stage_key=f"mosquitto|{stage_id}", params={}, fingerprint_hash=None)
        store.record_results(ctx.run_id, stage_id, metrics={"delivered_rate": 1.0}, series={},
                             validity="valid", reason=None)
    store.record_comparisons(ctx.run_id, [{"stage_id": stale, "metric": "delivered_rate",
                                           "verdict": "suspected"}])
    for key in (f"mosquitto|{stale}", f"mosquitto|{stale} vs release 9.4.5",
                f"mosquitto|{ran.stage_id}"):  # what judging it opened
        store.upsert_alert(stage_key=key, metric="delivered_rate", run_id=ctx.run_id,
                           status="suspected", change_pct=-6.0)
    ctx.write_json(rundir.STAGE_METRICS, {"stages": [
        {"stage_id": ran.stage_id, "status": "ok", "problems": [], "series": {},
         "metrics": {"delivered_rate": 400.0, "published_rate": 400.0}}]})

    said: list[str] = []
    execute("load_metrics", ctx, Call(say=said.append))
    stored = store.stages(ctx.run_id)
    assert [(s["stage_id"], s["metrics"]["delivered_rate"]) for s in stored] == \
        [(ran.stage_id, 400.0)]
    assert stored[0]["comparisons"] == []
    assert [a["stage_key"] for a in store.alerts()] == [f"mosquitto|{ran.stage_id}"]
    assert f"dropped 1 stages an earlier attempt loaded and this one did not run: {stale}" \
        in said, said


def _pause_in_window(state: Path, pid: int, after_s: float, pause_s: float, done: dict) -> None:
    """`after_s` into the measure window of the first stage.json under `state`, stop the
    process `pid` (SIGSTOP) for `pause_s`: a broker stalled, as by a GC pause or a page
    fault storm. Note when in `done`."""
    deadline = time.time() + 60
    while time.time() < deadline and not done:
        for stage_file in state.glob("runs/*/raw/*/stage.json"):
            window = json.loads(stage_file.read_text())["windows"]
            if time.time() >= window["measure_start"] + after_s:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(pause_s)
                os.kill(pid, signal.SIGCONT)
                done["at"] = time.time()
                break
        time.sleep(0.02)


@pytest.mark.alone  # the drops and the ratios depend on the pause's length
@pytest.mark.slow  # about 10 s
def test_a_probe_whose_broker_dropped_qos_1_messages_did_not_keep_up(tmp_path: Path,
                                                                     tiny_suite: Path):
    """Fault: a Mosquitto that holds one QoS 1 message in flight to a subscriber and queues
    one more (max_inflight_messages 1, max_queued_messages 1), stalled for 0.15 s in a
    probe's window: the 6 or so messages that reached it meanwhile are routed at once, and
    all but two are dropped. The subscriber still received over 95% of the window's
    messages and the backlog rose in one second only, so the probe kept up by its sends,
    deliveries and backlog; it broke QoS 1's promise, which voids its stage, so it did
    not keep up. Its loss is counted from its real summaries against its stage.json's
    receivers, as the validity gate counts it: at least the gaps its subscriber saw."""
    from tasks.driver.output import COUNTERS_FILE
    from tasks.steps.stages import probe_result, run_stage
    from tests.conftest import Broker

    (tiny_suite.parent / "scenarios" / "catalog" / "tiny_lossy.yml").write_text(
        "name: tiny_lossy\nqos: [1]\npublishers:\n  - {group: pub, count: 4, topic: "
        "'perfpipe/test/{scenario}', rate_per_client: 10}\nsubscribers:\n  - {group: sub, "
        "count: 1, topics: ['perfpipe/test/{scenario}']}\n"
        "stages: {warmup_s: 1, measure_s: 5, cooldown_s: 1}\n")
    (tiny_suite.parent / "scenarios" / "suites.yml").write_text("suites: {lossy: [tiny_lossy]}\n")
    broker = Broker(tmp_path, "max_inflight_messages 1\nmax_queued_messages 1\n")
    paused: dict = {}
    pauser = threading.Thread(target=_pause_in_window,
                              args=(tiny_suite, broker.process.pid, 1.5, 0.15, paused))
    try:
        ctx = unmanaged_run(tmp_path, broker.port, "lossy")
        [stage] = ctx.stages
        pauser.start()
        ran = run_stage(ctx, stage, ctx.broker(), progress=lambda line: None)
        result = probe_result(ctx, stage, ran)
    finally:
        if pauser.ident is not None:
            pauser.join()
        broker.kill()
    assert paused, "the broker was not paused in the window"
    assert replace(result, broken=None).keeps_up(0.05), result  # by the rule before
    assert result.received_ratio < 1
    assert not result.keeps_up(0.05)
    assert result.reason(0.05) == result.broken
    assert result.broken.endswith(" messages lost at QoS 1, which promises delivery")
    lost = int(result.broken.split()[0])
    gaps = sum(int(row["lost"]) for _, out_dir in ran["out_dirs"]
               for row in csv.DictReader(open(Path(out_dir) / COUNTERS_FILE)))
    assert lost >= gaps > 0, (lost, gaps)


def test_a_search_confirmed_by_a_hold_or_probe_the_gates_call_invalid_is_invalid(tmp_path: Path,
                                                                       tiny_suite: Path,
                                                                       broker):
    """A probe keeps up on what it sent and received (within 5%); a hold that did so while
    losing messages at QoS 1 fails the validity gates. Its search vouched for that rate and
    for the cost measured over it: now invalid, with the hold's reasons (its figures kept).
    The search judges such loss itself now (the test above); this is the net under it for
    any gate it does not judge, such as an aggregation in part."""
    from tasks import rundir
    from tasks.catalog.stages import probe
    from tasks.steps import Call, execute

    (tiny_suite.parent / "scenarios" / "catalog" / "tiny_search.yml").write_text(
        "name: tiny_search\nqos: [1]\npublishers:\n  - {group: pub, count: 4, topic: "
        "'perfpipe/test/{scenario}', rate_per_client: 20}\nsubscribers:\n  - {group: sub, "
        "count: 1, topics: ['perfpipe/test/{scenario}']}\nstages: {warmup_s: 1, measure_s: "
        "1, cooldown_s: 0, search: {max_probes: 2, hold_s: 2, holds: 1}}\n")
    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(
        "suites: {searched: [tiny_search]}\n")
    ctx = unmanaged_run(tmp_path, broker.port, "searched")
    [template] = ctx.stages
    hold = probe(template, 160.0, 1, hold_s=2)
    kept = {"rate": 160.0, "sent_ratio": 1.0, "received_ratio": 0.97, "errors": 0,
            "connects_failed": 0, "kept_up": True, "why": "kept up", "retried": False,
            "driver_cpu": 5.0, "drivers_cpus_used": 5.0}
    ctx.write_json(rundir.SEARCH, {"probes": [hold.to_dict()], "outcomes": {
        template.stage_id: {"max_rate": 160.0, "ceiling": 320.0, "converged": True,
                            "reason": None, "probes": [], "holds": [kept], "hold_s": 2}}})
    ctx.write_json(rundir.STAGE_METRICS, {"stages": [
        {"stage_id": hold.stage_id, "status": "ok", "problems": [], "series": {},
         "metrics": {"delivered_rate": 155.2, "published_rate": 160.0, "target_rate": 160.0,
                     "expected_delivery_rate": 160.0, "achieved_ratio": 0.97, "lost": 96,
                     "broker_cpu_s_per_10k": 0.5}}]})
    execute("load_metrics", ctx, Call(say=lambda line: None))
    stored = {s["stage_id"]: s for s in ctx.store().stages(ctx.run_id)}
    searched = stored[template.stage_id]
    assert stored[hold.stage_id]["validity"] == "invalid"
    assert searched["validity"] == "invalid"
    assert searched["reason"] == (f"the hold that confirmed 160 msg/s ({hold.stage_id}) is "
                                  "invalid: 96 messages lost at QoS 1, which promises delivery")
    assert searched["metrics"]["max_rate"] == 160.0  # recorded, for the report
    # a confirming hold the aggregation has no results of vouches for nothing either
    ctx.write_json(rundir.STAGE_METRICS, {"stages": []})
    execute("load_metrics", ctx, Call(say=lambda line: None))
    (searched,) = ctx.store().stages(ctx.run_id)
    assert (searched["validity"], searched["reason"]) == ("invalid", (
        f"the hold that confirmed 160 msg/s ({hold.stage_id}) is invalid: it has no stage "
        "results"))

    # a search without holds (the release suite's ibm_fanin_maxrate): the probe that found
    # its rate vouches for it, and was not looked at (a best probe the gates call invalid
    # left max_rate valid)
    best = probe(template, 160.0, 2)
    record = {"probes": [probe(template, 80.0, 1).to_dict(), best.to_dict()], "outcomes": {
        template.stage_id: {"max_rate": 160.0, "ceiling": 170.0, "converged": True,
                            "reason": None, "holds": [], "hold_s": 0,
                            "probes": [{**kept, "rate": 80.0}, kept]}}}
    ctx.write_json(rundir.SEARCH, record)
    ctx.write_json(rundir.STAGE_METRICS, {"stages": [
        {"stage_id": best.stage_id, "status": "partial", "problems": ["driver h/0: no summary"],
         "series": {}, "metrics": {"delivered_rate": 155.2, "published_rate": 160.0,
                                   "target_rate": 160.0, "expected_delivery_rate": 160.0,
                                   "achieved_ratio": 0.97}}]})
    execute("load_metrics", ctx, Call(say=lambda line: None))
    searched = {s["stage_id"]: s for s in ctx.store().stages(ctx.run_id)}[template.stage_id]
    assert searched["validity"] == "invalid"
    assert searched["reason"].startswith(f"the probe that confirmed 160 msg/s ({best.stage_id}) "
                                         "is invalid: aggregation partial"), searched["reason"]


SECRET_SCENARIO = """
name: tiny_login
qos: [0]
publishers:
  - {group: pub, count: 4, topic: "perfpipe/test/{scenario}", rate_per_client: 20}
subscribers:
  - {group: sub, count: 1, topics: ["perfpipe/test/{scenario}"]}
stages: {warmup_s: 1, measure_s: 3, cooldown_s: 1}
connection: {username: perfpipe, password_env: PERFPIPE_TEST_MQTT_PASSWORD}
"""


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                addresses.add(local.rsplit(":", 1)[0])
    return addresses


def test_children_see_no_secret_they_do_not_need_and_the_broker_binds_one_address(
        tmp_path: Path, tiny_suite: Path, monkeypatch):
    """Fault (security): perfpipe runs with the Slack token, the DB's URL and an Airflow
    connection in its environment; the scenario's drivers need an MQTT password from one;
    the inventory names the broker's address by host name."""
    from tasks.steps import Call, execute

    secrets = {"PERFPIPE_SLACK_TOKEN": "xoxb-not-for-children",
               "PERFPIPE_DB_URL": f"sqlite:///{tiny_suite}/results.db",
               "AIRFLOW_CONN_RESULTS": "postgresql://perf:hunter2@db/results"}
    for name, value in {**secrets, "PERFPIPE_TEST_MQTT_PASSWORD": "mqtt-pass"}.items():
        monkeypatch.setenv(name, value)
    scenarios = tiny_suite.parent / "scenarios"
    (scenarios / "catalog" / "tiny_login.yml").write_text(SECRET_SCENARIO)
    (scenarios / "suites.yml").write_text("suites: {login: [tiny_login]}\n")
    ctx = planned_run(tmp_path, "hosts: [{name: localhost, transport: local, roles: [broker, "
                   "driver], procs: 1}]\nbroker: {kind: mosquitto, host: localhost, address: "
                   "localhost}\n", "login")
    seen: dict[str, dict[str, str]] = {}
    try:
        execute("provision", ctx, Call(host="localhost"))
        execute("broker", ctx)
        broker = ctx.broker()
        seen["broker"] = _environ(broker["pid"])
        assert _listening(broker["port"]) == {"0100007F"}  # 127.0.0.1 only, not 0.0.0.0

        stages = threading.Thread(target=execute, args=("stages", ctx))
        stages.start()
        while stages.is_alive():
            for pid_file in (ctx.run_dir / "raw").rglob("*.pid"):
                environ = _environ(int(pid_file.read_text() or 0))
                if environ is not None:
                    seen[str(pid_file.relative_to(ctx.run_dir))] = environ
            time.sleep(0.1)
        stages.join()
    finally:
        execute("teardown", ctx)
    drivers = [name for name in seen if name.endswith("driver.log.pid")]
    assert drivers and len(seen) >= 3, sorted(seen)  # the broker, a driver, the sampler
    for name, environ in seen.items():
        assert environ and "PATH" in environ, name
        assert not set(secrets) & set(environ), (name, sorted(set(secrets) & set(environ)))
    assert all(seen[name]["PERFPIPE_TEST_MQTT_PASSWORD"] == "mqtt-pass" for name in drivers)
    (summary,) = (ctx.run_dir / "raw").rglob("summary.json")
    assert json.loads(summary.read_text())["totals"]["connects_ok"] == 5


def test_a_broker_whose_start_fails_after_it_was_launched_is_stopped(
        tmp_path: Path, tiny_suite: Path) -> None:
    """Fault: the managed broker comes up, then the broker step fails (the run's CA cannot
    be installed on a driver host: its folder is a file there). Its state never reached
    broker.json, so teardown would not know of it: the step stops it itself, and says
    the step's own error. The step retried then starts a broker of its own."""
    from tasks.hosts import HostError
    from tasks.ports import free_port
    from tasks.steps import Call, execute
    from tasks.steps.broker import stop_broker

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    scenarios = tiny_suite.parent / "scenarios"
    (scenarios / "catalog" / "tiny_tls.yml").write_text(
        (scenarios / "catalog" / "tiny_fanin.yml").read_text().replace(
            "name: tiny_fanin", "name: tiny_tls") + "connection: {tls: {port: "
        f"{free_port()}, ca_file: {blocked}/perfpipe-ca.pem}}}}\n")
    (scenarios / "suites.yml").write_text("suites: {tls: [tiny_tls]}\n")
    port = free_port()
    ctx = planned_run(tmp_path, "hosts: [{name: localhost, transport: local, roles: [broker, "
                   f"driver], procs: 1}}]\nbroker: {{kind: mosquitto, host: localhost, "
                   f"address: 127.0.0.1, port: {port}}}\n", "tls")
    execute("provision", ctx, Call(host="localhost"))
    with pytest.raises(HostError, match="not-a-folder"):
        execute("broker", ctx)
    pid = int((ctx.run_dir / "broker" / "mosquitto.log.pid").read_text())  # it had come up
    deadline = time.monotonic() + 10
    while _environ(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if _environ(pid) is not None:
        os.kill(pid, signal.SIGKILL)  # not left behind by this test either
        pytest.fail("the broker a failed start launched is still running")
    assert _listening(port) == set()
    assert stop_broker(ctx) == "no broker was started"  # nothing left for teardown

    # Airflow retries the step once the folder is fixed: the stopped broker's exit code,
    # left in its log folder, is not this start's (it said "exited with 143" at once)
    blocked.unlink()
    try:
        execute("broker", ctx)
        assert _listening(port) == {"0100007F"}
    finally:
        execute("teardown", ctx)


def test_a_broker_port_another_server_listens_on_is_refused_before_the_start(
        tmp_path: Path, tiny_suite: Path, broker) -> None:
    """Fault: the inventory gives the managed broker a port the host's own Mosquitto
    already listens on. Mosquitto fails to bind within milliseconds, and the health check
    mostly saw it exit; a broker that takes seconds to bind (RabbitMQ, ActiveMQ) had the
    health check's CONNECT answered by the other server, the step passed, and every stage
    then failed with "broker died". Now the step says so before it starts anything."""
    from tasks.brokers import BrokerError
    from tasks.steps import Call, execute

    ctx = planned_run(tmp_path, "hosts: [{name: localhost, transport: local, roles: [broker, "
                      f"driver], procs: 1}}]\nbroker: {{kind: mosquitto, host: localhost, "
                      f"address: 127.0.0.1, port: {broker.port}}}\n", "tiny")
    execute("provision", ctx, Call(host="localhost"))
    with pytest.raises(BrokerError, match=f"localhost: port {broker.port} is taken by another "
                                          "process"):
        execute("broker", ctx)
    assert not (ctx.run_dir / "broker" / "mosquitto.log.pid").exists()  # nothing launched
    assert broker.process.poll() is None  # the host's own broker untouched


def test_teardown_stops_only_the_driver_groups_the_run_launched(tmp_path: Path,
                                                                tiny_suite: Path) -> None:
    """Fault: teardown run again days later (`perfpipe step teardown RUN` once the
    database is back), when a driver group's id names another process group: that group
    is left alone, the run's own is stopped."""
    import subprocess

    from tasks.hosts import LocalHost
    from tasks.steps.teardown import stop_stage_processes

    ctx = planned_run(tmp_path, "hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
                   "broker: {kind: mosquitto, managed: false, address: 127.0.0.1, "
                   "port: 1883}\n", "tiny")
    ours, other, later = (subprocess.Popen(["sleep", "60"], start_new_session=True)
                          for _ in range(3))
    try:
        here = LocalHost()
        ctx.write_json("processes/tiny.json", {"processes": [
            {"host": "localhost", "group_pid": ours.pid, "started": here.started(ours.pid)},
            # as if the run's driver had ended and the kernel had given its id to `other`
            {"host": "localhost", "group_pid": other.pid,
             "started": here.started(other.pid) - 1},
            # a driver already gone when the stages step recorded it, its id given since
            {"host": "localhost", "group_pid": later.pid, "started": None}]})
        assert stop_stage_processes(ctx) == 1
        assert ours.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None, "teardown signalled a process group the run never had"
        assert later.poll() is None, "teardown signalled a process group the run never had"
    finally:
        for proc in (ours, other, later):
            proc.kill()
            proc.wait()


def test_the_secret_filter_keeps_what_is_asked_and_nothing_else():
    from tasks.child_env import child_env

    environ = {"PATH": "/bin", "PERFPIPE_SLACK_TOKEN": "t", "PERFPIPE_DB_URL": "u",
               "AIRFLOW_CONN_X": "c", "AIRFLOW__CORE__FERNET_KEY": "k", "MQTT_PASSWORD": "p",
               "GITHUB_TOKEN": "g", "PERFPIPE_STATE_DIR": "/s", "AIRFLOW_HOME": "/a"}
    assert child_env(environ=environ) == {"PATH": "/bin", "PERFPIPE_STATE_DIR": "/s",
                                          "AIRFLOW_HOME": "/a"}
    assert child_env(["MQTT_PASSWORD"], environ=environ, EXTRA="1") == {
        "PATH": "/bin", "PERFPIPE_STATE_DIR": "/s", "AIRFLOW_HOME": "/a", "MQTT_PASSWORD": "p",
        "EXTRA": "1"}


def _kill_in_windows(state: Path, victims: dict[str, tuple[float, Callable[[Path], int]]],
                     done: dict) -> None:
    """For each stage id in `victims` = {stage: (after_s, pid_of)}, `after_s` into its
    measure window, SIGKILL the process whose pid `pid_of(run folder)` reads; note pid,
    time and window in `done`."""
    deadline = time.time() + 180
    while time.time() < deadline and len(done) < len(victims):
        for stage_file in state.glob("runs/*/raw/*/stage.json"):
            stage = stage_file.parent.name
            window = json.loads(stage_file.read_text())["windows"]
            if stage in victims and stage not in done and \
                    time.time() >= window["measure_start"] + victims[stage][0]:
                pid = victims[stage][1](stage_file.parents[2])
                os.kill(pid, signal.SIGKILL)
                done[stage] = {"pid": pid, "at": time.time(), "window": window}
        time.sleep(0.1)


@pytest.mark.alone
@pytest.mark.slow  # about 20 s
def test_a_driver_then_the_broker_killed_mid_stage_fail_the_run_and_lose_no_measured_second(
        tmp_path: Path, tiny_suite: Path, spark_connect):
    """Faults, one per stage of a three-stage run on a managed Mosquitto: in the first
    stage one of two driver processes is killed with SIGKILL, in the second the broker."""
    from sql import Store
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(
        "suites: {faults: [{scenario: tiny_fanin, qos: [0, 1, 2], stages: {measure_s: 5}}]}\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [broker, driver], "
                         "procs: 2}]\nbroker: {kind: mosquitto, host: localhost, "
                         "address: 127.0.0.1}\n")
    first, second, third = (f"tiny_fanin.q{q}.c100.r100" for q in (0, 1, 2))
    victims = {  # the driver late enough to have measured seconds, the broker early
        first: (3, lambda run: int((run / "raw" / first / "localhost/0/driver.log.pid")
                                   .read_text())),
        second: (1, lambda run: json.loads((run / "broker.json").read_text())["pid"])}
    killed: dict = {}
    killer = threading.Thread(target=_kill_in_windows, args=(tiny_suite, victims, killed))
    killer.start()
    lines: list[str] = []
    outcome = run_pipeline(load_settings(), suite="faults", inventory=inventory,
                           say=lines.append)
    killer.join()
    assert set(killed) == {first, second}, killed

    store = Store(load_settings().database_url())
    run = store.run(outcome.run_id)
    run_dir = Path(run["artifact_dir"])
    died = "driver localhost/0 died (signal 9, SIGKILL)"
    gone = f"the broker died (pid {killed[second]['pid']} on localhost gone at "
    assert outcome.status == "failed" and run["status"] == "failed" and run["excluded"]
    assert run["excluded_reason"].startswith(f"run failed: {first}: {died}; {second}: {gone}")
    assert run["excluded_reason"].endswith("; 1 stages left skipped")
    assert any(line.strip() == died for line in lines), lines
    assert any(line.startswith(gone) and line.endswith(": 1 stages left skipped")
               for line in lines), lines

    # the driver: its exit code, and every second it measured before it died
    recorded = json.loads((run_dir / "raw" / first / "drivers_failed.json").read_text())
    assert recorded["exit_codes"] == {"localhost/0": 137, "localhost/1": 0}
    out = run_dir / "raw" / first / "localhost"
    assert not (out / "0" / "summary.json").exists() and (out / "1" / "summary.json").exists()
    with open(out / "0" / "counters.csv") as handle:
        rows = list(csv.DictReader(handle))
    at, window = killed[first]["at"], killed[first]["window"]
    measured = [r for r in rows if window["measure_start"] <= int(r["second"]) < at]
    assert measured and all(int(r["published"]) > 0 for r in measured), rows
    # appended up to ~2 s before it died (-4: a stall of the driver or of the killer thread
    # may push that past a second boundary)
    assert int(rows[-1]["second"]) >= int(at) - 4

    # the broker: that stage stopped and said when, the one after it never started
    assert not (run_dir / "raw" / third).exists()
    stages = {s["stage_id"]: s for s in store.stages(outcome.run_id)}
    assert set(stages) == {first, second}
    assert stages[first]["validity"] == "invalid" and stages[first]["reason"].startswith(died)
    assert stages[second]["validity"] == "invalid"
    assert stages[second]["reason"].startswith(f"stopped early: {gone}"), stages[second]
    assert json.loads((run_dir / "broker.json").read_text())["stopped"]  # teardown ran

    told = json.dumps(json.loads((run_dir / "slack_message.json").read_text())["invalid"])
    assert died in told and gone in told, told


@pytest.mark.slow  # about 18 s
def test_two_runs_at_once_take_turns_on_the_lab(tmp_path: Path, tiny_suite: Path, broker):
    """Fault: two runs on one inventory start their stages in the same second (two
    `perfpipe step stages`, or a CLI run beside an Airflow one)."""
    from tasks.steps import Call, execute

    suite = _one_stage_suite(tiny_suite)
    for i in range(2):
        (tmp_path / str(i)).mkdir()
    runs = [unmanaged_run(tmp_path / str(i), broker.port, suite) for i in range(2)]
    said: list[list[str]] = [[], []]
    both = [threading.Thread(target=execute, args=("stages", ctx, Call(say=said[i].append)))
            for i, ctx in enumerate(runs)]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join()

    windows = []
    for ctx in runs:
        assert ctx.finished("stages")
        (stage_file,) = (ctx.run_dir / "raw").glob("*/stage.json")
        window = json.loads(stage_file.read_text())["windows"]
        windows.append((window["start"], window["end"]))
    (_, first_end), (second_start, _) = sorted(windows)
    assert first_end <= second_start, f"the two runs measured at once: {windows}"
    waited = [line for lines in said for line in lines if line.startswith("waiting for the lab ")]
    assert len(waited) == 1 and "taken by run " in waited[0] and "step stages" in waited[0], said


HOLD_THE_LAB = """
import sys, time
from pathlib import Path
from tasks.locks import held
with held(Path(sys.argv[1]), {"run": "other-run", "step": "stages"}, wait_s=0):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_cli_run_that_cannot_get_the_lab_says_who_has_it_and_leaves_no_run(
        tmp_path: Path, tiny_suite: Path, monkeypatch):
    """Fault: a CLI run starts while another process holds the lab past the wait."""
    import subprocess
    import sys

    import pytest

    from tasks.locks import LockBusy
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    monkeypatch.setenv("PERFPIPE_LAB_WAIT_S", "1")
    settings = load_settings()
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("name: shared\nhosts: [{name: localhost, transport: local, "
                         "roles: [driver]}]\nbroker: {kind: mosquitto, managed: false, "
                         "address: 127.0.0.1, port: 1}\n")
    holder = subprocess.Popen(  # another process on the same lab, holding it
        [sys.executable, "-c", HOLD_THE_LAB,
         str(settings.state_dir / "locks" / "lab-shared.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said: list[str] = []
        with pytest.raises(LockBusy, match="taken by run other-run, step stages, since "):
            run_pipeline(settings, suite="tiny", inventory=inventory, say=said.append)
    finally:
        holder.kill()
        holder.wait()
    assert said and said[0].startswith("waiting for the lab 'shared': taken by run other-run")
    assert not settings.runs_dir.exists() or not any(settings.runs_dir.iterdir())


@pytest.mark.alone
@pytest.mark.slow  # about 12 s
def test_a_run_slack_refused_ends_ok_with_a_warning_and_its_own_exit_code(
        tmp_path: Path, tiny_suite: Path, broker, slack, spark_connect, monkeypatch, capsys):
    """Fault: Slack refuses every call (`invalid_auth`) during a release run, which always
    posts its summary. The results are good (the run stays `ok` and feeds baselines), but
    the run carries the warning, `perfpipe run` exits 5, and the summary is kept."""
    from sql import Store
    from tasks.cli import main
    from tasks.settings import load_settings

    monkeypatch.setenv("PERFPIPE_SLACK_TOKEN", "xoxb-refused")
    monkeypatch.setenv("PERFPIPE_SLACK_BASE_URL", slack.base_url)
    slack.refused = "invalid_auth"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
                         "broker: {kind: mosquitto, host: localhost, managed: false, address: "
                         f"127.0.0.1, port: {broker.port}}}\n")
    code = main(["run", "--suite", _one_stage_suite(tiny_suite), "--inventory", str(inventory),
                 "--kind", "release", "--release-label", "2.0.18"])
    said = capsys.readouterr().out
    assert code == 5, said
    (run,) = Store(load_settings().database_url()).latest_runs(5)
    assert run["status"] == "ok" and not run["excluded"]
    assert run["warning"] == ("Slack not told: Slack refused chat_postMessage: invalid_auth "
                              "(HTTP 200); 0 alert(s) kept for the next run")
    assert f"warning: {run['warning']}" in said  # in the run's summary
    kept = json.loads((Path(run["artifact_dir"]) / "slack_message.json").read_text())
    assert kept["posted"] is False and kept["text"].startswith("perfpipe release 2.0.18 run ")
    assert [c.method for c in slack.calls] == ["chat.postMessage"]


FILL_WHEN_MEASURING = """
mount -t tmpfs -o size=16M tmpfs "$STATE"
( until ls "$STATE"/runs/*/raw/*/stage.json >/dev/null 2>&1; do sleep 0.1; done
  sleep 2; dd if=/dev/zero of="$STATE/filler" bs=1M 2>/dev/null ) &
exec "$PYTHON" -m tasks.cli run --suite "$SUITE" --inventory "$INVENTORY"
"""


@pytest.mark.slow  # about 23 s
def test_a_disk_that_fills_mid_stage_fails_the_run_saying_so_and_leaves_nothing_running(
        tmp_path: Path, tiny_suite: Path):
    """Fault: the run folder's disk (a 16 MiB tmpfs, in a mount namespace of the test's
    own) fills up a second into the measure window."""
    import subprocess
    import sys

    from sql import Store
    from tasks.settings import REPO_ROOT

    state, db = tmp_path / "small-disk", tmp_path / "results.db"
    state.mkdir()
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [broker, driver]}]"
                         "\nbroker: {kind: mosquitto, host: localhost, address: 127.0.0.1}\n")
    env = {**os.environ, "STATE": str(state), "PYTHON": sys.executable, "INVENTORY": str(inventory),
           "SUITE": _one_stage_suite(tiny_suite), "PERFPIPE_STATE_DIR": str(state),
           "PERFPIPE_DB_URL": f"sqlite:///{db}"}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                           FILL_WHEN_MEASURING], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=240, check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said, said
    assert "stopping the stage: the disk of " in said and " is full (" in said, said
    (run,) = Store(f"sqlite:///{db}").latest_runs(5)
    assert run["status"] == "failed" and " is full (" in run["excluded_reason"], run
    assert Store(f"sqlite:///{db}").stages(run["run_id"]) == []  # nothing half-loaded
    broker_pid = int(said.split("stopped mosquitto (pid ")[1].split(")")[0])
    assert not Path(f"/proc/{broker_pid}").exists()
    left = subprocess.run(["pgrep", "-f", f"tasks.driver.*{run['run_id']}"],
                          capture_output=True, text=True, check=False)
    assert left.stdout == "", left.stdout  # no driver left running


def test_a_cli_run_stopped_by_sigterm_tears_down_and_closes_the_run(
        tmp_path: Path, tiny_suite: Path) -> None:
    """Fault: `perfpipe run` gets SIGTERM inside its stages (a CI job's timeout, `timeout`,
    a closed SSH session: SIGHUP). Python's default ended it at once: no teardown, so
    the broker, the drivers and the sampler (each in a session of its own) ran on and the
    run stayed `running`. Now the steps stop, and teardown stops what the run started and
    closes it failed. (Raised as a KeyboardInterrupt, a signal that came while a host
    command ran was lost: invoke takes that as meant for the command and goes on.)"""
    import subprocess
    import sys

    from tasks.settings import load_settings

    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [broker, driver], "
                         "procs: 1}]\nbroker: {kind: mosquitto, host: localhost, address: "
                         "127.0.0.1}\n")
    run = subprocess.Popen([sys.executable, "-m", "tasks.cli", "run", "--suite", "tiny",
                            "--inventory", str(inventory)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    said: list[str] = []
    try:
        for line in run.stdout:  # the broker is up: the stages step is next
            said.append(line)
            if line.startswith("broker: "):
                break
        def launched() -> int:  # the groups teardown knows of: the drivers, then the sampler
            return max((len(json.loads(p.read_text() or "{}").get("processes", []))
                        for p in tiny_suite.glob("runs/*/processes/*.json")), default=0)

        deadline = time.monotonic() + 60  # inside the first stage: its sampler started
        while launched() < 2:
            assert time.monotonic() < deadline and run.poll() is None, "no stage started"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    said.append(out)
    whole = "".join(said)
    assert run.returncode == 1, whole
    assert "FAILED: RunStopped: stopped by SIGTERM" in whole
    assert "teardown: " in whole
    (run_id,) = re.findall(r"run id: (\S+)", whole)
    assert Store(load_settings().database_url()).run(run_id)["status"] == "failed"
    run_dir = load_settings().run_dir(run_id)
    groups = [g["group_pid"] for p in (run_dir / "processes").glob("*.json")
              for g in json.loads(p.read_text())["processes"]]
    broker = json.loads((run_dir / "broker.json").read_text())
    assert len(groups) >= 2, groups  # a driver, the sampler
    assert [pid for pid in [*groups, broker["pid"]] if _environ(pid) is not None] == []

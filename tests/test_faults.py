"""Faults injected into real runs (issue #17): a broken night never passes as a good one,
loses nothing, and leaves no run half-done. Real Mosquitto, real driver processes, real
SQLite; each test says which fault it injects."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

from tests.conftest import unmanaged_run


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` with its SHA-256: what a step must leave as it was."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _one_stage_suite(tiny_suite: Path) -> str:
    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(
        "suites: {tiny0: [{scenario: tiny_fanin, qos: [0]}]}\n")
    return "tiny0"


def test_a_stages_step_run_again_starts_clean_and_a_closed_run_refuses_every_step(
        tmp_path: Path, tiny_suite: Path, broker, capsys):
    """Fault: the stages step run twice in one run (an Airflow task cleared after it ran,
    or `perfpipe step stages` typed again), then once more after teardown closed the run."""
    from sql import Store
    from tasks.cli import main
    from tasks.steps import Call, execute
    from tasks.steps.plan import load_settings

    ctx = unmanaged_run(tmp_path, broker.port, _one_stage_suite(tiny_suite))
    [first] = execute("stages", ctx)
    execute("collect", ctx)
    stage_dir = ctx.run_dir / "raw" / first["stage_id"]
    first_files = _tree(stage_dir)
    first_window = json.loads((stage_dir / "stage.json").read_text())["windows"]

    said: list[str] = []
    [second] = execute("stages", ctx, Call(say=said.append))
    assert any("starting from clean folders" in line and "discarded/1/" in line
               for line in said), said
    assert _tree(ctx.run_dir / "discarded" / "1" / "raw" / first["stage_id"]) == first_files
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


def _kill_when_measuring(state: Path, proc: str, after_s: float, killed: dict) -> None:
    """Wait for driver process `proc` of the run under `state` to be `after_s` into its
    measure window, then SIGKILL it (the driver only: its launching shell stays)."""
    deadline = time.time() + 120
    while time.time() < deadline and not killed:
        for pid_file in state.glob(f"runs/*/raw/*/localhost/{proc}/driver.log.pid"):
            stage = json.loads((pid_file.parents[2] / "stage.json").read_text()) \
                if (pid_file.parents[2] / "stage.json").exists() else None
            if stage and time.time() >= stage["windows"]["measure_start"] + after_s:
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGKILL)
                killed.update(pid=pid, at=time.time(), window=stage["windows"],
                              out=pid_file.parent)
                return
        time.sleep(0.1)


def test_a_driver_killed_mid_stage_fails_the_run_keeps_its_seconds_and_is_alerted(
        tmp_path: Path, tiny_suite: Path, broker, spark_connect):
    """Fault: one of two driver processes is killed with SIGKILL 3 s into its window."""
    from sql import Store
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(
        "suites: {tiny0: [{scenario: tiny_fanin, qos: [0], stages: {measure_s: 8}}]}\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "hosts: [{name: localhost, transport: local, roles: [driver], procs: 2}]\n"
        f"broker: {{kind: mosquitto, managed: false, address: 127.0.0.1, port: {broker.port}}}\n")
    killed: dict = {}
    killer = threading.Thread(target=_kill_when_measuring, args=(tiny_suite, "0", 3.0, killed))
    killer.start()
    lines: list[str] = []
    outcome = run_pipeline(load_settings(), suite="tiny0", inventory=inventory,
                           say=lines.append)
    killer.join()
    assert killed, "the driver was never seen measuring"

    died = "driver localhost/0 died (signal 9, SIGKILL)"
    assert outcome.status == "failed"
    run = Store(load_settings().database_url()).run(outcome.run_id)
    assert run["status"] == "failed" and run["excluded"]
    assert run["excluded_reason"] == f"run failed: tiny_fanin.q0.c100.r100: {died}"
    assert any(line.strip() == died for line in lines), lines
    (stage,) = Store(load_settings().database_url()).stages(outcome.run_id)
    assert stage["validity"] == "invalid" and stage["reason"].startswith(died)

    out: Path = killed["out"]
    recorded = json.loads((out.parent.parent / "drivers_failed.json").read_text())
    assert recorded["exit_codes"] == {"localhost/0": 137, "localhost/1": 0}
    assert not (out / "summary.json").exists() and (out.parent / "1" / "summary.json").exists()
    with open(out / "counters.csv") as handle:  # the seconds it measured before it died
        rows = list(csv.DictReader(handle))
    window = killed["window"]
    measured = [r for r in rows if window["measure_start"] <= int(r["second"]) < killed["at"]]
    assert len(measured) >= 1 and all(int(r["published"]) > 0 for r in measured), rows
    assert int(rows[-1]["second"]) >= int(killed["at"]) - 3  # flushed up to ~2 s before

    message = json.loads((Path(run["artifact_dir"]) / "slack_message.json").read_text())
    assert died in json.dumps(message["invalid"]), message


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
    from tasks.run_context import RunContext
    from tasks.settings import load_settings
    from tasks.steps import Call, execute
    from tasks.steps.plan import plan_run

    secrets = {"PERFPIPE_SLACK_TOKEN": "xoxb-not-for-children",
               "PERFPIPE_DB_URL": f"sqlite:///{tiny_suite}/results.db",
               "AIRFLOW_CONN_RESULTS": "postgresql://perf:hunter2@db/results"}
    for name, value in {**secrets, "PERFPIPE_TEST_MQTT_PASSWORD": "mqtt-pass"}.items():
        monkeypatch.setenv(name, value)
    scenarios = tiny_suite.parent / "scenarios"
    (scenarios / "catalog" / "tiny_login.yml").write_text(SECRET_SCENARIO)
    (scenarios / "suites.yml").write_text("suites: {login: [tiny_login]}\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [broker, driver], "
                         "procs: 1}]\nbroker: {kind: mosquitto, host: localhost, address: "
                         "localhost}\n")
    settings = load_settings()
    ctx = RunContext.load(settings, plan_run(settings, suite="login", inventory=inventory))
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


def test_the_broker_killed_mid_stage_fails_the_run_skips_the_rest_and_says_when(
        tmp_path: Path, tiny_suite: Path, spark_connect):
    """Fault: the managed Mosquitto is killed with SIGKILL 1 s into the first of two
    stages' windows."""
    from sql import Store
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [broker, driver], "
                         "procs: 1}]\nbroker: {kind: mosquitto, host: localhost, "
                         "address: 127.0.0.1}\n")
    killed: dict = {}

    def kill_broker() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            for stage_file in tiny_suite.glob("runs/*/raw/*/stage.json"):
                broker = json.loads((stage_file.parents[2] / "broker.json").read_text())
                window = json.loads(stage_file.read_text())["windows"]
                if time.time() >= window["measure_start"] + 1:
                    os.kill(broker["pid"], signal.SIGKILL)
                    killed.update(pid=broker["pid"], stage=stage_file.parent.name)
                    return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_broker)
    killer.start()
    lines: list[str] = []
    outcome = run_pipeline(load_settings(), suite="tiny", inventory=inventory, say=lines.append)
    killer.join()
    assert killed.get("stage") == "tiny_fanin.q0.c100.r100", killed

    store = Store(load_settings().database_url())
    run = store.run(outcome.run_id)
    assert outcome.status == "failed" and run["status"] == "failed"
    gone = f"the broker died (pid {killed['pid']} on localhost gone at "
    assert run["excluded_reason"].startswith(f"run failed: {killed['stage']}: {gone}")
    assert run["excluded_reason"].endswith("; 1 stages left skipped")
    assert any(line.startswith(gone) and line.endswith(": 1 stages left skipped")
               for line in lines), lines
    run_dir = Path(run["artifact_dir"])
    assert not (run_dir / "raw" / "tiny_fanin.q1.c100.r100").exists()  # never started
    (stage,) = store.stages(outcome.run_id)
    assert stage["validity"] == "invalid"
    assert stage["reason"].startswith(f"stopped early: {gone}"), stage["reason"]
    assert json.loads((run_dir / "broker.json").read_text())["stopped"]  # teardown ran
    message = json.loads((run_dir / "slack_message.json").read_text())
    assert gone in json.dumps(message["invalid"]), message

"""Shared fixtures: a real Mosquitto on a free loopback port, an isolated perfpipe state."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.ports import free_port, wait_listening

# the `alone` marker and its lock under make test's workers; pytester for tests/test_parallel
pytest_plugins = ["tests.parallel", "pytester"]

REPO = Path(__file__).resolve().parent.parent
# Airflow reads its config when first imported: point it at the tests' own Airflow home
# (migrated by `make test`; `make run` and the UI use .state/airflow) unless the caller
# chose another.
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".state" / "airflow-test"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[*]"}')
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
if str(Path(sys.executable).parent) not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def mosquitto_binary() -> str:
    for candidate in ("/usr/sbin/mosquitto", shutil.which("mosquitto")):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("mosquitto is not installed: run `make test`, which installs it")


class Broker:
    def __init__(self, workdir: Path, extra_conf: str = "") -> None:
        self.port = free_port()
        conf = workdir / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                        "persistence false\nmax_queued_messages 1000000\n"
                        "max_inflight_messages 0\nsys_interval 1\nlog_dest stderr\n" + extra_conf)
        self.log = open(workdir / "mosquitto.log", "w")
        self.process = subprocess.Popen([mosquitto_binary(), "-c", str(conf)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        if not wait_listening(self.port, 10):
            raise RuntimeError(f"mosquitto did not listen on {self.port}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self.log.close()


def planned_run(tmp_path: Path, inventory_yaml: str, suite: str):
    """A run planned (its RunContext) on an inventory written from `inventory_yaml`."""
    from tasks.run_context import RunContext
    from tasks.settings import load_settings
    from tasks.steps.plan import plan_run

    inventory = tmp_path / "inventory.yml"
    inventory.write_text(inventory_yaml)
    settings = load_settings()
    return RunContext.load(settings, plan_run(settings, suite=suite, inventory=inventory))


def unmanaged_run(tmp_path: Path, port: int, suite: str):
    """A planned run (its RunContext) on this machine as one driver host, against a broker
    already listening on `port` (managed: false), provisioned and past the broker step."""
    from tasks.steps import Call, execute

    ctx = planned_run(
        tmp_path, "hosts: [{name: localhost, transport: local, roles: [driver], procs: 1}]\n"
        f"broker: {{kind: mosquitto, managed: false, address: 127.0.0.1, port: {port}}}\n", suite)
    execute("provision", ctx, Call(host="localhost"))
    execute("broker", ctx)
    return ctx


@pytest.fixture
def broker(tmp_path: Path):
    running = Broker(tmp_path)
    yield running
    running.kill()


@pytest.fixture
def perfpipe_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private state dir (runs, SQLite results) so tests never see each other's runs."""
    state = tmp_path / "state"
    monkeypatch.setenv("PERFPIPE_STATE_DIR", str(state))
    for name in ("PERFPIPE_DB_URL", "PERFPIPE_SLACK_TOKEN", "PERFPIPE_INVENTORY",
                 "PERFPIPE_SCENARIOS_DIR", "PERFPIPE_SUITE"):
        monkeypatch.delenv(name, raising=False)
    return state


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory):
    """A Spark Connect server for the whole session, on a free loopback port: pipeline runs
    pointed at it (PERFPIPE_SPARK_MASTER=sc://...) run the real Spark job as its client and
    skip a JVM start each. spark-submit stays what the DAG tests and test_aggregate run."""
    import pyspark

    home = Path(pyspark.__file__).parent
    work = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_PID_DIR": str(work),
           "SPARK_LOG_DIR": str(work), "SPARK_IDENT_STRING": f"perfpipe-test-{port}"}
    subprocess.run([str(home / "sbin" / "start-connect-server.sh"), "--master", "local[2]",
                    "--conf", "spark.ui.enabled=false", "--conf",
                    "spark.connect.grpc.binding.address=127.0.0.1",
                    "--conf", f"spark.connect.grpc.binding.port={port}"],
                   env=env, check=True, capture_output=True, timeout=60)
    try:
        if not wait_listening(port, 90, poll_s=0.25):
            pytest.fail(f"Spark Connect did not listen on {port}: see {work}")
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run([str(home / "sbin" / "stop-connect-server.sh")], env=env,
                       capture_output=True, timeout=60)


@pytest.fixture
def spark_connect(spark_connect_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """This test's pipeline runs aggregate on the session's Spark Connect server."""
    monkeypatch.setenv("PERFPIPE_SPARK_MASTER", spark_connect_server)
    return spark_connect_server


@pytest.fixture
def slack():
    """A local server speaking the Slack Web API (tests/slack_server.py), for one test."""
    from tests import slack_server

    server = slack_server.start()
    yield server
    slack_server.stop(server)


@pytest.fixture(scope="session")
def lab():
    """Three SSH hosts in network namespaces (infra/lab): broker1, driver1, driver2."""
    from tests import lab as lab_module

    was_up = lab_module.lab_is_up()
    info = lab_module.up()
    yield info
    if not was_up:
        lab_module.down()


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

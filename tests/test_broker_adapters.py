"""Broker adapters: the registry, rendered configs and error messages (pure), and the
unmanaged path of the configuration-only adapters against a real broker.

IBM MQ, EMQX and TBMQ cannot run on this machine, so the real tests use a local Mosquitto
(the `broker` fixture) as a stand-in for the already running remote broker: what they
check is what perfpipe does with an unmanaged broker of those kinds (a real MQTT CONNECT,
a version probe, never a start or stop), not those brokers' own behaviour.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
import yaml

from tasks.brokers import ADAPTERS, BrokerError, qmini
from tasks.brokers.emqx import IMAGE as EMQX_IMAGE
from tasks.brokers.emqx import Emqx, parse_status
from tasks.brokers.ibmmq import IbmMq, check_settings, mqtt_channel_mqsc, report_stanzas
from tasks.brokers.rabbitmq import node_env, parse_version, render_config, server_env
from tasks.brokers.render import main as render_main
from tasks.brokers.tbmq import IMAGE as TBMQ_IMAGE
from tasks.brokers.tbmq import Tbmq
from tasks.catalog.inventory import BrokerConfig, Inventory

REPO = Path(__file__).resolve().parent.parent
CONFIG_ONLY = {"ibmmq": "IBM MQ", "emqx": "EMQX", "tbmq": "TBMQ"}


# ---- registry and inventory -------------------------------------------------------------

def test_every_inventory_kind_has_an_adapter_and_back():
    kinds = set(get_args(BrokerConfig.model_fields["kind"].annotation))
    assert kinds == set(ADAPTERS) == {"mosquitto", "activemq", "rabbitmq", "ibmmq", "emqx", "tbmq"}
    assert all(ADAPTERS[k].kind == k for k in kinds)


@pytest.mark.parametrize("name", ["rabbitmq-local", "ibmmq", "emqx-compose", "tbmq"])
def test_example_inventories_load(name):
    from tasks.catalog.inventory import load_inventory

    inventory = load_inventory(REPO / "infra" / "inventories" / f"{name}.yml")
    assert inventory.broker.managed == (inventory.broker.kind == "rabbitmq")


def test_unknown_kind_is_refused_by_the_inventory():
    with pytest.raises(ValueError, match="rabbitmq"):
        Inventory.model_validate({"hosts": [{"name": "h", "roles": ["broker", "driver"]}],
                                  "broker": {"kind": "hivemq", "host": "h"}})


# ---- RabbitMQ (pure parts; the real start is tests/test_rabbitmq.py) ---------------------

def test_rabbitmq_config_binds_mqtt_to_the_run_and_amqp_to_loopback():
    text = render_config("10.250.77.11", 41883, 45672, 45692)
    lines = set(text.splitlines())
    assert "mqtt.listeners.tcp.default = 10.250.77.11:41883" in lines
    assert "listeners.tcp.default = 127.0.0.1:45672" in lines
    assert {"mqtt.allow_anonymous = true", "loopback_users.guest = false",
            "log.file.level = warning"} <= lines
    assert {"prometheus.tcp.ip = 10.250.77.11", "prometheus.tcp.port = 45692"} <= lines


def test_rabbitmq_node_is_private_to_the_run_folder():
    base = "/runs/r1/broker"
    env = server_env(base, "perfpipe-41883@localhost", {"amqp": 1, "dist": 2, "epmd": 3, "mqtt": 4})
    assert env["HOME"] == base and env["ERL_EPMD_PORT"] == "3"
    assert env["RABBITMQ_NODE_PORT"] == "1" and env["RABBITMQ_DIST_PORT"] == "2"
    paths = [v for k, v in env.items() if k.endswith(("_FILE", "_BASE"))]
    assert paths and all(p.startswith(base) for p in paths)  # never /etc/rabbitmq or /var/lib
    assert "-start_epmd false" in env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert set(node_env(base, "n@localhost", 3)) < set(env)  # rabbitmqctl finds the same node


def test_rabbitmq_version_from_the_package_folder():
    assert parse_version("rabbitmq_server-3.10.8\n") == "3.10.8"
    assert parse_version("") is None


# ---- IBM MQ ------------------------------------------------------------------------------

def test_ibmmq_renders_channel_mqsc_qmini_heap_and_setup():
    files = IbmMq().render(qmgr="QM1", channel="BENCH.MQTT", port=1884, mcauser="mqttusr",
                           xms="2048M", xmx="4096M")
    assert set(files) == {"setup.sh", "perfpipe-mqtt.mqsc", "qm.ini.fragment", "mqxr-heap.mqsc"}
    mqsc = files["perfpipe-mqtt.mqsc"]
    assert "START SERVICE(SYSTEM.MQXR.SERVICE)" in mqsc
    assert ("DEFINE CHANNEL('BENCH.MQTT') CHLTYPE(MQTT) TRPTYPE(TCP) PORT(1884) +\n"
            "       PROTOCOL(MQTTV311,MQTTV3) BACKLOG(4096) MCAUSER('mqttusr') REPLACE") in mqsc
    assert "START CHANNEL('BENCH.MQTT') CHLTYPE(MQTT)" in mqsc
    _, stanzas = report_stanzas()
    assert qmini.read_values(files["qm.ini.fragment"]) == stanzas  # the report's, one copy
    assert "/var/mqm/qmgrs/QM1/qm.ini" in files["qm.ini.fragment"]
    assert ('ALTER SERVICE(SYSTEM.MQXR.SERVICE) STARTARG(\'<current STARTARG> -J "-Xms2048M" '
            '-J "-Xmx4096M"\')') in files["mqxr-heap.mqsc"]
    setup = files["setup.sh"]
    assert "crtmqm QM1" in setup and "strmqm QM1" in setup and "runmqsc QM1 < perfpipe-mqtt.mqsc" in setup
    assert "perfpipe does not run this" in setup


def test_ibmmq_setup_stops_before_a_heap_change_that_would_break_mqxr(tmp_path):
    """The rendered setup.sh ran mqxr-heap.mqsc as rendered: its ALTER SERVICE set STARTARG
    to the placeholder plus the heap, dropping MQXR's own -m/-d/-g arguments, so the MQTT
    service could not start again. It stops there now until the file holds the service's
    STARTARG. IBM MQ cannot run here: its commands are stand-ins that log their calls."""
    import subprocess

    files = IbmMq().render(qmgr="QM1")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("dspmq", "crtmqm", "strmqm", "runmqsc"):
        (bin_dir / command).write_text(f'#!/bin/sh\necho "{command} $*" >> {tmp_path}/calls\n'
                                       "cat > /dev/null\n")
        (bin_dir / command).chmod(0o755)

    def setup() -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "setup.sh"], cwd=tmp_path, capture_output=True, text=True,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin"})

    done = setup()
    assert done.returncode == 1 and "mqxr-heap.mqsc: replace <current STARTARG>" in done.stderr
    assert (tmp_path / "calls").read_text().count("runmqsc QM1") == 2  # the service check, the channel
    (tmp_path / "mqxr-heap.mqsc").write_text(files["mqxr-heap.mqsc"].replace(
        "<current STARTARG>", "-m QM1 -d /var/mqm/qmgrs/QM1/mqxr -g /var/mqm"))
    (tmp_path / "calls").unlink()
    assert setup().returncode == 0
    assert (tmp_path / "calls").read_text().count("runmqsc QM1") == 3  # and the heap


def test_ibmmq_without_mcauser_says_so():
    assert "MCAUSER is left empty" in mqtt_channel_mqsc("QM1", "C", 1883)


@pytest.mark.parametrize("kwargs, message", [
    ({"qmgr": "bad name"}, "queue manager 'bad name'"),
    ({"channel": "A" * 21}, "at most 20 long"),
    ({"port": 70000}, "port 70000"),
    ({"mcauser": "averyverylonguser"}, "at most 12"),
    ({"xmx": "4GB"}, "xmx '4GB'"),
])
def test_ibmmq_settings_are_checked_with_the_field_named(kwargs, message):
    settings = {"qmgr": "QM1", "channel": "C", "port": 1883, "mcauser": None,
                "xms": "1G", "xmx": "1G", **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        check_settings(**settings)


# ---- EMQX and TBMQ -----------------------------------------------------------------------

def test_emqx_image_and_settings_are_the_ones_docker_compose_runs():
    """The compose emqx service (the emqx-compose inventory's broker) ran the image's
    defaults: 1000 queued messages before it drops, slow subscribers shut down, no VM
    collectors (no broker CPU or memory)."""
    from tasks.brokers.emqx import environment

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["services"]["emqx"]["image"] == EMQX_IMAGE
    assert compose["services"]["emqx"]["environment"] == environment()


def test_emqx_renders_benchmark_settings_as_image_environment():
    files = Emqx().render(port=1884)
    service = yaml.safe_load(files["docker-compose.emqx.yml"])["services"]["emqx"]
    assert service["image"] == EMQX_IMAGE and "1884:1884" in service["ports"]
    env = service["environment"]
    assert env["EMQX_LISTENERS__TCP__DEFAULT__BIND"] == "0.0.0.0:1884"
    assert env["EMQX_MQTT__MAX_MQUEUE_LEN"] == "1000000"
    assert env["EMQX_FORCE_SHUTDOWN__ENABLE"] == "false"
    assert env["EMQX_SYS_TOPICS__SYS_MSG_INTERVAL"] == "1s"
    assert files["emqx.env"].splitlines() == [f"{k}={v}" for k, v in env.items()]
    assert files["docker-run.sh"].strip().endswith(EMQX_IMAGE)


def test_emqx_status_json_gives_the_version():
    assert parse_status({"rel_vsn": "v5.8.6", "app_status": "running"}) == "5.8.6"
    assert parse_status({"rel_vsn": "v5.8.6", "app_status": "not_running"}) is None
    assert parse_status(None) is None


def test_tbmq_renders_a_pinned_single_node_compose():
    files = Tbmq().render(port=1885, heap="1024M")
    services = yaml.safe_load(files["docker-compose.tbmq.yml"])["services"]
    assert set(services) == {"postgres", "kafka", "redis", "tbmq"}
    tbmq = services["tbmq"]
    assert tbmq["image"] == TBMQ_IMAGE == "thingsboard/tbmq:1.4.0"
    assert tbmq["environment"]["LISTENER_TCP_BIND_PORT"] == "1885"
    assert tbmq["environment"]["SECURITY_MQTT_BASIC_ENABLED"] == "false"
    assert "-Xmx1024M" in tbmq["environment"]["JAVA_OPTS"]
    assert all(re.search(r":\d", s["image"]) for s in services.values())  # every image pinned


@pytest.mark.parametrize("kind", sorted(CONFIG_ONLY))
def test_managed_config_only_broker_fails_naming_the_field_and_the_fix(kind):
    with pytest.raises(BrokerError) as raised:
        ADAPTERS[kind](None).start("/runs/r1", "127.0.0.1", 1883)
    message = str(raised.value)
    assert message.startswith(f"broker.managed: {CONFIG_ONLY[kind]} cannot be started by perfpipe")
    assert "set managed: false" in message and f"tasks.brokers.render {kind}" in message
    with pytest.raises(BrokerError, match="never started by perfpipe"):
        ADAPTERS[kind](None).stop(1234)


def test_emqx_managed_error_names_the_image_and_compose():
    assert ("broker.managed: EMQX cannot be started by perfpipe on a host; run the "
            "emqx/emqx:5.8.6 image (docker-compose.yml's emqx service") in Emqx.managed_error()


def test_render_command_prints_writes_and_refuses_bad_values(tmp_path, capsys):
    assert render_main(["emqx", "--port", "1884"]) == 0
    assert "EMQX_LISTENERS__TCP__DEFAULT__BIND=0.0.0.0:1884" in capsys.readouterr().out
    assert render_main(["ibmmq", "--qmgr", "QM1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "perfpipe-mqtt.mqsc").read_text().count("QM1") >= 1
    assert render_main(["ibmmq", "--channel", "X" * 21]) == 2
    assert "at most 20 long" in capsys.readouterr().err


# ---- the unmanaged path, for real (Mosquitto stands in for the remote broker) -------------

def mosquitto_version() -> str:
    from tasks.brokers.mosquitto import Mosquitto
    from tasks.hosts import LocalHost

    return Mosquitto(LocalHost()).version()


@pytest.mark.parametrize("kind", sorted(CONFIG_ONLY))
def test_unmanaged_config_only_adapter_checks_a_running_broker_and_leaves_it(kind, broker):
    """A stand-in: IBM MQ, EMQX and TBMQ cannot run here, so the local Mosquitto plays the
    already running remote broker. The adapter connects for real and never starts or
    stops anything."""
    from tasks.hosts import LocalHost

    adapter = ADAPTERS[kind](LocalHost())
    assert 0 < adapter.health("127.0.0.1", broker.port) < 5
    version = adapter.probe_version("127.0.0.1", broker.port)
    # MQXR and TBMQ announce no version over MQTT; EMQX (no status API here) reads its own
    # $SYS topic, which Mosquitto does not publish: Mosquitto's version would pass it for EMQX
    assert mosquitto_version() != "unknown"
    assert version == "unknown"
    assert adapter.version() == "unknown"  # no dspmqver / EMQX dashboard on this host
    with pytest.raises(BrokerError, match="broker.managed"):
        adapter.start("/tmp/never", "127.0.0.1", broker.port)
    assert broker.process.poll() is None


def test_unmanaged_broker_that_does_not_answer_is_reported():
    from tasks.ports import free_port

    with pytest.raises(BrokerError, match="did not accept an MQTT CONNECT"):
        Emqx().health("127.0.0.1", free_port(), timeout_s=1)


def test_broker_step_with_unmanaged_emqx_health_checks_and_leaves_it_running(tiny_suite, broker,
                                                                             tmp_path):
    """The real broker step (tasks/steps/broker.py) with kind emqx, managed: false, Mosquitto as
    the stand-in; and managed: true fails there with the fix."""
    from tasks.run_context import RunContext
    from tasks.settings import load_settings
    from tasks.steps import execute
    from tasks.steps.broker import stop_broker
    from tasks.steps.plan import plan_run

    def start_broker(ctx: RunContext) -> dict:
        return execute("broker", ctx)

    settings = load_settings()
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "hosts: [{name: localhost, transport: local, roles: [broker, driver], procs: 1}]\n"
        f"broker: {{kind: emqx, host: localhost, managed: false, address: 127.0.0.1, "
        f"port: {broker.port}}}\n")
    ctx = RunContext.load(settings, plan_run(settings, suite="tiny", inventory=inventory))
    state = start_broker(ctx)
    assert state["port"] == broker.port
    assert ctx.broker()["connect_s"] < 5 and ctx.broker()["pid"] is None
    assert stop_broker(ctx) == "broker not managed by perfpipe: left running"
    assert broker.process.poll() is None

    # no broker host: the version is what the adapter's probe gets over the network
    # (EMQX's status page is not there, and its $SYS topic neither: the stand-in is no EMQX)
    inventory.write_text(inventory.read_text().replace("host: localhost, ", ""))
    ctx = RunContext.load(settings, plan_run(settings, suite="tiny", inventory=inventory))
    assert start_broker(ctx)["version"] == "unknown"

    inventory.write_text(inventory.read_text().replace("kind: emqx, ", "kind: emqx, host: localhost, "))
    inventory.write_text(inventory.read_text().replace("managed: false", "managed: true"))
    ctx = RunContext.load(settings, plan_run(settings, suite="tiny", inventory=inventory))
    with pytest.raises(BrokerError, match=re.escape("broker.managed: EMQX cannot be started")):
        start_broker(ctx)
    assert stop_broker(ctx) == "no broker was started"

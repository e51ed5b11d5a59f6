"""Mosquitto's TLS listener with a generated CA, and the sampler's $SYS samples, on this
machine (the lab test tests/test_lab_nightly_suite.py runs both over SSH)."""

from __future__ import annotations

import csv
import os
import pwd
import shutil
import ssl
import stat
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import paho.mqtt.client as mqtt
import pytest

from tasks.brokers import BrokerError
from tasks.brokers.health import health_check
from tasks.brokers.mosquitto import Mosquitto
from tasks.brokers.tls import GENERATED_CA, make_certificates
from tasks.driver import broker_stats, sampler
from tasks.driver.output import SAMPLER_COLUMNS, SAMPLER_FILE
from tasks.driver.paho_glue import stop_client
from tasks.hosts import LocalHost
from tasks.brokers.tls import tls_listener
from tasks.ports import free_port
from tests.conftest import Broker


@pytest.fixture(params=["traversable", "private"])
def run_dir(request, tmp_path):
    """A run directory Mosquitto's own user can reach (as under /var/tmp/perfpipe on a
    broker host), or one under a 0700 directory (pytest's tmp_path, when run as root)."""
    if request.param == "private":
        yield tmp_path / "run"
        return
    base = Path(tempfile.mkdtemp(prefix="perfpipe-tls-test-", dir="/var/tmp"))
    base.chmod(0o755)
    yield base / "run"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tls_broker(run_dir, tmp_path):
    host = LocalHost(work_root=str(run_dir))
    adapter = Mosquitto(host)
    port, tls_port = free_port(), free_port()
    state = adapter.start(str(run_dir), "127.0.0.1", port, tls_port=tls_port,
                          tls_names=["127.0.0.1", "localhost"], local_dir=tmp_path / "local")
    yield SimpleNamespace(state=state, port=port, tls_port=tls_port, run_dir=run_dir,
                          local=tmp_path / "local", private=run_dir.parent == tmp_path)
    adapter.stop(state["group_pid"])


def test_tls_listener_with_a_generated_ca_and_a_private_key(tls_broker):
    state = tls_broker.state
    key = Path(state["tls"]["key_file"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    if os.geteuid() == 0:  # Mosquitto reads its key after dropping root to its own user
        assert state["tls"].get("runs_as") == ("root" if tls_broker.private else None)
        owner = "root" if tls_broker.private else "mosquitto"
        assert key.stat().st_uid == pwd.getpwnam(owner).pw_uid
    assert not (tls_broker.local / "server.key").exists()  # the key only on the broker host
    assert not list(tls_broker.local.glob("*key*"))  # and the CA key nowhere
    config = Path(state["config"]).read_text()
    assert "sys_interval 1" in config
    assert f"listener {tls_broker.tls_port} 127.0.0.1" in config
    # a verified TLS CONNECT (host name checked) on the TLS port, plain on the plain port
    assert health_check("127.0.0.1", tls_broker.tls_port, ca_file=state["tls"]["local_ca_file"]) > 0
    assert health_check("127.0.0.1", tls_broker.port) > 0
    # without the generated CA the certificate is not trusted
    other = make_certificates(tls_broker.local / "other", ["127.0.0.1"])
    with pytest.raises(BrokerError, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
        health_check("127.0.0.1", tls_broker.tls_port, timeout_s=1, ca_file=str(other["ca"]))


@pytest.mark.parametrize("run_dir", ["private"], indirect=True)
def test_extra_config_applies_to_the_plain_listener_with_a_tls_one_too(run_dir, tmp_path):
    """broker.extra_config's listener options (max_qos here) apply to the plain listener
    the rated stages use, TLS listener or not: written after the TLS listener, they were
    its, and the plain one kept Mosquitto's defaults on a suite with TLS stages."""
    adapter = Mosquitto(LocalHost(work_root=str(run_dir)))
    port, tls_port = free_port(), free_port()
    state = adapter.start(str(run_dir), "127.0.0.1", port, tls_port=tls_port,
                          tls_names=["127.0.0.1"], local_dir=tmp_path / "local",
                          extra_config=["max_qos 0"])
    granted: list[int] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="asks-qos-1")
    client.on_subscribe = lambda c, u, mid, codes, props: granted.extend(
        int(code.value) for code in codes)
    client.on_connect = lambda c, u, flags, reason, props: c.subscribe("a", qos=1)
    try:
        client.connect("127.0.0.1", port)
        client.loop_start()
        deadline = time.monotonic() + 5
        while not granted and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop_client(client)
        adapter.stop(state["group_pid"])
    assert granted == [0]  # the plain listener's max_qos: 1 asked, 0 granted


@pytest.mark.parametrize("run_dir", ["traversable"], indirect=True)
def test_the_sampler_records_sys_next_to_cpu_and_rss(tls_broker, tmp_path):
    out = tmp_path / "sampler"
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sys-test-pub")
    publisher.tls_set(ca_certs=tls_broker.state["tls"]["local_ca_file"],
                      cert_reqs=ssl.CERT_REQUIRED)
    publisher.connect("127.0.0.1", tls_broker.tls_port)
    publisher.loop_start()
    for _ in range(20):
        publisher.publish("perfpipe/test/sys", b"x" * 40, qos=1)
    until = time.time() + 3.5
    assert sampler.main(["--pid", str(tls_broker.state["pid"]), "--until", str(until),
                         "--out", str(out)]) == 0
    publisher.loop_stop()
    publisher.disconnect()
    with open(out / SAMPLER_FILE) as handle:
        rows = list(csv.reader(handle))
    assert tuple(rows[0]) == SAMPLER_COLUMNS  # the Spark contract, unchanged
    with open(out / broker_stats.SYS_FILE) as handle:
        sys_rows = list(csv.DictReader(handle))
    assert tuple(sys_rows[0]) == broker_stats.SYS_COLUMNS
    assert [r["second"] for r in sys_rows] == [r[0] for r in rows[1:]]  # the same seconds
    last = sys_rows[-1]
    assert int(last["clients_connected"]) >= 2  # the publisher and the sampler itself
    assert int(last["pub_received"]) >= 20
    assert int(last["store_messages"]) >= int(last["retained_messages"]) > 0
    assert int(last["queued_messages"]) >= 0 and int(last["heap_current"]) > 0


def _client(port: int, name: str, topic: str, on_message=None) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name)
    client.on_connect = lambda c, *_: c.subscribe(topic, qos=0)
    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


class SysWatcher:
    """A client that keeps the time of every $SYS update and every connection count."""

    def __init__(self, port: int) -> None:
        self.updates: list[float] = []
        self.connected: list[str] = []
        self.client = _client(port, "watcher", "$SYS/broker/#", self._on_message)

    def _on_message(self, client, userdata, message) -> None:
        if message.retain:
            return
        if message.topic == broker_stats.UPTIME_TOPIC:
            self.updates.append(time.monotonic())
        elif message.topic == broker_stats.SYS_TOPICS["clients_connected"]:
            self.connected.append(message.payload.decode())

    def wait_updates(self, count: int, done=lambda: False) -> None:
        goal = len(self.updates) + count
        deadline = time.monotonic() + 4 * count + 4
        while len(self.updates) < goal and not done():
            assert time.monotonic() < deadline, "no $SYS update from the broker"
            time.sleep(0.005)


COUNTS = ("clients_connected", "clients_total", "subscriptions")


def counts(listener: broker_stats.SysListener) -> dict[str, str | None]:
    values = listener.snapshot()
    return {c: values.get(broker_stats.SYS_TOPICS[c]) for c in COUNTS}


def test_the_sys_listener_learns_counts_that_did_not_change_when_it_came(tmp_path):
    """The counts a listener could not learn (`broker_stats.SysListener`): a broker that
    retains nothing, and a client leaving as the listener comes, between two updates. It
    must learn them, and leave them as it found them."""
    broker = Broker(tmp_path, "retain_available false\n")
    watcher = SysWatcher(broker.port)
    leaver = _client(broker.port, "leaver", "$SYS/broker/version")
    listener = None
    try:
        watcher.wait_updates(2)  # both clients and their subscriptions counted and published
        watcher.wait_updates(1)  # just after an update: the next one sees only the swap
        leaver.disconnect()
        listener = broker_stats.SysListener("127.0.0.1", broker.port)
        # the helper seen by two updates, then gone by the next: 3 or 4 updates, and more
        # than enough to fail without it
        watcher.wait_updates(6, lambda: set(counts(listener).values()) == {"2"})
        # the watcher and the listener (the leaver gone, and the listener's helper gone too)
        assert counts(listener) == dict.fromkeys(COUNTS, "2")
        assert "3" in watcher.connected  # the helper came and went
    finally:
        if listener is not None:
            listener.close()
        for client in (watcher.client, leaver):
            stop_client(client)
        broker.kill()


def test_the_sys_listener_opens_no_helper_when_the_counts_are_retained(tmp_path):
    broker = Broker(tmp_path)
    watcher = SysWatcher(broker.port)
    listener = None
    try:
        # the watcher counted and published, retained; the second update, since the uptime
        # leads each one and the count of the first may not be read when it comes
        watcher.wait_updates(2)
        seen = len(watcher.connected)
        listener = broker_stats.SysListener("127.0.0.1", broker.port)
        watcher.wait_updates(3)  # a helper would be counted by the first two
        assert watcher.connected[seen:] == ["2"]  # the listener came, and nothing else
        assert counts(listener) == dict.fromkeys(COUNTS, "2")
    finally:
        if listener is not None:
            listener.close()
        stop_client(watcher.client)
        broker.kill()


def test_the_sampler_finds_the_plain_listener_in_the_broker_config():
    config = ("user mosquitto\nlistener 8883 10.0.0.1\ncafile /x/ca.pem\ncertfile /x/s.pem\n"
              "keyfile /x/s.key\nlistener 1883 10.0.0.1\nallow_anonymous true\n"
              "listener 9001\nprotocol websockets\n")
    assert broker_stats.plain_listener(config) == ("10.0.0.1", 1883)
    assert broker_stats.plain_listener("listener 1884\n") == ("127.0.0.1", 1884)
    assert broker_stats.plain_listener("port 1885\n") == ("127.0.0.1", 1885)
    assert broker_stats.plain_listener("listener 8883\ncertfile /s.pem\n") is None


def test_sys_rows_derive_rates_from_updates_and_backlog():
    def values(uptime: int, received: int, store: int) -> dict:
        return {"$SYS/broker/uptime": f"{uptime} seconds",
                "$SYS/broker/publish/messages/received": str(received),
                "$SYS/broker/store/messages/count": str(store),
                "$SYS/broker/retained messages/count": "52"}

    rows = [broker_stats.sys_row(10, values(100, 100, 60), None)]
    # Mosquitto updates $SYS every other second with sys_interval 1
    for second, (uptime, received, store) in enumerate(
            [(100, 100, 60), (102, 600, 52), (102, 600, 52), (104, 1100, 53)], start=11):
        rows.append(broker_stats.sys_row(second, values(uptime, received, store), rows[-1]))
    assert [r["pub_received_per_s"] for r in rows] == [None, None, 250, 250, 250]
    assert [r["queued_messages"] for r in rows] == [8, 8, 0, 0, 1]
    assert rows[-1]["broker_uptime_s"] == 104
    assert rows[-1]["heap_current"] is None  # never published: an empty cell


def stage(stage_id: str, tls: dict | None) -> SimpleNamespace:
    return SimpleNamespace(stage_id=stage_id, connection={"tls": tls} if tls else {})


def test_the_tls_listener_follows_the_planned_scenarios():
    ca = f"/var/tmp/perfpipe/tls/{GENERATED_CA}"
    plain = stage("a", None)
    assert tls_listener([plain], "mosquitto") is None
    wanted = tls_listener([plain, stage("b", {"port": 8883, "ca_file": ca}),
                           stage("c", {"port": 8883, "ca_file": "/etc/x.pem"})], "mosquitto")
    assert wanted == {"port": 8883, "ca_files": [ca]}  # only the generated CA's path is written
    with pytest.raises(BrokerError, match="needs port"):
        tls_listener([stage("d", {"ca_file": ca})], "mosquitto")
    with pytest.raises(BrokerError, match="same port"):
        tls_listener([stage("e", {"port": 8883}), stage("f", {"port": 8884})], "mosquitto")



def test_a_tls_block_a_managed_broker_cannot_serve_is_refused_when_the_run_is_planned(
        tiny_suite, tmp_path):
    """No port (or two), or a managed broker perfpipe cannot give a TLS listener: refused
    by a run's plan (`check_plan`), before anything touches a host; it was found at the
    broker step, after provision and tune."""
    from tasks.config_files import ConfigError
    from tasks.settings import load_settings
    from tasks.steps.plan import check_plan

    scenarios = tiny_suite.parent / "scenarios"
    (scenarios / "catalog" / "tiny_tls.yml").write_text(
        (scenarios / "catalog" / "tiny_fanin.yml").read_text().replace(
            "name: tiny_fanin", "name: tiny_tls") + "connection: {tls: {ca_file: /x/ca.pem}}\n")
    (scenarios / "suites.yml").write_text("suites: {tls: [tiny_tls]}\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [broker, driver]}]\n"
                         "broker: {kind: mosquitto, host: localhost}\n")
    with pytest.raises(ConfigError, match=r"suite 'tls': stage tiny_tls\.q0\.c100\.r100: "
                                          "connection.tls needs port"):
        check_plan(load_settings(), "tls", inventory)
    (scenarios / "catalog" / "tiny_tls.yml").write_text(
        (scenarios / "catalog" / "tiny_tls.yml").read_text().replace(
            "{tls: {ca_file: /x/ca.pem}}", "{tls: {ca_file: /x/ca.pem, port: 8883}}"))
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [broker, driver]}]\n"
                         "broker: {kind: rabbitmq, host: localhost}\n")
    with pytest.raises(ConfigError, match="suite 'tls': rabbitmq: perfpipe cannot give it a "
                                          "TLS listener"):
        check_plan(load_settings(), "tls", inventory)
    # a broker perfpipe does not start takes the inventory's port: nothing to refuse
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
                         "broker: {kind: mosquitto, managed: false, address: 127.0.0.1, "
                         "port: 8883}\n")
    check_plan(load_settings(), "tls", inventory)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from tasks.catalog.placement import (
    driver_slots,
    expected_delivery_rate,
    place,
    process_spec,
    receivers,
)
from tasks.catalog.scenarios import Scenario, load_suite
from tasks.catalog.stages import expand
from tasks.config_files import ConfigError

REPO = Path(__file__).resolve().parent.parent


def scenario(**overrides) -> Scenario:
    doc = {
        "name": "fan", "qos": [0, 1],
        "publishers": [{"group": "pub", "count": 10, "topic": "t/{group}/{i}", "rate_per_client": 5}],
        "subscribers": [{"group": "sub", "count": 2, "topics": ["t/pub/#"]}],
        "stages": {"clients_pct": [50, 100], "measure_s": 5},
    }
    doc.update(overrides)
    return Scenario.model_validate(doc)


def test_expansion_steps_qos_then_clients_upwards():
    stages = expand(scenario())
    assert [(s.qos, s.clients_pct, s.publishers) for s in stages] == [
        (0, 50, 5), (0, 100, 10), (1, 50, 5), (1, 100, 10)]
    assert stages[1].target_publish_rate == 50.0
    assert len({s.stage_id for s in stages}) == 4


def test_rate_steps_scale_the_per_client_rate():
    stages = expand(scenario(qos=[0], stages={"clients_pct": [100], "rate_pct": [50, 100]}))
    assert [s.target_publish_rate for s in stages] == [25.0, 50.0]


def test_placement_is_within_one_client_of_even_across_hosts_and_processes():
    stage = expand(scenario(publishers=[{"group": "pub", "count": 101, "topic": "t/x",
                                         "rate_per_client": 1}]))[1]
    plans = place(stage, driver_slots([("a", 2), ("b", 2)]))
    per_proc = [len(p.publishers) + len(p.subscribers) for p in plans]
    assert max(per_proc) - min(per_proc) <= 1
    per_host = {h: sum(n for p, n in zip(plans, per_proc) if p.host == h) for h in "ab"}
    assert abs(per_host["a"] - per_host["b"]) <= 1
    ids = [c["client_id"] for p in plans for c in p.publishers + p.subscribers]
    assert len(ids) == len(set(ids)) == 103


def test_receivers_follow_mqtt_topic_matching():
    stage = expand(scenario())[0]
    plans = place(stage, driver_slots([("a", 1)]))
    assert set(receivers(plans).values()) == {2}  # both subscribers' t/pub/# match t/pub/<i>
    assert expected_delivery_rate(plans) == stage.target_publish_rate * 2


def test_bad_scenario_errors_name_the_file_and_field(tmp_path):
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "bad.yml").write_text(
        "name: bad\npublishers:\n  - {group: pub, count: 0, topic: 'a/#', rate_per_client: 1}\n")
    (tmp_path / "suites.yml").write_text("suites: {s: [bad]}\n")
    with pytest.raises(ConfigError) as error:
        load_suite(tmp_path, "s")
    message = str(error.value)
    assert "bad.yml: publishers.0.count" in message
    assert "publishers.0.topic" in message and "+ or #" in message


def test_unknown_suite_lists_the_known_ones():
    with pytest.raises(ConfigError, match="known: .*smoke"):
        load_suite(REPO / "scenarios", "no-such-suite")


def test_shipped_catalog_loads():
    assert [s.name for s in load_suite(REPO / "scenarios", "smoke")]


# ---- connection settings: scenario YAML -> stage -> process spec -> driver -------------
CONNECTED = """
name: secured
qos: [0, 1]
connection:
  tls: {ca_file: /etc/perfpipe/ca.crt, cert_file: /etc/perfpipe/client.crt,
        key_file: /etc/perfpipe/client.key, version: TLSv1.2, ciphers: AES256-GCM-SHA384,
        port: 8883}
  username: perf
  password_env: PERFPIPE_TEST_MQTT_PASSWORD
  clean_session: false
  keepalive_s: 300
  connect_rate: 900
  max_pending_connects: 32
  max_inflight: 20
  tick_us: 2000
  read_hold_us: 500
publishers:
  - {group: pub, count: 6, topic: "s/{group}/{i}", aggregate_rate: {0: 60, 1: 30}}
subscribers:
  - {group: app, count: 2, topics: ["s/pub/#"], share_group: apps, clean_session: true}
  - {group: mon, count: 1, topics: ["s/pub/+"]}
stages: {clients_pct: [50, 100], measure_s: 5}
"""


def write_catalog(tmp_path: Path, text: str, suite: str = "s") -> Path:
    catalog = tmp_path / "catalog"
    catalog.mkdir(exist_ok=True)
    name = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                if line.startswith("name:"))
    (catalog / f"{name}.yml").write_text(text)
    (tmp_path / "suites.yml").write_text(f"suites: {{{suite}: [{name}]}}\n")
    return tmp_path


def test_connection_settings_flow_from_yaml_to_the_driver_spec(tmp_path, monkeypatch):
    from tasks.driver.spec import parse_spec

    (scenario_,) = load_suite(write_catalog(tmp_path, CONNECTED), "s")
    stages = expand(scenario_)
    q1 = next(s for s in stages if s.qos == 1 and s.clients_pct == 100)
    assert q1.target_publish_rate == pytest.approx(30.0)  # aggregate, per QoS
    assert {g.rate_per_client for g in q1.groups if g.role == "pub"} == {5.0}
    half = next(s for s in stages if s.qos == 1 and s.clients_pct == 50)
    assert half.publishers == 3 and half.target_publish_rate == pytest.approx(30.0)
    plans = place(q1, driver_slots([("a", 2), ("b", 1)]))
    assert {p.processes for p in plans} == {3}
    monkeypatch.setenv("PERFPIPE_TEST_MQTT_PASSWORD", "s3cret")
    broker = {"host": "10.0.0.1", "port": 1883}
    docs = [process_spec(q1, p, run_id="r", broker=broker) for p in plans]
    assert "s3cret" not in json.dumps(docs)  # only the reference is written
    doc = docs[0]
    assert doc["broker"] == {
        "host": "10.0.0.1", "port": 8883, "tls": True, "ca_file": "/etc/perfpipe/ca.crt",
        "cert_file": "/etc/perfpipe/client.crt", "key_file": "/etc/perfpipe/client.key",
        "ciphers": "AES256-GCM-SHA384", "tls_version": "TLSv1.2", "username": "perf",
        "password_env": "PERFPIPE_TEST_MQTT_PASSWORD"}
    assert doc["connect_rate"] == pytest.approx(300.0)  # 900/s over 3 processes
    assert (doc["clean_session"], doc["keepalive_s"], doc["max_inflight"],
            doc["max_pending_connects"], doc["tick_us"], doc["read_hold_us"]
            ) == (False, 300, 20, 32, 2000, 500)
    specs = [parse_spec(d) for d in docs]
    assert specs[0].broker.password == "s3cret" and specs[0].broker.tls
    assert "s3cret" not in json.dumps(specs[0].echo())
    subscribers = [s for spec in specs for s in spec.subscribers]
    shared = [s for s in subscribers if s.topics[0].startswith("$share/")]
    assert [s.topics for s in shared] == [("$share/apps/s/pub/#",)] * 2
    assert {s.clean_session for s in shared} == {True}  # the group's override
    assert all(s.rate == 5.0 for spec in specs for s in spec.publishers)
    # the shared group gets each message once, the monitor once: 2 receivers each
    assert set(receivers(plans).values()) == {2}
    assert expected_delivery_rate(plans) == pytest.approx(60.0)


def test_an_unset_connection_leaves_the_driver_defaults(tmp_path):
    stage = expand(scenario())[0]
    plans = place(stage, driver_slots([("a", 1)]))
    doc = process_spec(stage, plans[0], run_id="r", broker={"host": "h", "port": 1})
    assert doc["broker"] == {"host": "h", "port": 1}
    assert set(doc) - {"clean_session"} == {
        "run_id", "stage_id", "host", "proc", "broker", "publishers", "subscribers",
        "warmup_s", "measure_s", "drain_s"}


def test_a_password_reference_resolves_on_the_driver_host_only(tmp_path, monkeypatch):
    from tasks.driver.spec import SpecError, parse_spec

    base = {"run_id": "r", "stage_id": "s", "host": "h", "proc": 0,
            "publishers": [{"client_id": "p", "topic": "t", "publisher_index": 1}]}
    secret = tmp_path / "mqtt_password"
    secret.write_text("from-a-file\n")
    spec = parse_spec({**base, "broker": {"host": "h", "port": 1, "username": "u",
                                          "password_file": str(secret)}})
    assert spec.broker.password == "from-a-file"
    assert spec.echo()["broker"]["password_file"] == str(secret)
    monkeypatch.delenv("PERFPIPE_NO_SUCH_VAR", raising=False)
    with pytest.raises(SpecError, match="broker.password_env: environment variable "
                                        "PERFPIPE_NO_SUCH_VAR is not set"):
        parse_spec({**base, "broker": {"host": "h", "port": 1, "username": "u",
                                       "password_env": "PERFPIPE_NO_SUCH_VAR"}})
    with pytest.raises(SpecError, match="broker.username: is required"):
        parse_spec({**base, "broker": {"host": "h", "port": 1, "password_file": str(secret)}})


@pytest.mark.parametrize("patch, field, fix", [
    ("  password: hunter2\n", "connection", "password_env: VAR or password_file"),
    ("  password_env: A\n  password_file: /b\n", "connection", "give one of them"),
    ("  password_file: /run/secrets/mqtt\n", "connection", "username"),
    ("  tls: {key_file: k.pem}\n", "connection.tls", "needs cert_file"),
    ("  max_inflight: 0\n", "connection.max_inflight", "greater than or equal to 1"),
    ("  tick_us: 2000000\n", "connection.tick_us", "at most 1,000,000 us"),
    ("  read_hold_us: 50000\n", "connection.read_hold_us", "at most 20,000 us"),
])
def test_bad_connection_settings_name_the_file_the_field_and_the_fix(tmp_path, patch, field,
                                                                      fix):
    text = ("name: conn\npublishers:\n  - {group: p, count: 1, topic: t, rate_per_client: 1}\n"
            "connection:\n" + patch)
    with pytest.raises(ConfigError) as error:
        load_suite(write_catalog(tmp_path, text), "s")
    message = str(error.value)
    assert f"conn.yml: {field}" in message and fix in message, message


def test_per_qos_rates_must_cover_every_qos_of_the_scenario(tmp_path):
    text = ("name: rates\nqos: [0, 1, 2]\npublishers:\n"
            "  - {group: p, count: 2, topic: t, rate_per_client: {0: 0.3, 1: 0.25}}\n")
    with pytest.raises(ConfigError, match=r"rates.yml: .*publishers.0.rate_per_client: no rate "
                                          r"for QoS \[2\]; add e.g. `2: <msgs/s>`"):
        load_suite(write_catalog(tmp_path, text), "s")
    text = text.replace("1: 0.25}", "1: 0.25, 2: 0.2}")
    stages = expand(load_suite(write_catalog(tmp_path, text), "s")[0])
    assert [s.target_publish_rate for s in stages] == pytest.approx([0.6, 0.5, 0.4])


def test_topic_templates_take_modulo_and_division_and_name_bad_placeholders(tmp_path):
    stage = expand(scenario(
        qos=[0], stages={"clients_pct": [100]},
        publishers=[{"group": "pub", "count": 20, "topic": "t/{i%5}/{i//10}/{client}",
                     "rate_per_client": 1}],
        subscribers=[{"group": "sub", "count": 10, "topics": ["t/{i%5}/#"]}]))[0]
    plans = place(stage, driver_slots([("a", 1)]))
    topics = [pub["topic"] for pub in plans[0].publishers]
    assert topics[13] == "t/3/1/pub-a-p0-13"
    assert set(receivers(plans).values()) == {2}  # subscribers i and i+5 share a filter
    text = ("name: badtopic\npublishers:\n"
            "  - {group: p, count: 1, topic: 't/{id}', rate_per_client: 1}\n")
    with pytest.raises(ConfigError, match=r"badtopic.yml: publishers.0.topic: .*unknown "
                                          r"placeholder \{id\}.*use \{scenario\}"):
        load_suite(write_catalog(tmp_path, text), "s")


# ---- inventory: driver processes default to one per core ------------------------------
def test_driver_procs_default_to_one_per_core(tmp_path):
    from tasks.catalog.inventory import Inventory, load_inventory

    path = tmp_path / "inv.yml"
    path.write_text("hosts:\n  - {name: here, roles: [broker, driver]}\n"
                    "broker: {host: here}\n")
    local = load_inventory(path)
    assert local.host("here").procs == len(os.sched_getaffinity(0))  # resolved at plan time
    remote = Inventory.model_validate({
        "hosts": [{"name": "d1", "transport": "ssh", "address": "10.0.0.2", "roles": ["driver"]},
                  {"name": "d2", "transport": "ssh", "address": "10.0.0.3", "roles": ["driver"],
                   "procs": 3}],
        "broker": {"managed": False, "address": "10.0.0.9", "port": 1883}})
    assert remote.host("d1").procs == "auto"
    assert remote.driver_procs({"d1": 8, "d2": 2}) == [("d1", 8), ("d2", 3)]
    with pytest.raises(ValueError, match="d1.procs is auto but the host's core count"):
        remote.driver_procs({})
    with pytest.raises(ValueError, match="procs 'auto' is not resolved"):
        driver_slots([(h.name, h.procs) for h in remote.driver_hosts()])
    with pytest.raises(ValueError, match="1..256"):
        Inventory.model_validate({**remote.model_dump(), "hosts": [
            {"name": "d1", "transport": "ssh", "roles": ["driver"], "procs": 0}]})


def test_auto_procs_leave_the_brokers_cpus_to_it(tmp_path):
    """'auto' counts the cores broker.cpus leaves on the broker's host, so the drivers do
    not run two processes to a CPU there; other hosts, and an unpinned broker, keep all."""
    from tasks.catalog.inventory import Inventory, load_inventory

    path = tmp_path / "inv.yml"
    path.write_text("hosts:\n  - {name: here, roles: [broker, driver], search_procs: auto}\n"
                    "broker: {host: here, cpus: 0}\n")
    here = load_inventory(path).host("here")
    assert here.procs == here.search_procs == max(1, len(os.sched_getaffinity(0)) - 1)
    hosts = [{"name": "b", "transport": "ssh", "address": "10.0.0.2",
              "roles": ["broker", "driver"]},
             {"name": "d", "transport": "ssh", "address": "10.0.0.3", "roles": ["driver"],
              "search_procs": "auto"}]
    pinned = Inventory.model_validate({"hosts": hosts, "broker": {"host": "b", "cpus": "0-2,5"}})
    cores = {"b": 8, "d": 8}
    assert pinned.driver_procs(cores) == [("b", 4), ("d", 8)]
    assert pinned.driver_procs(cores, search=True) == [("b", 4), ("d", 8)]
    assert pinned.driver_procs({"b": 4, "d": 8}) == [("b", 1), ("d", 8)]  # at least one
    unpinned = Inventory.model_validate({"hosts": hosts, "broker": {"host": "b"}})
    assert unpinned.driver_procs(cores) == [("b", 8), ("d", 8)]
    # kept on its CPUs for searches only: the rated stages' drivers have every core
    searched = Inventory.model_validate({"hosts": hosts, "broker": {
        "host": "b", "cpus": "0-2,5", "cpus_for": "capacity"}})
    assert searched.driver_procs(cores) == [("b", 8), ("d", 8)]
    assert searched.driver_procs(cores, search=True) == [("b", 4), ("d", 8)]
    path.write_text("hosts:\n  - {name: here, roles: [broker, driver]}\n"
                    "broker: {host: here, cpus: 0, cpus_for: capacity}\n")
    here = load_inventory(path).host("here")  # procs: auto, searches too
    assert here.procs == len(os.sched_getaffinity(0))
    assert here.search_procs == max(1, len(os.sched_getaffinity(0)) - 1)


# ---- inventory: a max-rate search's probes may run more driver processes ---------------
SEARCHED = """
name: s
qos: [0]
publishers: [{group: pub, count: 50, topic: "t/{scenario}", aggregate_rate: 10000}]
subscribers: [{group: sub, count: 1, topics: ["t/{scenario}"]}]
stages: {measure_s: 3, search: {hold_s: 10}}
"""


def test_a_searches_probes_and_holds_run_search_procs_every_other_stage_procs(tmp_path):
    from tasks.catalog.inventory import Inventory, load_inventory
    from tasks.catalog.placement import stage_slots
    from tasks.catalog.stages import probe

    (scenario_,) = load_suite(write_catalog(tmp_path, SEARCHED), "s")
    (template,) = expand(scenario_)
    rated = replace(template, stage_id="s.q0.c100.r100", search=None)
    inventory = Inventory.model_validate({
        "hosts": [{"name": "here", "roles": ["broker", "driver"], "procs": 1,
                   "search_procs": 2},
                  {"name": "d2", "transport": "ssh", "address": "10.0.0.3", "roles": ["driver"],
                   "procs": 2, "search_procs": "auto"}],
        "broker": {"host": "here"}})
    cpus = {"here": 2, "d2": 4}

    def per_host(stage, inv, cores=cpus) -> Counter:
        return Counter(host for host, _ in stage_slots(stage, inv, cores))

    for stage in (probe(template, 40_000, 3), probe(template, 40_000, 1, hold_s=10)):
        assert per_host(stage, inventory) == {"here": 2, "d2": 4}  # 'auto': d2's 4 cores
    assert per_host(rated, inventory) == {"here": 1, "d2": 2}
    # unset: the probes run procs too
    plain = Inventory.model_validate({**inventory.model_dump(), "hosts": [
        {"name": "here", "roles": ["broker", "driver"], "procs": 1}]})
    assert per_host(probe(template, 40_000, 3), plain) == {"here": 1}
    with pytest.raises(ValueError, match=r"d2.search_procs is auto but the host's core count"):
        per_host(probe(template, 40_000, 3), inventory, {"here": 2})
    for bad in (0, 300, "x"):
        with pytest.raises(ValueError, match=r"search_procs"):
            Inventory.model_validate({**plain.model_dump(), "hosts": [
                {"name": "here", "roles": ["broker", "driver"], "search_procs": bad}]})
    path = tmp_path / "inv.yml"  # on this machine 'auto' is resolved at plan time
    path.write_text("hosts:\n  - {name: here, roles: [broker, driver], procs: 1, "
                    "search_procs: auto}\nbroker: {host: here}\n")
    assert load_inventory(path).host("here").search_procs == os.cpu_count()


def test_the_plan_says_how_long_a_search_may_run(tmp_path):
    """`perfpipe plan`'s duration of a search: its probes, its holds (a scenario setting)
    and the one run again after a stall; no hold when hold_s is 0."""
    from tasks.catalog.stages import stage_rows

    def duration(search: str) -> str:
        catalog = write_catalog(tmp_path, SEARCHED.replace("search: {hold_s: 10}", search))
        (row,) = stage_rows(expand(load_suite(catalog, "s")[0]))
        return row["duration s"]

    assert duration("search: {hold_s: 10}") == ("7 per probe, at most 14 probes, then at most 2 "
                                                "holds of 10 s; one more after a stall")
    assert duration("search: {hold_s: 7, holds: 1, max_probes: 5}") == (
        "7 per probe, at most 5 probes, then at most 1 hold of 7 s; one more after a stall")
    assert duration("search: {}") == "7 per probe, at most 14 probes; one more after a stall"


def test_a_stage_setup_change_names_what_it_measures_differently_and_nothing_else(tmp_path):
    from tasks.catalog.inventory import Inventory
    from tasks.catalog.placement import recorded_params
    from tasks.fingerprint import setup_changes

    first, _second, *_ = expand(scenario())
    recorded = {**json.loads(json.dumps(first.to_dict())), "drivers": {"here": 1}}  # as stored
    assert setup_changes(recorded, {**first.to_dict(), "drivers": {"here": 1}}) == []
    # its name, place in the suite, cool-down, a search's outcome and where it starts, and
    # which file holds a TLS certificate are not what it measures
    renamed = replace(first, stage_id="other", index=7, cooldown_s=99)
    assert setup_changes(recorded, {**renamed.to_dict(), "drivers": {"here": 1},
                                    "search_outcome": {"max_rate": 5}}) == []
    searched = replace(first, search={"hold_s": 10, "warm_start": True},
                       connection={**first.connection, "tls": {"cert_file": "/a.pem"}})
    moved = replace(searched, search={"hold_s": 10, "warm_start": False},
                    connection={**first.connection, "tls": {"cert_file": "/b.pem"}})
    assert setup_changes(searched.to_dict(), moved.to_dict()) == []
    more = replace(first, groups=(replace(first.groups[0], count=20), *first.groups[1:]),
                   measure_s=60, connection={**first.connection, "tls": {}})
    assert setup_changes(recorded, {**more.to_dict(), "drivers": {"here": 2, "d2": 1}}) == [
        "groups.pub.count: 5 -> 20", "measure_s: 5 -> 60", "connection.tls.insecure: unset -> "
        "False", "drivers.d2: unset -> 1", "drivers.here: 1 -> 2"]
    assert setup_changes(searched.to_dict(), {**searched.to_dict(), "search": {"hold_s": 20}}) \
        == ["search.hold_s: 10 -> 20"]
    # a night recorded before a field existed: no difference in it; a setting it lacks has
    # its default (a group's field, a search setting, a connection setting)
    legacy = {k: v for k, v in recorded.items() if k != "drivers"}
    legacy["groups"] = [{k: v for k, v in g.items() if k != "share_group"}
                        for g in legacy["groups"]]
    legacy["connection"] = {}
    assert setup_changes(legacy, {**first.to_dict(), "drivers": {"here": 3}}) == []
    assert setup_changes({**searched.to_dict(), "search": {"hold_s": 10}}, searched.to_dict()) \
        == []

    inventory = Inventory.model_validate({
        "hosts": [{"name": "here", "roles": ["broker", "driver"], "procs": 1,
                   "search_procs": 2},
                  {"name": "d2", "transport": "ssh", "address": "10.0.0.3",
                   "roles": ["driver"], "procs": "auto"}],
        "broker": {"host": "here"}})
    assert recorded_params(first, inventory, {"d2": 4})["drivers"] == {"here": 1, "d2": 4}
    template = replace(first, search={"hold_s": 10})  # a search: its probes' processes
    assert recorded_params(template, inventory, {"d2": 4})["drivers"] == {"here": 2, "d2": 4}
    few = replace(first, groups=(replace(first.groups[0], count=2), replace(first.groups[1],
                                                                         count=1)))
    assert recorded_params(few, inventory, {"d2": 4})["drivers"] == {"here": 1, "d2": 2}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to move between")
def test_a_running_brokers_threads_are_moved_and_each_given_back_its_own_cpus(tiny_suite,
                                                                             tmp_path):
    """`broker.cpus_for: capacity` moves every thread of the broker's process group onto
    its CPUs for a search (read back from /proc), and gives each thread back the CPUs it
    had (a broker may bind its threads one by one, as RabbitMQ's schedulers are), a thread
    started meanwhile those of its process: after the search, even a failed one, and at
    the next attempt of a stages step that stopped inside one (what each had is recorded
    before the move). A group gone is said, and nothing is moved."""
    import subprocess
    import sys
    import time

    from tasks import rundir
    from tasks.brokers import BrokerError, affinity
    from tasks.catalog.cpus import as_list
    from tasks.hosts import LocalHost
    from tasks.run_context import RunContext
    from tasks.settings import load_settings
    from tasks.steps.broker import kept_for_search, let_go
    from tasks.steps.plan import plan_run

    host, log, trigger = LocalHost(), str(tmp_path / "broker.log"), tmp_path / "go"
    group = host.launch([sys.executable, "-c", "import os, threading, time\n"
                         "threading.Thread(target=time.sleep, args=(60,)).start()\n"
                         f"while not os.path.exists({str(trigger)!r}): time.sleep(0.01)\n"
                         "threading.Thread(target=time.sleep, args=(60,)).start()\n"
                         "time.sleep(60)"], log)
    try:
        deadline = time.monotonic() + 30  # a Python start on a loaded machine
        while len(found := affinity.threads(host, group)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # the launching shell, the process and its first thread
        first, second = sorted(os.sched_getaffinity(0))[:2]
        (pid,) = {p for p, _ in found.values()} - {group}
        (thread,) = set(found) - {group, pid}
        for tid, cpu in ((pid, second), (thread, first)):  # bound one by one, as a broker may
            subprocess.run(["taskset", "-p", "-c", str(cpu), str(tid)], check=True,
                           capture_output=True)
        had = {tid: cpus for tid, (_, cpus) in affinity.threads(host, group).items()}
        assert (had[pid], had[thread]) == (str(second), str(first))
        recorded = []
        kept = affinity.move(host, group, str(first), keep=recorded.append)
        assert recorded == [kept] and kept == had
        assert {cpus for _, cpus in affinity.threads(host, group).values()} == {str(first)}
        trigger.touch()  # a thread started while it is moved: it inherits the moved CPUs
        while len(affinity.threads(host, group)) < 4 and time.monotonic() < deadline + 30:
            time.sleep(0.05)
        affinity.give_back(host, group, kept, fallback=None)
        now = {tid: cpus for tid, (_, cpus) in affinity.threads(host, group).items()}
        (new,) = set(now) - set(had)
        assert now == {**had, new: str(second)}  # each its own; the new one its process's
        # a stages step that stopped inside a search: its next attempt gives them back
        ctx = RunContext.load(load_settings(), plan_run(load_settings(), suite="tiny"))
        state = {"host": "localhost", "pid": pid, "group_pid": group, "cpus": str(first),
                 "cpus_for": "capacity", "host_cpus": as_list(os.sched_getaffinity(0))}
        with pytest.raises(RuntimeError, match="the search failed"):
            with kept_for_search(ctx, state):
                assert (ctx.run_dir / rundir.BROKER_MOVED).exists()
                moved = {cpus for _, cpus in affinity.threads(host, group).values()}
                raise RuntimeError("the search failed")  # and the step with it
        assert moved == {str(first)} and not (ctx.run_dir / rundir.BROKER_MOVED).exists()
        affinity.move(host, group, str(first), keep=lambda kept: ctx.write_json(
            rundir.BROKER_MOVED, {"group_pid": group, "threads": kept}))  # killed in a search
        let_go(ctx, state)
        assert {tid: cpus for tid, (_, cpus) in affinity.threads(host, group).items()} == now
        assert not (ctx.run_dir / rundir.BROKER_MOVED).exists()
        let_go(ctx, state)  # nothing moved: nothing to do
    finally:
        host.kill_group(group, "KILL")
    deadline = time.monotonic() + 30
    while affinity.threads(host, group) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert affinity.threads(host, group) == {}
    with pytest.raises(BrokerError, match=f"the broker's processes \\(group {group} on "
                                          f"localhost\\) are gone; not moved onto {first}"):
        affinity.move(host, group, str(first))
    affinity.give_back(host, group, had, fallback=None)  # nothing to give back: no error
    assert not host.alive(pid, group)

"""The shipped catalog and suites, and the fan-out machinery they need (topic cycling).

Pure tests, except the last one: one short driver run against a real Mosquitto.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.catalog import cpus
from tasks.catalog.inventory import Inventory
from tasks.catalog.placement import (
    driver_slots,
    expected_delivery_rate,
    place,
    process_spec,
    receivers,
)
from tasks.catalog.scenarios import Scenario, load_catalog, load_suite, load_suites
from tasks.catalog.stages import expand
from tasks.driver.send import stream_last_seqs
from tasks.driver.output import READY_FILE, START_FILE, SUMMARY_FILE
from tasks.driver.spec import SpecError, parse_spec

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
SLOTS = driver_slots([("driver1", 2), ("driver2", 2)])


def test_every_catalog_file_validates_and_names_its_source():
    catalog = load_catalog(SCENARIOS)
    assert len(catalog) >= 11
    for scenario in catalog.values():
        assert scenario.source and scenario.full_scale, scenario.name


def test_smoke_stays_as_it_was():
    (smoke,) = load_suite(SCENARIOS, "smoke")
    assert [(s.stage_id, s.publishers, s.subscribers, s.target_publish_rate, s.duration_s)
            for s in expand(smoke)] == [
        ("ibm_fanin_smoke.q0.c50.r100", 100, 1, 1000.0, 14),
        ("ibm_fanin_smoke.q0.c100.r100", 200, 1, 2000.0, 14),
        ("ibm_fanin_smoke.q1.c50.r100", 100, 1, 1000.0, 14),
        ("ibm_fanin_smoke.q1.c100.r100", 200, 1, 2000.0, 14)]


@pytest.mark.parametrize("suite", ["smoke", "nightly", "release"])
def test_every_suite_plans_and_every_process_spec_is_accepted_by_the_driver(suite, capsys,
                                                                            monkeypatch):
    from tasks.cli import main

    monkeypatch.setenv("PERFPIPE_SCENARIOS_DIR", str(SCENARIOS))
    assert main(["plan", "--suite", suite]) == 0
    assert f"{load_suite(SCENARIOS, suite)[0].name}." in capsys.readouterr().out
    for scenario in load_suite(SCENARIOS, suite):
        for stage in expand(scenario):
            plans = place(stage, SLOTS)
            for plan in plans:
                parse_spec(process_spec(stage, plan, run_id="r",
                                        broker={"host": "10.0.0.1", "port": 1883}))
            counts = receivers(plans)
            assert counts and all(n >= 0 for n in counts.values())


def test_release_is_the_whole_catalog_and_nightly_is_short_and_covers_the_patterns():
    suites = load_suites(SCENARIOS).suites
    release = load_suite(SCENARIOS, "release")
    assert sorted(s.name for s in release) == sorted(load_catalog(SCENARIOS))
    nightly = [stage for scenario in load_suite(SCENARIOS, "nightly")
               for stage in expand(scenario)]
    assert sum(stage.duration_s for stage in nightly) < 300 - 8 * len(nightly)  # + overhead
    assert {stage.qos for stage in nightly} == {0, 1, 2}
    assert {"ibm_fanin", "ibm_fanout", "messagesight_broadcast",
            "messagesight_connburst"} <= {stage.scenario for stage in nightly}
    assert "smoke" in suites


def stage_of(name: str, qos: int = 0, clients_pct: int = 100) -> tuple:
    scenario = load_catalog(SCENARIOS)[name]
    stage = next(s for s in expand(scenario) if s.qos == qos and s.clients_pct == clients_pct)
    plans = place(stage, SLOTS)
    return stage, plans, receivers(plans)


@pytest.mark.parametrize("name, qos, pct, per_message, streams", [
    ("ibm_fanin", 0, 100, 1, 1000),
    ("ibm_fanin_multitopic", 1, 100, 1, 1000),
    ("ibm_fanout", 2, 100, 1, 1000),  # one topic per subscriber, cycled by one publisher
    ("ibm_fanout", 0, 10, 1, 100),  # topics follow the subscribers down
    ("ibm_fanout_50k", 1, 100, 2, 500),  # two subscribers per topic
    ("ibm_fanout_50k", 1, 50, 1, 500),
    ("messagesight_fanin_partitions", 0, 100, 1, 1000),  # one partition consumer each
    ("messagesight_broadcast", 0, 100, 1000, 1),
    ("messagesight_broadcast", 0, 25, 250, 1),
    ("messagesight_connburst", 0, 100, 1, 1),  # the probe; devices only connect
    ("emqx_broadcast", 1, 100, 10, 5),  # idle subscribers receive nothing
    ("emqx_one_to_one", 0, 100, 1, 100),
    ("tbmq_groups", 1, 100, 1, 500),
])
def test_receivers_are_right_for_every_pattern(name, qos, pct, per_message, streams):
    stage, plans, counts = stage_of(name, qos, pct)
    assert len(counts) == streams
    assert set(counts.values()) == {per_message}
    assert expected_delivery_rate(plans) == pytest.approx(stage.target_publish_rate * per_message)


def test_a_cycling_publisher_is_one_stream_per_topic_with_its_own_index():
    stage, plans, counts = stage_of("ibm_fanout_50k", 0)
    publishers = sorted((p for plan in plans for p in plan.publishers),
                        key=lambda p: p["publisher_index"])
    assert [p["publisher_index"] for p in publishers] == [1, 101, 201, 301, 401]
    assert publishers[1]["topic_cycle"][0] == "perfpipe/ibm_fanout_50k/100"  # partitioned
    assert publishers[1]["topic_cycle"][-1] == "perfpipe/ibm_fanout_50k/199"
    assert sorted(map(int, counts)) == list(range(1, 501))
    spec = parse_spec(process_spec(stage, next(p for p in plans if p.publishers), run_id="r",
                                   broker={"host": "h", "port": 1}))
    assert len(spec.publishers[0].topic_cycle) == 100


def test_stream_sequence_numbers_split_a_publishers_count_over_its_topics():
    spec = parse_spec({"run_id": "r", "stage_id": "s", "host": "h", "proc": 0,
                       "broker": {"host": "h", "port": 1},
                       "publishers": [{"client_id": "p", "publisher_index": 7,
                                       "topic_cycle": ["a", "b", "c"]}]}).publishers[0]
    assert spec.topic == "a"
    assert stream_last_seqs(spec, 0) == {"7": 0, "8": 0, "9": 0}
    assert stream_last_seqs(spec, 7) == {"7": 3, "8": 2, "9": 2}  # a b c a b c a
    for bad, message in [({"topic_cycle": ["a", "b/+"]}, "topic_cycle[1]"),
                         ({"topic_cycle": ["a", "b"], "topic": "b"}, "must be topic_cycle[0]"),
                         ({"topic_cycle": ["a", "b"], "publisher_index": 2**32 - 1},
                          "every stream")]:
        doc = {"client_id": "p", "publisher_index": 1, **bad}
        with pytest.raises(SpecError, match=re.escape(message)):
            parse_spec({"run_id": "r", "stage_id": "s", "host": "h", "proc": 0,
                        "broker": {"host": "h", "port": 1}, "publishers": [doc]})


def test_pattern_errors_name_the_field_and_the_fix():
    base = {"name": "x", "publishers": [{"group": "p", "count": 4, "topic": "t/{n}",
                                         "rate_per_client": 1}]}
    with pytest.raises(ValueError, match="needs topic_count"):
        Scenario.model_validate(base)
    with pytest.raises(ValueError, match="topic_count: 2 topics cannot be partitioned over 4"):
        Scenario.model_validate({**base, "publishers": [
            {**base["publishers"][0], "topic_count": 2, "topic_split": "partitioned"}]})
    with pytest.raises(ValueError, match=r"subscribers.0.expected_publisher_groups: the topics "
                                         r"\['u/#'\] receive from no group, not \['p'\]"):
        Scenario.model_validate({**base, "publishers": [
            {**base["publishers"][0], "topic_count": 8}], "subscribers": [
            {"group": "s", "count": 1, "topics": ["u/#"], "expected_publisher_groups": ["p"]}]})


def test_config_mistakes_are_said_where_they_are_written_with_the_fix(tmp_path: Path):
    """A mistyped key is named with the keys that exist (the nearest first); a suite entry
    of no kind, one error; a value of none of a union's types, one line; an override or
    an unknown scenario of an included suite, where it is written; no suites.yml, said."""
    from tasks.config_files import ConfigError

    (tmp_path / "catalog").mkdir()
    shipped = (SCENARIOS / "catalog" / "ibm_fanin_smoke.yml").read_text()
    written = tmp_path / "catalog" / "ibm_fanin_smoke.yml"
    written.write_text(shipped.replace("rate_per_client", "rate_per_clent"))
    with pytest.raises(ConfigError) as typo:
        load_catalog(tmp_path)
    assert str(typo.value) == (
        f"{written}: publishers.0.rate_per_clent: unknown key 'rate_per_clent'; did you mean "
        "'rate_per_client'? known: aggregate_rate, clean_session, count, group, "
        "payload_bytes, rate_per_client, scale_with_clients, topic, topic_count, "
        "topic_split, topics_scale_with_clients")
    written.write_text(re.sub(r"rate_per_client: \S+", "rate_per_client: fast", shipped))
    with pytest.raises(ConfigError) as union:
        load_catalog(tmp_path)
    assert str(union.value) == (
        f"{written}: publishers.0.rate_per_client: Input should be a valid number, got 'fast'; "
        "or Input should be a valid dictionary, got 'fast'")
    written.write_text(shipped)

    suites = tmp_path / "suites.yml"
    suites.write_text("suites:\n  typo: [{scenario: ibm_fanin_smoke, stage: {measure_s: 2}}]\n"
                      "  shapeless: [{scenaro: ibm_fanin_smoke}, 3]\n")
    with pytest.raises(ConfigError) as entries:
        load_suites(tmp_path)
    kinds = "an entry is a scenario's name, {scenario: NAME, qos: [...], stages: {...}} or " \
            "{suite: NAME}"
    assert str(entries.value).splitlines() == [
        f"{suites}: suites.typo.0.stage: unknown key 'stage'; did you mean 'stages'? known: "
        "qos, scenario, stages", f"{suites}: suites.shapeless.0: {kinds}",
        f"{suites}: suites.shapeless.1: {kinds}"]

    suites.write_text("suites:\n  other: [{scenario: ibm_fanin_smoke, stages: {measure_s: 0}}]\n"
                      "  outer: [{suite: other}]\n  gaps: [{suite: missing}]\n"
                      "  far: [{suite: near}]\n  near: [ibm_fanin_smoke, nope]\n")
    with pytest.raises(ConfigError, match=re.escape(
            f"{suites}: suites.other.0 (overrides of scenario 'ibm_fanin_smoke'): "
            "stages.measure_s: Input should be greater than or equal to 1")):
        load_suite(tmp_path, "outer")
    with pytest.raises(ConfigError, match=re.escape(
            f"{suites}: suites.gaps.0: includes the unknown suite 'missing'; known: ['far', "
            "'gaps', 'near', 'other', 'outer']")):
        load_suite(tmp_path, "gaps")
    with pytest.raises(ConfigError, match=re.escape(
            f"{suites}: suites.far: unknown scenarios (suites.near.1: 'nope'); add "
            f"{tmp_path / 'catalog'}/<name>.yml or fix the name")):
        load_suite(tmp_path, "far")
    suites.unlink()
    with pytest.raises(ConfigError, match=re.escape(
            f"{suites}: no such file: the scenarios dir (PERFPIPE_SCENARIOS_DIR")):
        load_suite(tmp_path, "smoke")


def test_warmup_iterations_stretch_the_warmup_to_that_many_messages_per_publisher():
    stage, _, _ = stage_of("tbmq_groups", 1)
    assert stage.warmup_s == 6  # 6 messages at 100 msg/s over 100 publishers = 1 msg/s each


def test_a_topic_cycle_delivers_every_stream_without_gaps(broker, tmp_path):
    """One process, QoS 0 and QoS 2 publishers each cycling three topics; a subscriber per
    topic and one on the wildcard: no loss, no duplicates, every stream's count right."""
    doc = {"run_id": "cycle", "stage_id": "s", "host": "localhost", "proc": 0,
           "broker": {"host": "127.0.0.1", "port": broker.port},
           "publishers": [
               {"client_id": "p0", "publisher_index": 1, "qos": 0, "rate": 150,
                "topic_cycle": ["cy/0/a", "cy/0/b", "cy/0/c"]},
               {"client_id": "p2", "publisher_index": 4, "qos": 2, "rate": 150,
                "topic_cycle": ["cy/2/a", "cy/2/b", "cy/2/c"]}],
           "subscribers": [{"client_id": f"s{q}{t}", "topics": [f"cy/{q}/{t}"], "qos": 2}
                           for q in (0, 2) for t in "abc"]
           + [{"client_id": "all", "topics": ["cy/#"], "qos": 2}],
           "warmup_s": 0, "measure_s": 2, "drain_s": 1}
    out = tmp_path / "out"
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    process = subprocess.Popen([sys.executable, "-m", "tasks.driver", "--spec",
                                str(tmp_path / "spec.json"), "--out", str(out)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (out / READY_FILE).exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    (out / START_FILE).write_text(json.dumps({"start_at": int(time.time()) + 1}))
    assert process.wait(30) == 0, process.stderr.read()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    last = summary["last_seq"]
    assert sorted(last, key=int) == ["1", "2", "3", "4", "5", "6"]
    assert sum(last[k] for k in "123") == sum(last[k] for k in "456") == 300
    assert max(last.values()) - min(last.values()) <= 1
    assert summary["unique_received"] == 2 * 600  # its topic's subscriber + the wildcard
    judgement = summary["qos_judgement"]
    assert judgement["violations"] == 0 and not judgement["publishers_with_anomalies"]
    assert summary["totals"]["lost"] == summary["totals"]["duplicated"] == 0
    assert summary["totals"]["acked"] == 300


def test_cpu_lists_read_and_write_as_taskset_and_proc_do():
    assert cpus.parse("0,2-3") == {0, 2, 3} and cpus.as_list({3, 0, 2, 7}) == "0,2-3,7"
    assert cpus.others("0", range(4)) == "1-3" and cpus.others("0-3", range(4)) == ""
    assert cpus.pinned(["mosquitto", "-c", "x"], "1") == ["taskset", "-c", "1", "mosquitto",
                                                         "-c", "x"]
    assert cpus.pinned(["mosquitto"], None) == ["mosquitto"]
    threads = "Name:\tmosquitto\nCpus_allowed_list:\t0\nName:\tmosquitto\nCpus_allowed_list:\t0-1\n"
    assert cpus.allowed(threads) == [{0}, {0, 1}]
    for bad in ("3-1", "0;reboot", "", "a", "\u0661"):
        with pytest.raises(ValueError):
            cpus.parse(bad)


def test_broker_cpus_must_fit_its_host_and_leave_the_drivers_a_cpu():
    cpus.check_fits("0", "h", {0, 1}, drivers_there=True)
    cpus.check_fits("0-1", "h", {0, 1}, drivers_there=False)  # a host of its own
    assert cpus.others("2", {2, 3}) == "3"  # a cpuset of CPUs 2 and 3
    with pytest.raises(ValueError, match=r"broker.cpus: '0' names CPUs h does not let "
                                         r"perfpipe use \(it may use 2-3\); name some of 2-3"):
        cpus.check_fits("0", "h", {2, 3}, drivers_there=False)
    with pytest.raises(ValueError, match="broker.cpus: '0-1' leaves no CPU of h"):
        cpus.check_fits("0-1", "h", {0, 1}, drivers_there=True)


def test_the_inventory_takes_broker_cpus_only_for_a_broker_perfpipe_starts():
    host = {"name": "h", "transport": "local", "roles": ["broker", "driver"]}
    assert Inventory(hosts=[host], broker={"host": "h", "cpus": "0"}).broker.cpus == "0"
    assert Inventory(hosts=[host], broker={"host": "h", "cpus": 1}).broker.cpus == "1"  # YAML 1
    for broker, error in (({"host": "h", "cpus": "1-0"}, "runs backwards"),
                          ({"host": "h", "cpus": "0 1"}, "should match pattern"),
                          ({"host": "h", "cpus": "0", "managed": False, "port": 1883},
                           "broker.cpus: only for a broker perfpipe starts"),
                          ({"cpus": "0", "managed": False, "address": "b", "port": 1883},
                           "broker.cpus: only for a broker perfpipe starts"),
                          ({"host": "h", "cpus_for": "capacity"},
                           "broker.cpus_for: 'capacity' needs broker.cpus"),
                          ({"host": "h", "cpus": "0", "cpus_for": "rated"},
                           "cpus_for\n  Input should be 'all' or 'capacity'")):
        with pytest.raises(ValueError, match=error):
            Inventory(hosts=[host], broker=broker)


def test_an_inventory_number_is_a_number_not_yaml_true():
    """YAML's `true` is Python's 1: `procs: true` ran one driver process, `port: true` a
    broker on port 1, each failing later without naming the field."""
    host = {"name": "h", "transport": "local", "roles": ["broker", "driver"]}
    for hosts, broker, field in (([{**host, "procs": True}], {"host": "h"}, "procs"),
                                 ([{**host, "search_procs": True}], {"host": "h"}, "search_procs"),
                                 ([{**host, "port": True}], {"host": "h"}, "port"),
                                 ([host], {"host": "h", "port": True}, "broker.port")):
        with pytest.raises(ValueError, match=rf"{field}.*\n.*Input should be a valid integer"):
            Inventory(hosts=hosts, broker=broker)
    assert Inventory(hosts=[{**host, "procs": 2}], broker={"host": "h", "port": 1883}).hosts[0].procs == 2


def test_a_host_elsewhere_is_never_run_here_unsaid():
    """A host without `transport: ssh` is this machine: SSH settings on it, or an address
    elsewhere with no transport said, were ignored, and every "driver host" was the
    orchestrator (its fingerprint recorded for each)."""
    for host, error in (
            ({"address": "10.0.0.6", "port": 2222}, "transport: local runs on this machine, "
             "yet port is given: set transport: ssh"),
            ({"address": "10.0.0.7", "user": "perf", "gateway": "g"}, "yet gateway, user are"),
            ({"address": "10.0.0.8"}, "address '10.0.0.8' with no transport: set transport: ssh"),
            ({"transport": "local", "key_file": "/k"}, "yet key_file is given")):
        with pytest.raises(ValueError, match=re.escape(error)):
            Inventory(hosts=[{"name": "h", "roles": ["driver"], **host}],
                      broker={"address": "b", "port": 1883, "managed": False})
    for host in ({"address": "10.0.0.8", "transport": "local"}, {"address": "127.0.0.1"},
                 {"address": "10.0.0.8", "transport": "ssh", "port": 2222}, {}):
        Inventory(hosts=[{"name": "h", "roles": ["driver"], **host}],
                  broker={"address": "b", "port": 1883, "managed": False})


def test_every_gateway_is_another_host_and_following_them_ends():
    """Checked for a broker with no host too (a compose or cloud broker), where the check
    used to be skipped and a bad gateway failed at provision with a bare StopIteration."""
    def hosts(**gateways):
        return [{"name": n, "transport": "ssh", "roles": ["driver"], **(
            {"gateway": gateways[n]} if n in gateways else {})} for n in ("a", "b", "c")]

    broker = {"managed": False, "address": "mqtt.example", "port": 1883}
    assert Inventory(hosts=hosts(a="b", b="c"), broker=broker).host("a").gateway == "b"
    for gateways, error in (({"a": "x"}, r"hosts: a.gateway 'x' must be another host in "
                                         r"hosts \(\['a', 'b', 'c'\]\)"),
                            ({"b": "b"}, "hosts: b.gateway 'b' must be another host"),
                            ({"a": "b", "b": "c", "c": "a"},
                             r"the gateways loop \(a -> b -> c -> a\)")):
        with pytest.raises(ValueError, match=error):
            Inventory(hosts=hosts(**gateways), broker=broker)


def test_the_broker_is_kept_on_its_cpus_for_every_stage_or_for_searches_only():
    assert [cpus.kept_on("0", "all", search) for search in (False, True)] == ["0", "0"]
    assert [cpus.kept_on("0", "capacity", search) for search in (False, True)] == [None, "0"]
    assert cpus.kept_on(None, "all", True) is None
    with pytest.raises(ValueError, match="broker.cpus_for: 'rated' is not one of all, capacity"):
        cpus.kept_on("0", "rated", True)  # a broker.json edited by hand
    # the fingerprint names both; 'all' as before cpus_for, so pinned histories go on
    assert cpus.placement("0", "all") == "0" and cpus.placement(None, "capacity") is None
    assert cpus.placement("0-1", "capacity") == "0-1 for capacity"
    assert cpus.searches_only("0", "capacity") and not cpus.searches_only("0", "all")
    assert not cpus.searches_only(None, "capacity")


def test_a_suite_overriding_one_search_setting_keeps_the_others(tmp_path: Path) -> None:
    """`stages: {search: {max_probes: 10}}` changes max_probes only: the scenario's hold
    (hold_s 10, holds 3) stays. It used to replace the whole search with the defaults, so
    the night's capacity was a 3 s probe never held, under a setup of its own."""
    (tmp_path / "catalog").symlink_to(REPO / "scenarios" / "catalog")
    (tmp_path / "suites.yml").write_text(
        "suites:\n  fewer: [{scenario: capacity_fanin, stages: {search: {max_probes: 10}}}]\n")
    (shipped,) = [s for s in load_suite(REPO / "scenarios", "capacity") if s.name == "capacity_fanin"]
    (scenario,) = load_suite(tmp_path, "fewer")
    assert scenario.stages.search.max_probes == 10
    assert scenario.stages.search.model_dump(exclude={"max_probes"}) == \
        shipped.stages.search.model_dump(exclude={"max_probes"})
    assert (scenario.stages.search.hold_s, scenario.stages.search.holds) == (10, 3)


def test_a_qos_listed_twice_is_refused(tmp_path: Path) -> None:
    """qos: [0, 0] expanded to two stages with one stage id, sharing raw folders."""
    from tasks.config_files import ConfigError

    (tmp_path / "catalog").symlink_to(REPO / "scenarios" / "catalog")
    (tmp_path / "suites.yml").write_text(
        "suites:\n  twice: [{scenario: ibm_fanin_smoke, qos: [1, 1]}]\n")
    with pytest.raises(ConfigError, match=re.escape(
            "suites.twice.0 (overrides of scenario 'ibm_fanin_smoke'): qos: list "
            "each QoS once, got [1, 1]")):
        load_suite(tmp_path, "twice")

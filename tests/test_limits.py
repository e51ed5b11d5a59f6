"""Bounds on every number and name (tasks/driver/limits.py): refused at plan time by the
catalog and again by the driver on its host, with the field, the bound and the reason.

Pure tests, except the CLI ones, which run `perfpipe plan` in this process.
"""

from __future__ import annotations

import copy
import math

import pytest

from tasks.catalog.inventory import Inventory
from tasks.catalog.placement import place, too_many_for_hosts
from tasks.catalog.scenarios import Scenario
from tasks.catalog.stages import expand
from tasks.config_files import ConfigError, validate
from tasks.driver.spec import SpecError, parse_spec

SCENARIO = {"name": "s", "publishers": [{"group": "p", "count": 2, "topic": "t/{i}",
                                         "rate_per_client": 10}],
            "subscribers": [{"group": "q", "count": 1, "topics": ["t/+"]}]}


def changed(path: str, value: object, document: dict = SCENARIO) -> dict:
    """`document` with the dotted `path` set to `value` (a copy)."""
    doc = copy.deepcopy(document)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[int(last) if isinstance(node, list) else last] = value
    return doc


@pytest.mark.parametrize("path, value, message", [
    ("publishers.0.rate_per_client", math.inf, r"publishers.0: rate_per_client must be a "
                                               r"finite number > 0 .*got inf"),
    ("publishers.0.rate_per_client", math.nan, r"publishers.0: rate_per_client must be a finite"),
    ("publishers.0.rate_per_client", {0: math.inf}, r"rate_per_client must be a finite"),
    ("publishers.0.rate_per_client", True, r"publishers.0.rate_per_client.*got True"),
    ("publishers.0.rate_per_client", 1e-300, r"stage s.q0.c100.r100: group p's rate per "
                                             r"publisher must be at least 0.001 .*window"),
    ("publishers.0.rate_per_client", 1e300, r"at most 1,000,000 messages/s .*1 us resolution"),
    ("stages.rate_pct", [1000], None),  # 10 x 10 msgs/s: fine
    ("publishers.0.count", True, r"publishers.0.count: Input should be a valid integer, got True"),
    ("publishers.0.count", 200_000_000, r"publishers.0.count: must be at most 1,000,000 clients "
                                        r"\(.*MessageSight"),
    ("subscribers.0.count", True, r"subscribers.0.count: .*got True"),
    ("publishers.0.topic", "t/\x01/{i}", r"publishers.0.topic: 't/\\x01/\{i\}' contains control "
                                         r"characters \(U\+0001\)"),
    ("publishers.0.topic", "t/\x00", r"U\+0000"),
    ("subscribers.0.topics", ["t/\x1b[0m"], r"subscribers.0.topics: .*U\+001B"),
    ("publishers.0.topic", "t/" + "x" * 70_000, r"at most 65535 bytes in UTF-8"),
    ("stages.measure_s", 86_400, r"stages.measure_s: must be at most 3,600 s \(a nightly's"),
    ("stages.warmup_s", 1.5, r"stages.warmup_s: .*got 1.5"),
    ("stages.warmup_iterations", 1_000_000, r"warmup_iterations at the slowest publisher's "
                                            r"rate makes a warm-up that must be at most 3,600 s"),
    ("connection.connect_rate", math.inf, r"connection.connect_rate: must be at most 100,000 "
                                          r"connections/s"),
    ("connection.keepalive_s", True, r"connection.keepalive_s: .*got True"),
    ("connection.max_pending_connects", 10**9, r"at most 65,535 CONNECTs"),
    # the driver's own bound, refused at plan time (it was MQTT's remaining length, which
    # passed sizes the driver then refused on its host mid-run)
    ("publishers.0.payload_bytes", 268_400_000, r"publishers.0.payload_bytes: must be at most "
                                                r"268,369,916 bytes \(MQTT's largest remaining length"),
    ("publishers.0.payload_bytes", 268_369_916, None),
    ("qos", [True], r"qos.0: .*got True"),
])
def test_the_catalog_refuses_what_no_run_can_do_and_says_why(path, value, message):
    document = changed(path, value)
    if message is None:
        validate(Scenario, document, "x.yml")
        return
    with pytest.raises(ConfigError, match=f"^x.yml: {message}" if message.startswith(
            ("publishers", "subscribers", "stages", "connection")) else message):
        validate(Scenario, document, "x.yml")


def test_an_aggregate_rate_is_bounded_per_publisher_at_every_step():
    document = changed("publishers.0", {"group": "p", "count": 1000, "topic": "t/{i}",
                                        "aggregate_rate": 0.5})
    with pytest.raises(ConfigError, match=r"stage s.q0.c100.r100: group p's rate per publisher "
                                          r"must be at least 0.001.*got 0.0005"):
        validate(Scenario, document, "x.yml")
    fine = validate(Scenario, changed("publishers.0.aggregate_rate", 5, document), "x.yml")
    assert [g.rate_per_client for g in expand(fine)[0].groups if g.role == "pub"] == [0.005]


SPEC = {"run_id": "r", "stage_id": "s", "host": "h", "proc": 0,
        "broker": {"host": "127.0.0.1", "port": 1883},
        "publishers": [{"client_id": "c", "topic": "t", "publisher_index": 1, "rate": 10}]}


@pytest.mark.parametrize("path, value, message", [
    ("publishers.0.rate", math.inf, r"publishers\[0\].rate: must be a finite number"),
    ("publishers.0.rate", math.nan, r"publishers\[0\].rate: must be a finite number"),
    ("publishers.0.rate", 0.0, r"publishers\[0\].rate: must be at least 0.001"),
    ("publishers.0.rate", True, r"publishers\[0\].rate: must be float, got True"),
    ("aggregate_rate", math.inf, r"aggregate_rate \(split over 1 publishers\): must be a finite"),
    ("publishers.0.topic", "a\x7f", r"publishers\[0\].topic: contains control characters "
                                    r"\(U\+007F\)"),
    ("measure_s", 10**7, r"measure_s: must be at most 3,600 s"),
    ("drain_s", 7200, r"drain_s: must be at most 3,600 s"),
    ("start_timeout_s", math.inf, r"start_timeout_s: must be at most 3,600 s"),
    ("connect_rate", 1e12, r"connect_rate: must be at most 100,000 connections/s"),
    ("publishers.0.payload_bytes", 268_400_000, r"publishers\[0\].payload_bytes: must be at "
                                                r"most 268,369,916 bytes"),
])
def test_the_driver_refuses_the_same_on_its_host(path, value, message):
    with pytest.raises(SpecError, match=f"^{message}"):
        parse_spec(changed(path, value, SPEC))


def test_one_driver_process_takes_no_more_clients_than_a_host_has_ports():
    many = [{"client_id": f"c{i}", "topics": ["t"]} for i in range(64_513)]
    with pytest.raises(SpecError, match=r"publishers/subscribers: must be at most 64,512 "
                                        r"connections per driver host \(each takes a local port"):
        parse_spec({**SPEC, "subscribers": many})


def test_a_stage_too_big_for_its_driver_hosts_is_refused_at_plan_and_placement():
    scenario = validate(Scenario, changed("subscribers.0.count", 70_000), "x.yml")
    stage = expand(scenario)[0]
    assert too_many_for_hosts(stage, 2) is None
    assert "70,002 clients over 1 driver hosts: must be at most 64,512" in too_many_for_hosts(
        stage, 1)
    with pytest.raises(ValueError, match=r"driver host d1: must be at most 64,512 connections"):
        place(stage, [("d1", 0), ("d1", 1)])
    assert len(place(stage, [("d1", 0), ("d2", 0)])) == 2


def test_perfpipe_plan_says_which_field_is_wrong_in_one_line(tmp_path, monkeypatch, capsys):
    from tasks.cli import main

    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "bad.yml").write_text(
        "name: bad\npublishers:\n  - {group: p, count: 2, topic: 't/{i}', "
        "rate_per_client: .inf}\n")
    (tmp_path / "suites.yml").write_text("suites:\n  s: [bad]\n")
    monkeypatch.setenv("PERFPIPE_SCENARIOS_DIR", str(tmp_path))
    assert main(["plan", "--suite", "s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"perfpipe: {tmp_path}/catalog/bad.yml: publishers.0: rate_per_client must "
                   f"be a finite number > 0 messages/s (per QoS if a mapping), got inf")


@pytest.mark.parametrize("work_root, message", [
    ("/../../etc", r"without '.', '..' or '//' parts"),
    ("/var/tmp/../../etc", r"without '.', '..' or '//' parts"),
    ("/var//tmp", r"without '.', '..' or '//' parts"),
    ("/etc", r"perfpipe creates and removes folders under it"),
    ("/etc/ssh", r"and /etc is the system's; give a folder of its own"),
    ("/usr/bin", r"and /usr is the system's"),
    ("/proc/self", r"and /proc is the system's"),
    ("/var/tmp/perfpipe", None),
    ("/usr/local/perfpipe", None),
])
def test_a_host_work_root_cannot_climb_out_or_be_a_system_folder(work_root, message):
    document = {"hosts": [{"name": "h", "roles": ["driver", "broker"], "work_root": work_root}],
                "broker": {"host": "h"}}
    if message is None:
        assert validate(Inventory, document, "inv.yml").hosts[0].work_root == work_root
        return
    with pytest.raises(ConfigError, match=f"inv.yml: hosts.0.work_root: .*{message}"):
        validate(Inventory, document, "inv.yml")


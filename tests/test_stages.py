from pathlib import Path

import pytest

from tasks.config_files import ConfigError
from tasks.scenarios import Scenario, load_suite
from tasks.stages import driver_slots, expand, expected_delivery_rate, place, receivers

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

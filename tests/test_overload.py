"""A deliberately overloaded broker: Mosquitto capped to a slice of one core with a cgroup
CPU quota that this test creates (and removes). The rated stages above its capacity must
turn invalid with the reason, and the max-rate search must land within 10% of the rate
where the broker stops keeping up: what it passed when offered more (QoS 1, so publisher
flow control bounds the broker's queues and its saturated throughput does not collapse)."""

from __future__ import annotations

import statistics
import uuid
from pathlib import Path

import pytest

from sql import Store
from tests.conftest import Broker

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1 here; v2 would be cpu.max
QUOTA_PCT = 5  # % of one core

SCENARIOS = """
name: overload_steps
source: "rated fan-in steps across a capped broker's capacity"
qos: [1]
publishers:
  - {group: pub, count: 10, topic: "perfpipe/overload/{scenario}", rate_per_client: RATE}
subscribers:
  - {group: sub, count: 1, topics: ["perfpipe/overload/{scenario}"]}
stages: {rate_pct: [50, 400], warmup_s: 1, measure_s: 3, cooldown_s: 1}
---
name: overload_search
source: "max-rate search on the same capped broker"
qos: [1]
publishers:
  - {group: pub, count: 10, topic: "perfpipe/overload/{scenario}", rate_per_client: START}
subscribers:
  - {group: sub, count: 1, topics: ["perfpipe/overload/{scenario}"]}
stages:
  warmup_s: 1
  measure_s: 3
  cooldown_s: 1
  search: {growth: 2.0, precision: 0.05, tolerance: 0.02, max_probes: 12}
"""


@pytest.fixture
def capped_broker(tmp_path: Path):
    if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        pytest.fail(f"no cgroup v1 CPU controller at {CPU_CGROUP}: adapt the test to cgroup v2")
    group = CPU_CGROUP / f"perfpipe-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    running = Broker(tmp_path)
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(QUOTA_PCT * 1000))
        (group / "cgroup.procs").write_text(str(running.process.pid))
        yield running
    finally:
        running.kill()
        group.rmdir()


def test_overloaded_broker_invalidates_high_stages_and_search_finds_its_capacity(
        capped_broker, tmp_path, monkeypatch, perfpipe_env):
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    scenarios = tmp_path / "scenarios"
    (scenarios / "catalog").mkdir(parents=True)
    steps, search = SCENARIOS.split("---")
    (scenarios / "catalog" / "overload_steps.yml").write_text(steps.replace("RATE", "200"))
    (scenarios / "catalog" / "overload_search.yml").write_text(search.replace("START", "100"))
    (scenarios / "suites.yml").write_text("suites: {overload: [overload_steps, overload_search]}\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "hosts: [{name: localhost, transport: local, roles: [driver], procs: 1}]\n"
        f"broker: {{kind: mosquitto, managed: false, address: 127.0.0.1, port: {capped_broker.port}}}\n")
    monkeypatch.setenv("PERFPIPE_SCENARIOS_DIR", str(scenarios))
    settings = load_settings()
    said = []
    outcome = run_pipeline(settings, suite="overload", inventory=inventory, say=said.append)
    print("\n".join(said))
    stages = {s["stage_id"]: s for s in Store(settings.database_url()).stages(outcome.run_id)}
    low, high = stages["overload_steps.q1.c100.r50"], stages["overload_steps.q1.c100.r400"]
    assert low["validity"] == "valid", low["reason"]
    assert high["validity"] == "invalid" and "of the target rate" in high["reason"], high["reason"]
    assert high["metrics"]["delivered_rate"] < 0.9 * high["metrics"]["target_rate"]
    # The capacity: what the capped broker passed whenever it was offered more than it could
    # take (the saturated rated stage and the search's failed probes); its median, since a
    # shared machine moves a CPU-capped broker's capacity by ~10% from stage to stage.
    saturated = [s["metrics"]["delivered_rate"] for s in stages.values()
                 if s["metrics"].get("target_rate")
                 and s["metrics"]["delivered_rate"] < 0.95 * s["metrics"]["target_rate"]]
    capacity = statistics.median(saturated)
    found = stages["overload_search.q1.c100.search"]
    assert found["validity"] == "valid", found["reason"]
    max_rate = found["metrics"]["max_rate"]
    print(f"capacity {capacity:.0f} msg/s (from {sorted(round(x) for x in saturated)}), "
          f"search max rate {max_rate:.0f} msg/s")
    assert abs(max_rate - capacity) <= 0.10 * capacity
    probes = [s for s in stages.values() if s["params"].get("probe_of")]
    assert len(probes) >= 3 and any(p["validity"] == "invalid" for p in probes)
    assert all(s["comparisons"] == [] for s in probes)  # probes are never compared

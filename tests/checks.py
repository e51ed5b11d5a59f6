"""Assertions shared by the end-to-end tests."""

from __future__ import annotations

from sql import Store


def assert_plausible(store: Store, run_id: str, count: int = 2) -> list[dict]:
    """The run's `count` stages of the tiny suite, each valid at its 500 msgs/s."""
    run = store.run(run_id)
    assert run["status"] == "ok", run
    assert run["finished_at"] is not None
    stages = store.stages(run_id)
    assert len(stages) == count
    for stage in stages:
        metrics = stage["metrics"]
        assert stage["validity"] == "valid", stage["reason"]
        assert metrics["target_rate"] == 500.0
        assert 0.9 < metrics["delivered_rate"] / 500.0 < 1.1  # messages really crossed the broker
        assert 0 < metrics["e2e_latency_p50"] <= metrics["e2e_latency_p99"] < 1_000_000
        assert metrics["errors"] == 0
        assert 0 < metrics["driver_cpu_max"] < 90  # the load generator was not the bottleneck
    return stages

"""Faults on the SSH lab hosts, for real.

- A host's network link taken down in the middle of a stage (`ip link set eth0 down` in
  its namespace): the run sees it within seconds, names the host, stops what it can
  reach, and closes `failed`; nothing waits without end.
- The driver bundle on a host cut short (an upload interrupted): provision replaces it.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tasks.hosts import SSH_DEAD_AFTER_S
from tests.lab import INVENTORY, STATE

# a lab run and a link left down for ~25 s
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("lab")]

SUITE = "suites: {linkdown: [{scenario: tiny_fanin, qos: [0], stages: {measure_s: 30}}]}\n"


def _lab_inventory_without_tuning(path: Path) -> Path:
    text = INVENTORY.read_text().replace("../../.state/lab/client_key",
                                         str(STATE / "client_key"))
    kept = [line for line in text.splitlines() if not line.startswith("tuning_")]
    path.write_text("\n".join(kept) + "\n")
    return path


def _take_down_when_measuring(state: Path, namespace: str, done: dict) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        for stage_file in state.glob("runs/*/raw/*/stage.json"):
            window = json.loads(stage_file.read_text())["windows"]
            if time.time() >= window["measure_start"] + 1:
                subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"],
                               check=True)
                done.update(at=time.monotonic(), run=stage_file.parents[2])
                return
        time.sleep(0.1)


def test_a_driver_hosts_link_down_mid_stage_fails_the_run_within_seconds(
        lab, tiny_suite: Path, tmp_path: Path, spark_connect):
    from sql import Store
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    (tiny_suite.parent / "scenarios" / "suites.yml").write_text(SUITE)
    inventory = _lab_inventory_without_tuning(tmp_path / "lab.yml")
    down: dict = {}
    cutter = threading.Thread(target=_take_down_when_measuring,
                              args=(tiny_suite, "pplab-driver1", down))
    cutter.start()
    lines: list[tuple[float, str]] = []
    try:
        outcome = run_pipeline(load_settings(), suite="linkdown", inventory=inventory,
                               say=lambda line: lines.append((time.monotonic(), line)))
    finally:
        cutter.join()
        subprocess.run(["ip", "-n", "pplab-driver1", "link", "set", "eth0", "up"], check=True)
    assert down, "the stage was never seen measuring"

    lost = "driver1: connection to root@10.250.77.12 lost"
    (failed_at,) = [at for at, line in lines if line.startswith("FAILED") and lost in line]
    assert failed_at - down["at"] <= SSH_DEAD_AFTER_S + 10, lines  # not the stage's 30 s
    run = Store(load_settings().database_url()).run(outcome.run_id)
    assert outcome.status == "failed" and run["status"] == "failed"
    assert run["excluded_reason"].startswith("run failed: stages, collect, ")  # the rest skipped
    assert "teardown: drivers on driver1 not stopped: driver1: " in run["excluded_reason"]
    broker = json.loads((down["run"] / "broker.json").read_text())
    assert broker["stopped"]  # broker1 was reachable: stopped
    said = [line for _, line in lines]
    assert any(line.startswith("teardown: drivers on driver1 not stopped") for line in said)


def test_a_driver_bundle_cut_short_on_a_host_is_replaced_by_provision(lab, tmp_path: Path):
    from tasks.catalog.inventory import connect, load_inventory
    from tasks.manifest import file_sha256
    from tasks.steps.provision import ship_driver

    inventory = load_inventory(_lab_inventory_without_tuning(tmp_path / "lab.yml"))
    host = connect(inventory, "driver2", work_root="/tmp")
    remote = ship_driver(host, tmp_path / "bundles")
    (local,) = (tmp_path / "bundles").glob("perfpipe-driver-*.zip")
    want = file_sha256(local)
    host.run(["truncate", "-s", "1000", remote])  # an upload cut short, left in place
    assert host.run(["sha256sum", remote]).stdout.split()[0] != want
    assert ship_driver(host, tmp_path / "bundles") == remote
    assert host.run(["sha256sum", remote]).stdout.split()[0] == want
    imported = host.run(["env", f"PYTHONPATH={remote}", host.python, "-c",
                         "import tasks.driver.output"], check=False)
    assert imported.ok, imported.stderr

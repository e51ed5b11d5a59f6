"""The whole pipeline over SSH on the lab: broker on broker1, drivers on driver1 and driver2."""

from __future__ import annotations

import json
from pathlib import Path

from sql import Store
from tests.lab import INVENTORY
from tests.checks import assert_plausible


def test_pipeline_runs_over_ssh_on_the_lab(lab, tiny_suite, tmp_path):
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings

    settings = load_settings()
    outcome = run_pipeline(settings, suite="tiny", inventory=INVENTORY, say=lambda _: None)
    assert outcome.status == "ok"
    store = Store(settings.database_url())
    stages = assert_plausible(store, outcome.run_id)
    assert all(s["metrics"]["broker_cpu_avg"] is not None for s in stages)  # sampled on broker1
    run_dir = settings.run_dir(outcome.run_id)
    for stage in stages:
        plan = json.loads((run_dir / "raw" / stage["stage_id"] / "stage.json").read_text())
        assert {p["host"] for p in plan["processes"]} == {"driver1", "driver2"}
        counts = []
        for proc in plan["processes"]:
            spec = json.loads((run_dir / "raw" / stage["stage_id"] / proc["host"] / str(proc["proc"])
                               / "summary.json").read_text())
            counts.append(spec["clients"]["publishers"] + spec["clients"]["subscribers"])
        assert max(counts) - min(counts) <= 1  # clients spread within one of even
    hosts = {p.stem: json.loads(p.read_text()) for p in (run_dir / "hosts").glob("*.json")}
    assert set(hosts) == {"broker1", "driver1", "driver2"}
    assert all(h["pythonpath"].startswith("/opt/perfpipe/perfpipe-driver-") for h in hosts.values())
    # one kernel clock behind every lab host: the NTP-style exchange must see (almost) no offset
    assert all(abs(h["clock_offset_s"]) < 0.001 and h["clock_trusted"] for h in hosts.values())
    tuning = json.loads((run_dir / "tuning" / "driver1.json").read_text())
    assert tuning["mode"] == "apply" and any(e["action"] == "applied" for e in tuning["entries"])
    assert not (Path(settings.state_dir) / "tuning" / "driver1.json").exists()  # restored

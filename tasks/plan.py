"""Step 1, plan: validate the suite and inventory, expand stages, create the run."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timezone
from pathlib import Path

from sql import Store

from .inventory import load_inventory
from .run_context import PLAN_FILE, RunContext
from .scenarios import load_suite
from .settings import Settings
from .stages import expand

RUN_KINDS = ("nightly", "release", "manual")


def new_run_id(kind: str, dag_run_id: str | None = None) -> str:
    """A readable, unique run id; the same Airflow DAG run always maps to the same id."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    if dag_run_id:
        digest = hashlib.sha256(dag_run_id.encode()).hexdigest()[:8]
        return f"{kind}-{digest}"
    return f"{kind}-{stamp}-{secrets.token_hex(2)}"


def plan_run(settings: Settings, *, suite: str | None = None, inventory: Path | None = None,
             kind: str = "manual", release_label: str | None = None,
             dag_run_id: str | None = None, options: dict | None = None) -> str:
    """Create the run directory, plan.json and the run row; returns the run id.

    `options` are the run's choices that later steps read from plan.json: the baseline to
    compare with ("rolling" or a pinned release label), the broker version expected
    (checked at the broker step), promote on success.
    """
    if kind not in RUN_KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {RUN_KINDS}")
    suite = suite or settings.suite
    inventory_path = Path(inventory or settings.inventory)
    scenarios = load_suite(settings.scenarios_dir, suite)
    inv = load_inventory(inventory_path)
    stages = [stage for scenario in scenarios for stage in expand(scenario)]
    run_id = new_run_id(kind, dag_run_id)
    run_dir = settings.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = {
        "run_id": run_id, "kind": kind, "suite": suite, "release_label": release_label,
        "dag_run_id": dag_run_id, "inventory_path": str(inventory_path),
        "inventory": inv.model_dump(mode="json"),
        "scenarios": [s.model_dump(mode="json") for s in scenarios],
        "stages": [stage.to_dict() for stage in stages],
        "options": dict(options or {}),
        "created_at": datetime.now(timezone.utc).isoformat(),
    }
    ctx = RunContext(settings, run_id, run_dir, plan)
    if not (run_dir / PLAN_FILE).exists():  # a retried task keeps the first plan
        ctx.write_json(PLAN_FILE, plan)
    store = Store(settings.database_url())
    store.migrate()
    store.create_run(run_id, kind=kind, suite=suite, broker_kind=inv.broker.kind,
                     artifact_dir=str(run_dir), release_label=release_label,
                     dag_run_id=dag_run_id)
    return run_id


def stage_table(settings: Settings, suite: str) -> list[dict]:
    """The stage table `perfpipe plan` prints: one row per stage with expected messages."""
    rows = []
    for scenario in load_suite(settings.scenarios_dir, suite):
        for stage in expand(scenario):
            rows.append({
                "stage": stage.stage_id, "qos": stage.qos, "pubs": stage.publishers,
                "subs": stage.subscribers, "target msg/s": round(stage.target_publish_rate, 1),
                "window s": stage.measure_s,
                "msgs in window": round(stage.target_publish_rate * stage.measure_s),
                "duration s": stage.duration_s,
            })
            if stage.search:  # the probes' rates are chosen while the run goes
                rows[-1]["target msg/s"] = f"search from {stage.target_publish_rate:g}"
                rows[-1]["duration s"] = (f"{stage.duration_s} per probe, at most "
                                          f"{stage.search['max_probes']} probes")
    return rows

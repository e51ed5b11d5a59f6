"""Step plan: validate the suite and inventory, expand stages, create the run.

`plan_run` creates the run folder, `plan.json` and the run row, and returns the run id that
every later step takes. A release trigger with `dry_run` stops after it (`close_dry_run`).
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
from datetime import datetime, timezone
from pathlib import Path

from sql import StoreError

from .. import rundir
from ..brokers import ADAPTERS, BrokerError
from ..brokers.tls import tls_listener
from ..catalog.inventory import Inventory, load_inventory
from ..catalog.placement import too_many_for_hosts
from ..catalog.scenarios import ConfigError, Scenario, load_suite
from ..catalog.stages import Stage, expand_all, stage_rows
from ..metrics import RUN_KINDS
from ..run_context import RunContext
from ..settings import Settings, load_settings
from ..views.tables import table


def new_run_id(kind: str, dag_run_id: str | None = None) -> str:
    """A readable, unique run id; the same Airflow DAG run always maps to the same id."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    if dag_run_id:
        digest = hashlib.sha256(dag_run_id.encode()).hexdigest()[:8]
        return f"{kind}-{digest}"
    return f"{kind}-{stamp}-{secrets.token_hex(2)}"


def suite_stages(settings: Settings, suite: str) -> list[Stage]:
    """Every stage of a suite, in run order."""
    return expand_all(load_suite(settings.scenarios_dir, suite))


def check_plan(settings: Settings, suite: str, inventory: Path
               ) -> tuple[list[Scenario], Inventory, list[Stage]]:
    """The suite's scenarios, the inventory and the stages a run of them would have, or a
    ConfigError naming the file and the field; reads no database and writes nothing."""
    scenarios = load_suite(settings.scenarios_dir, suite)
    inv = load_inventory(inventory)
    stages = expand_all(scenarios)
    for stage in stages:
        problem = too_many_for_hosts(stage, len(inv.driver_hosts()))
        if problem:
            raise ConfigError(f"{inventory}: hosts: {problem}")
    if inv.broker.managed:  # its TLS listener: said now, not after provision and tune
        try:
            tls_listener(stages, inv.broker.kind, ADAPTERS[inv.broker.kind].supports_tls)
        except BrokerError as exc:
            raise ConfigError(f"suite {suite!r}: {exc}") from None
    return scenarios, inv, stages


def release_choices(baseline: str | None, promote: bool, broker_version: str | None) -> dict:
    """plan.json's options from a release trigger's choices, the release DAG's Params and
    `perfpipe run`'s options alike: an empty value is none, as the DAG's empty Params are.
    Later steps read them: the baseline to compare with ("rolling" or a pinned release
    label), promote on success, the broker version expected (checked at the broker step)."""
    return {"baseline": baseline or None, "promote": bool(promote),
            "broker_version": broker_version or None}


def cli_option(choice: str) -> str:
    """A trigger choice (or the release label) as `perfpipe run` spells it."""
    return "--" + choice.replace("_", "-")


def choice_named(choice: str) -> str:
    """A trigger choice as an error names it: the release DAG's Param and `perfpipe run`'s
    option, since either may have given it."""
    return f"{choice} ({cli_option(choice)} of perfpipe run)"


def check_baseline(choice: str | None, pinned: list[dict], broker_kind: str) -> None:
    """A ConfigError, before the run is created, when the trigger names a release baseline
    that is not pinned for this broker kind: every stage would be compared with nothing
    after hours of load (`pinned`: `Store.release_baselines` of that kind)."""
    if not choice or choice == "rolling" or any(b["label"] == choice for b in pinned):
        return
    listed = ", ".join(repr(b["label"]) for b in pinned) or "none"
    raise ConfigError(f"{choice_named('baseline')}: no release {choice!r} is pinned for "
                      f"{broker_kind} (pinned: {listed}); give 'rolling' or one of those, or "
                      f"pin a run first: perfpipe baseline promote RUN_ID --label {choice}")


def plan_run(settings: Settings | None = None, *, suite: str | None = None,
             inventory: Path | str | None = None, kind: str = "manual",
             release_label: str | None = None, dag_run_id: str | None = None,
             options: dict | None = None) -> str:
    """Create the run directory, plan.json and the run row; returns the run id.

    `options` are the run's choices that later steps read from plan.json
    (`release_choices`).
    """
    settings = settings or load_settings()
    if kind not in RUN_KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {RUN_KINDS}")
    suite = suite or settings.suite
    inventory_path = Path(inventory or settings.inventory)
    scenarios, inv, stages = check_plan(settings, suite, inventory_path)
    run_id = new_run_id(kind, dag_run_id)
    run_dir = settings.run_dir(run_id)
    store = settings.store()
    store.migrate()  # the database is reached before anything is written (no orphan folder)
    check_baseline((options or {}).get("baseline"), store.release_baselines(inv.broker.kind),
                   inv.broker.kind)
    made_here = not run_dir.exists()
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
    if not (run_dir / rundir.PLAN).exists():  # a retried task keeps the first plan
        ctx.write_json(rundir.PLAN, plan)
    try:
        store.create_run(run_id, kind=kind, suite=suite, broker_kind=inv.broker.kind,
                         artifact_dir=str(run_dir), release_label=release_label,
                         dag_run_id=dag_run_id)
    except StoreError:
        if made_here:  # the database went away meanwhile: leave no folder without a run
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    ctx.mark_finished("plan")
    return run_id


def stage_table(run_id: str) -> str:
    """The run's planned stages as a text table."""
    return table(stage_rows(RunContext.load(load_settings(), run_id).stages))


def close_dry_run(run_id: str) -> str:
    """A dry run stops after planning: closed as excluded, so it never feeds a baseline."""
    RunContext.load(load_settings(), run_id).store().finish_run(
        run_id, "invalid", excluded=True, reason="dry run: planned, no load")
    return stage_table(run_id)


def goes_on(run_id: str, dry_run: bool) -> bool:
    """The release DAG's gate after planning: prints the stage table, and for a dry run
    closes it (`close_dry_run`) and says the pipeline stops here. A gate that fails closes
    the run failed before raising: no host was touched yet, and teardown, whose setup comes
    after the gate, never runs to close it."""
    try:
        if dry_run:
            print(close_dry_run(run_id))
            return False
        print(stage_table(run_id))
        return True
    except Exception as exc:
        load_settings().store().finish_run(
            run_id, "failed", excluded=True,
            reason=f"the release gate failed before any host was loaded: {type(exc).__name__}")
        raise

"""The whole run without Airflow: plan, then every step of `tasks.steps.STEPS` in order
(per-host steps once per host), and teardown whatever happened. The run holds its lab
from before its plan to its teardown, so another run's steps never come between its own
(its broker is up for it alone), and a run that cannot get the lab leaves no run behind.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import rundir
from .catalog.inventory import load_inventory
from .manage import promote_release, show_run
from .run_context import RunContext
from .settings import Settings
from .steps import STEPS, Call, execute, lab_lock
from .steps.plan import plan_run


@dataclass
class RunOutcome:
    run_id: str
    status: str
    report: str | None
    message: str | None
    warning: str | None = None  # the run ended well but Slack was not told


def run_pipeline(settings: Settings, *, suite: str | None = None, inventory: Path | None = None,
                 kind: str = "manual", release_label: str | None = None,
                 options: dict | None = None, say: Callable[[str], None] = print) -> RunOutcome:
    """Every step once, as the DAGs run them; `release_label` and `options` as the
    release DAG's trigger gives them (`plan_run`), and with options["promote"] the run is
    pinned as its label's baseline when it ends ok (the release DAG's `promote` task)."""
    lab = load_inventory(Path(inventory or settings.inventory)).name
    with lab_lock(settings, lab, {"run": f"a {kind} run", "suite": suite or settings.suite},
                  say):
        run_id = plan_run(settings, suite=suite, inventory=inventory, kind=kind,
                          release_label=release_label, options=options)
        say(f"run id: {run_id}  (files: {settings.run_dir(run_id)})")
        ctx = RunContext.load(settings, run_id)
        results: dict[str, object] = {}
        _run_steps(ctx, [h.name for h in ctx.inventory.hosts], results, say)
    closed = results["teardown"]
    if closed["stored"]:  # else teardown said why and how to store it later
        show_run(ctx.store(), run_id, say)
        if (options or {}).get("promote"):
            say(promote_release(run_id, release_label or "", settings=settings))
    alert = results.get("alert") or {}
    return RunOutcome(run_id, closed["status"], results.get("report"), alert.get("message"),
                      closed["warning"])


def _run_steps(ctx: RunContext, hosts: list[str], results: dict[str, object],
               say: Callable[[str], None]) -> None:
    try:
        for step in STEPS:
            if step.name == "plan" or step.always:
                continue
            for host in hosts if step.per_host else [None]:
                results[step.name] = result = execute(step.name, ctx, Call(host=host, say=say))
                # a step that returns a list said each item as it went: say how many
                said = f"{len(result)} done" if isinstance(result, list) else result
                say(f"{step.name}{' ' + host if host else ''}: {said}")
    except Exception as exc:  # the run is closed as failed below; the trace goes to a file
        trace = ctx.run_dir / rundir.ERROR_LOG
        try:
            trace.write_text(traceback.format_exc())
            where = f"full trace: {trace}"
        except OSError as why:  # e.g. the disk is full
            where = f"full trace not written: {why}"
        say(f"FAILED: {type(exc).__name__}: {exc}\n({where})")
    finally:
        for step in STEPS:
            if step.always:
                results[step.name] = execute(step.name, ctx, Call(say=say))
                say(f"{step.name}: {results[step.name]}")

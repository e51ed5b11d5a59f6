"""Step teardown (always runs): stop leftover drivers and the broker, restore tuning, and
close the run with its status.

The status comes from the steps that finished (`tasks.steps.STEPS`, each marked in the run
folder when it finished): a run in which any step before teardown did not finish, for
every host where it runs per host, or in which a driver process or the broker died
mid-stage, is `failed`; one whose stages were all invalid is `invalid`. Neither ever feeds a baseline.
"""

from __future__ import annotations

import json

from .. import rundir
from ..run_context import RunContext
from . import STEPS, Call
from .broker import stop_broker
from .load_metrics import stage_failures
from .tune import restore_run_tuning


def stop_drivers(ctx: RunContext) -> int:
    stopped = 0
    for path in sorted((ctx.run_dir / rundir.PROCESSES_DIR).glob("*.json")):
        for proc in json.loads(path.read_text())["processes"]:
            host = ctx.host(proc["host"])
            if host.alive(proc["group_pid"]):
                host.kill_group(proc["group_pid"])
                stopped += 1
    return stopped


def unfinished_steps(ctx: RunContext) -> list[str]:
    """The steps before teardown that did not finish (`step@host` for per-host steps)."""
    hosts = [h.name for h in ctx.inventory.hosts]
    missing = []
    for step in STEPS:
        if step.always:
            continue
        for host in hosts if step.per_host else [None]:
            if not ctx.finished(step.name, host):
                missing.append(step.name + (f"@{host}" if host else ""))
    return missing


def final_status(ctx: RunContext) -> tuple[str, str | None]:
    """(status, why it is not ok)."""
    unfinished = unfinished_steps(ctx)
    if unfinished:
        return "failed", f"run failed: {', '.join(unfinished)} did not finish"
    failed = [f"{stage_id}: {line}" for stage_id, lines in stage_failures(ctx).items()
              for line in lines]
    if failed:
        return "failed", f"run failed: {'; '.join(failed)}"
    stages = ctx.store().stages(ctx.run_id)
    if not stages:
        return "failed", "run failed: no stage was recorded"
    if all(s["validity"] != "valid" for s in stages):
        return "invalid", "run invalid: no stage was valid"
    return "ok", None


def run(ctx: RunContext, call: Call) -> dict:
    stopped = stop_drivers(ctx)
    broker = stop_broker(ctx)
    restored = restore_run_tuning(ctx)
    status, reason = final_status(ctx)
    ctx.store().finish_run(ctx.run_id, status, excluded=status != "ok", reason=reason)
    return {"status": status, "drivers_stopped": stopped, "broker": broker,
            "tuning_restored": restored}

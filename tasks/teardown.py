"""Step 11, teardown (always runs): stop leftover drivers and the broker, close the run.

A run whose steps failed is closed as `failed`, one whose stages were all invalid as
`invalid`; neither ever feeds a baseline.
"""

from __future__ import annotations

import json

from .alert import MESSAGE_FILE
from .broker import stop_broker
from .run_context import RunContext
from .tune import restore_run_tuning
from .workload import PROCESSES_DIR


def stop_drivers(ctx: RunContext) -> int:
    stopped = 0
    for path in sorted((ctx.run_dir / PROCESSES_DIR).glob("*.json")):
        for proc in json.loads(path.read_text())["processes"]:
            host = ctx.host(proc["host"])
            if host.alive(proc["group_pid"]):
                host.kill_group(proc["group_pid"])
                stopped += 1
    return stopped


def final_status(ctx: RunContext, failed: bool | None) -> str:
    """`failed=None`: infer it from the run directory (the alert step writes its message last)."""
    if failed is None:
        failed = not (ctx.run_dir / MESSAGE_FILE).exists()
    if failed:
        return "failed"
    stages = ctx.store().stages(ctx.run_id)
    if not stages:
        return "failed"
    if all(s["validity"] != "valid" for s in stages):
        return "invalid"
    return "ok"


def teardown(ctx: RunContext, *, failed: bool | None = None) -> dict:
    stopped = stop_drivers(ctx)
    broker = stop_broker(ctx)
    restored = restore_run_tuning(ctx)
    status = final_status(ctx, failed)
    ctx.store().finish_run(ctx.run_id, status, excluded=status != "ok",
                           reason=None if status == "ok" else f"run {status}")
    return {"status": status, "drivers_stopped": stopped, "broker": broker,
            "tuning_restored": restored}

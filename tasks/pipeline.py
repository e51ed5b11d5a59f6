"""The whole run without Airflow: the same step functions the DAG calls, in order.

plan -> provision (per host) -> tune (per host) -> broker -> stages -> collect ->
aggregate -> compare -> report -> alert, and teardown whatever happened.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .aggregate import aggregate
from .alert import alert
from .broker import start_broker
from .collect import collect
from .comparison import compare_run
from .plan import plan_run
from .provision import provision_host
from .report import write_report
from .run_context import RunContext
from .settings import Settings
from .summary import print_run
from .teardown import teardown
from .tune import tune_host
from .workload import run_stages

ERROR_FILE = "error.log"


@dataclass
class RunOutcome:
    run_id: str
    status: str
    report: str | None
    message: str | None


def execute(ctx: RunContext, say: Callable[[str], None]) -> tuple[str, dict]:
    """Every step after plan; returns the report path and the alert outcome."""
    for host in ctx.inventory.hosts:
        say(f"provision {host.name}: {provision_host(ctx, host.name)}")
        say(f"tune {host.name}: {tune_host(ctx, host.name)}")
    say(f"broker: {start_broker(ctx)}")
    run_stages(ctx, progress=say)
    say(f"collect: {collect(ctx)}")
    say(f"aggregate: {aggregate(ctx)}")
    say(f"compare: {compare_run(ctx)}")
    report = write_report(ctx)
    return report, alert(ctx, report)


def run_pipeline(settings: Settings, *, suite: str | None = None, inventory: Path | None = None,
                 kind: str = "manual", say: Callable[[str], None] = print) -> RunOutcome:
    run_id = plan_run(settings, suite=suite, inventory=inventory, kind=kind)
    say(f"run id: {run_id}  (files: {settings.run_dir(run_id)})")
    ctx = RunContext.load(settings, run_id)
    report, outcome, failed = None, {}, True
    try:
        report, outcome = execute(ctx, say)
        failed = False
    except Exception as exc:  # the run is closed as failed below; the trace goes to a file
        (ctx.run_dir / ERROR_FILE).write_text(traceback.format_exc())
        say(f"FAILED: {type(exc).__name__}: {exc}\n(full trace: {ctx.run_dir / ERROR_FILE})")
    finally:
        closed = teardown(ctx, failed=failed)
        say(f"teardown: {closed}")
    print_run(ctx.store(), run_id, say)
    return RunOutcome(run_id, closed["status"], report, outcome.get("message"))

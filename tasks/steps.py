"""Each pipeline step as one call taking a run id: what DAG tasks and `perfpipe step` call."""

from __future__ import annotations

from pathlib import Path

from .aggregate import aggregate
from .alert import alert
from .broker import start_broker
from .collect import collect
from .comparison import compare_run
from .plan import plan_run
from .provision import provision_host
from .report import REPORT_FILE, write_report
from .run_context import RunContext
from .settings import load_settings
from .teardown import teardown
from .tune import tune_host
from .workload import run_stages


def context(run_id: str) -> RunContext:
    return RunContext.load(load_settings(), run_id)


def plan_step(*, kind: str, suite: str | None, inventory: str | None,
              dag_run_id: str | None = None, release_label: str | None = None) -> str:
    return plan_run(load_settings(), suite=suite, inventory=Path(inventory) if inventory else None,
                    kind=kind, dag_run_id=dag_run_id, release_label=release_label)


def host_names(run_id: str) -> list[str]:
    return [h.name for h in context(run_id).inventory.hosts]


def run_step(name: str, run_id: str, *, host: str | None = None, failed: bool | None = None):
    ctx = context(run_id)
    per_host = {"provision": provision_host, "tune": tune_host}
    if name in per_host:
        if not host:
            raise ValueError(f"step {name!r} needs --host (one of {[h.name for h in ctx.inventory.hosts]})")
        return per_host[name](ctx, host)
    steps = {
        "broker": start_broker, "stages": run_stages, "collect": collect,
        "aggregate": aggregate, "compare": compare_run, "report": write_report,
        "alert": lambda c: alert(c, str(c.run_dir / REPORT_FILE)),
        "teardown": lambda c: teardown(c, failed=failed),
    }
    if name not in steps:
        raise ValueError(f"unknown step {name!r}; steps: plan (use `perfpipe run`), "
                         f"provision, tune, {', '.join(steps)}")
    return steps[name](ctx)

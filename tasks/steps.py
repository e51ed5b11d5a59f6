"""Each pipeline step as one call taking a run id: what DAG tasks and `perfpipe step` call."""

from __future__ import annotations

from pathlib import Path

from .aggregate import SPARK_JOB, aggregate, job_arguments, load_results
from .alert import alert
from .broker import start_broker
from .collect import collect
from .comparison import compare_run
from .plan import plan_run
from .provision import provision_host
from .report import REPORT_FILE, render_stored, write_report
from .run_context import RunContext
from .settings import load_settings
from .slack import notifier_for
from .teardown import teardown
from .tune import tune_host
from .workload import run_stage_by_id, run_stages


def context(run_id: str) -> RunContext:
    return RunContext.load(load_settings(), run_id)


def plan_step(*, kind: str, suite: str | None, inventory: str | None,
              dag_run_id: str | None = None, release_label: str | None = None,
              options: dict | None = None) -> str:
    return plan_run(load_settings(), suite=suite, inventory=Path(inventory) if inventory else None,
                    kind=kind, dag_run_id=dag_run_id, release_label=release_label,
                    options=options)


def host_names(run_id: str) -> list[str]:
    return [h.name for h in context(run_id).inventory.hosts]


def stage_ids(run_id: str) -> list[str]:
    return [stage.stage_id for stage in context(run_id).stages]


def stage_table(run_id: str) -> str:
    from .tables import table

    return table([{"stage": s.stage_id, "qos": s.qos, "pubs": s.publishers, "subs": s.subscribers,
                   "target msg/s": s.target_publish_rate, "duration s": s.duration_s}
                  for s in context(run_id).stages])


def close_dry_run(run_id: str) -> str:
    """A dry run stops after planning: closed as excluded, so it never feeds a baseline."""
    ctx = context(run_id)
    ctx.store().finish_run(run_id, "invalid", excluded=True, reason="dry run: planned, no load")
    return stage_table(run_id)


def run_stage(run_id: str, stage_id: str) -> dict:
    return run_stage_by_id(context(run_id), stage_id)


def spark_job(run_id: str) -> dict:
    """What the DAG's SparkSubmitOperator runs: the application and its arguments."""
    ctx = context(run_id)
    return {"application": str(SPARK_JOB), "application_args": job_arguments(ctx.run_dir)}


def load_metrics(run_id: str) -> dict:
    """After spark-submit: stage metrics and validity into the store."""
    rows = load_results(context(run_id))
    return {"stages": len(rows), "invalid": [r["stage_id"] for r in rows if r["validity"] != "valid"]}


def promote_release(run_id: str, label: str) -> str:
    """Pin a finished, valid run as the release baseline for `label`."""
    from sql import Store

    store = Store(load_settings().database_url())
    run = store.run(run_id)
    if run is None or run["status"] != "ok":
        raise ValueError(f"run {run_id} is {run and run['status']}: only a run that finished ok "
                         f"can become the {label!r} baseline")
    store.pin_release_baseline(label, run_id)
    return f"{run_id} is now the {label!r} release baseline"


def rerender_report(run_id: str, out: Path | None = None) -> str:
    """`perfpipe report RUN_ID`: the report of a stored run, from the results store."""
    from sql import Store

    settings = load_settings()
    run_dir = settings.run_dir(run_id)
    path = out or run_dir / REPORT_FILE
    html = render_stored(Store(settings.database_url()), run_id,
                         run_dir if run_dir.exists() else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html)
    return str(path)


def check_nightly() -> str:
    """The watchdog DAG's task: alert when no nightly ran recently."""
    from .watchdog import check_nightly as check

    return check(load_settings(), airflow=True)["text"]


def run_step(name: str, run_id: str, *, host: str | None = None, failed: bool | None = None,
             airflow: bool = False):
    """One step of a run; `airflow`: called from a DAG task (Slack from its Connection)."""
    ctx = context(run_id)
    per_host = {"provision": provision_host, "tune": tune_host}
    if name in per_host:
        if not host:
            raise ValueError(f"step {name!r} needs --host (one of {[h.name for h in ctx.inventory.hosts]})")
        return per_host[name](ctx, host)
    steps = {
        "broker": start_broker, "stages": run_stages, "collect": collect,
        "aggregate": aggregate, "compare": compare_run, "report": write_report,
        "alert": lambda c: alert(c, str(c.run_dir / REPORT_FILE),
                                 notifier_for(c.settings, airflow=airflow)),
        "teardown": lambda c: teardown(c, failed=failed),
    }
    if name not in steps:
        raise ValueError(f"unknown step {name!r}; steps: plan (use `perfpipe run`), "
                         f"provision, tune, {', '.join(steps)}")
    return steps[name](ctx)


ALERT_ACTIONS = {"ack": "acked", "accept": "accepted", "false_positive": "false_positive"}


def maintenance(action: str, *, run_id: str = "", label: str = "", alert_id: int = 0) -> str:
    """What the maintenance DAG does: promote a baseline or move an alert on."""
    if action == "promote":
        if not run_id or not label:
            raise ValueError("promote needs run_id and label")
        return promote_release(run_id, label)
    if action not in ALERT_ACTIONS:
        raise ValueError(f"action: {action!r} is not one of promote, {', '.join(ALERT_ACTIONS)}")
    if alert_id <= 0:
        raise ValueError(f"{action} needs alert_id (see `perfpipe alerts list`)")
    from sql import Store

    Store(load_settings().database_url()).set_alert_status(alert_id, ALERT_ACTIONS[action])
    return f"alert {alert_id} is now {ALERT_ACTIONS[action]}"

"""The task graph shared by the nightly and release DAGs: wiring only.

The tasks are the steps of `tasks.steps.STEPS` after plan (which each DAG makes with its
own parameters), in that order; each task body is one call into `tasks.steps` (a step
module is imported when the task runs, never at parse time). At parse time the DAGs read
one file: the suites file, for the choices of their `suite` Param (`suite_param`). Per-host steps are mapped
over the inventory's hosts. The stages run in one task, in plan order: the method ramps
load up from below the peak, and mapped task instances carry no order guarantee. Steps
that load the lab hosts or this machine hold the `perfpipe_lab` pool and the lab lock of
`tasks.steps`, which `perfpipe` runs take too, so two
runs never load them at once; steps safe to repeat retry with backoff, and a measurement
never retries (a repeated measurement would be a different measurement). `aggregate` runs the Spark job through the
Spark provider's operator (`tasks.airflow_glue.spark`), as a step.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, get_current_context, task

from tasks.airflow_glue.dag_runs import dag_run_key
from tasks.airflow_glue.spark import AggregateOperator
from tasks.steps import STEPS, Step

LAB_POOL = "perfpipe_lab"
RETRY = {"retries": 2, "retry_delay": timedelta(seconds=10), "retry_exponential_backoff": True}
TIMEOUTS = {"stages": timedelta(hours=6)}  # a backstop: each stage bounds itself from its plan


def on_failure(context) -> None:
    """on_failure_callback of every task: a short failure alert (tasks/notify/failure.py)."""
    from tasks.notify.failure import notify_failure

    notify_failure(context)


def _options(step: Step) -> dict:
    options = dict(RETRY) if step.retry else {"retries": 0}
    if step.lab:
        options["pool"] = LAB_POOL
    if step.name in TIMEOUTS:
        options["execution_timeout"] = TIMEOUTS[step.name]
    return options


def _step_task(step: Step):
    @task(task_id=step.name, doc_md=step.doc, **_options(step))
    def run(perf_run: str) -> str:
        from tasks.steps import Call, run_step

        return str(run_step(step.name, perf_run, Call(airflow=True)))

    return run


def _host_step_task(step: Step):
    @task(task_id=step.name, doc_md=f"{step.doc} (one task per host).",
          map_index_template="{{ host }}", **_options(step))
    def run(perf_run: str, host: str) -> str:
        from tasks.steps import Call, run_step

        return str(run_step(step.name, perf_run, Call(host=host, airflow=True)))

    return run


@task(doc_md="Host names of the run's inventory, to map the per-host steps over.", **RETRY)
def hosts(perf_run: str) -> list[str]:
    from tasks.run_context import RunContext
    from tasks.settings import load_settings

    return [h.name for h in RunContext.load(load_settings(), perf_run).inventory.hosts]


@task(doc_md="The Spark job of this run: application and arguments.")
def spark_job(perf_run: str) -> dict:
    from tasks.steps.aggregate import spark_job as job

    return job(perf_run)


def _spark_task(step: Step, perf_run):
    job = spark_job(perf_run)
    return AggregateOperator(
        task_id=step.name, doc_md=f"{step.doc} (connection spark_default).",
        application=job["application"], application_args=job["application_args"],
        conn_id="spark_default", conf=job["conf"],
        driver_memory="1g", name="perfpipe-aggregate", verbose=False, **_options(step))


def pipeline(perf_run):
    """plan's output -> every later step in order, teardown always; returns (the graph's
    first task: the host list the per-host steps map over; the teardown task).

    Teardown is an Airflow teardown whose setup is that first task: Airflow runs a teardown
    only when one of its setups succeeded, and the run exists (to close, with its hosts to
    stop and restore) from there on, whichever later step fails. With the broker step as
    its setup, a broker that did not start left the run open and the hosts tuned. The host
    list retries (it only reads the run's inventory), and the release DAG's gate before it
    closes the run itself when it fails (`tasks.steps.plan.goes_on`); with plan as a setup
    too, a dry run, which the gate skips everything after, queued teardown for the lab."""
    names = hosts(perf_run)
    chain, closed = [], None
    for step in STEPS:
        if step.name == "plan":
            continue
        if step.per_host:
            made = _host_step_task(step).partial(perf_run=perf_run).expand(host=names)
        elif step.name == "aggregate":
            made = _spark_task(step, perf_run)
        else:
            made = _step_task(step)(perf_run)
        if chain:
            chain[-1] >> made
        chain.append(made)
        closed = made if step.always else closed
    closed.as_teardown(setups=names)
    return names, closed


def dag_run_id() -> str:
    context = get_current_context()
    return dag_run_key(context["dag"].dag_id, context["run_id"])


def suite_param() -> Param:
    """The `suite` Param: one of the suites the pipeline can run, as the suites file of its
    scenarios dir (PERFPIPE_SCENARIOS_DIR) lists them when the DAG file is parsed; default
    PERFPIPE_SUITE. A suites file or a setting that cannot be read, or a PERFPIPE_SUITE that
    names no suite, leaves the Param free text: the plan task then says what is wrong,
    instead of the DAG vanishing or another suite running."""
    from tasks.catalog.scenarios import load_suites
    from tasks.settings import Settings, load_settings

    about = "a suite of the scenarios dir (PERFPIPE_SCENARIOS_DIR), as its suites.yml lists them"
    # any bad setting or file: free text, and the plan task names what is wrong (the DAG
    # must not vanish at parse time over it)
    try:
        settings = load_settings()
    except Exception:  # noqa: BLE001
        return Param(Settings.model_fields["suite"].default, type="string", description=about)
    try:
        names = sorted(load_suites(settings.scenarios_dir).suites)
    except Exception:  # noqa: BLE001
        names = []
    if settings.suite not in names:  # a PERFPIPE_SUITE no suite has: no other suite runs
        return Param(settings.suite, type="string", description=about)
    return Param(settings.suite, type="string", enum=names, description=about)

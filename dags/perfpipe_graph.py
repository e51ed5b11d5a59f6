"""The task graph shared by the nightly and release DAGs: wiring only.

Each task body is one call into `tasks.steps` (imported when the task runs, never at
parse time). Provisioning and tuning are mapped over hosts. The stages run in one task,
in plan order: the method ramps load up from below the peak, and mapped task instances
carry no order guarantee. Tasks that load the hosts hold the `perfpipe_lab` pool so two
runs never load the lab hosts at once; provisioning and collection retry with backoff,
measurement never retries (a repeated measurement would be a different measurement).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import get_current_context, task

SPARK_JOB = str(Path(__file__).resolve().parent.parent / "spark" / "aggregate.py")
LAB_POOL = "perfpipe_lab"
RETRY = {"retries": 2, "retry_delay": timedelta(seconds=10), "retry_exponential_backoff": True}
STAGE_TIMEOUT = timedelta(hours=6)  # a backstop: each stage bounds itself from its plan


def on_failure(context) -> None:
    """on_failure_callback of every task: a short failure alert (tasks/failure.py)."""
    from tasks.failure import notify_failure

    notify_failure(context)


def _step(name: str, doc: str, **kwargs):
    @task(task_id=name, doc_md=doc, **kwargs)
    def step(perf_run: str) -> str:
        from tasks.steps import run_step

        return str(run_step(name, perf_run, airflow=True))

    return step


@task(doc_md="Host names of the run's inventory, to map provision and tune over.")
def hosts(perf_run: str) -> list[str]:
    from tasks.steps import host_names

    return host_names(perf_run)


@task(doc_md="Check one host, ship the driver, record its fingerprint.",
      map_index_template="{{ host }}", **RETRY)
def provision(perf_run: str, host: str) -> dict:
    from tasks.steps import run_step

    return run_step("provision", perf_run, host=host)


@task(doc_md="Apply or check the tuning profile on one host; read back and record it.",
      map_index_template="{{ host }}", **RETRY)
def tune(perf_run: str, host: str) -> dict:
    from tasks.steps import run_step

    return run_step("tune", perf_run, host=host)


@task(doc_md="The Spark job's arguments for this run's folder.")
def spark_args(perf_run: str) -> list[str]:
    from tasks.steps import spark_job

    return spark_job(perf_run)["application_args"]


@task(doc_md="Load the Spark job's per-stage metrics and validity into SQL.")
def load_metrics(perf_run: str) -> dict:
    from tasks.steps import load_metrics as load

    return load(perf_run)


def pipeline(perf_run, spark_application: str = SPARK_JOB):
    """plan's output -> every step, teardown always; returns (first, last, teardown) tasks."""
    names = hosts(perf_run)
    provisioned = provision.partial(perf_run=perf_run).expand(host=names)
    tuned = tune.partial(perf_run=perf_run).expand(host=names)
    broker = _step("broker", "Start the broker under test and health-check it.",
                   pool=LAB_POOL)(perf_run)
    measured = _step("stages", "Every stage in plan order: drivers, barrier, common start, "
                     "warm-up, measure window. Never retried.", retries=0, pool=LAB_POOL,
                     execution_timeout=STAGE_TIMEOUT)(perf_run)
    collected = _step("collect", "Fetch raw driver files with checksums.", **RETRY)(perf_run)
    aggregated = SparkSubmitOperator(
        task_id="aggregate", doc_md="spark-submit spark/aggregate.py (connection spark_default).",
        application=spark_application, application_args=spark_args(perf_run),
        conn_id="spark_default", conf={"spark.ui.enabled": "false"},
        driver_memory="1g", name="perfpipe-aggregate", verbose=False)
    loaded = load_metrics(perf_run)
    compared = _step("compare", "Verdicts per stage and metric against history.")(perf_run)
    reported = _step("report", "Write the HTML report.")(perf_run)
    alerted = _step("alert", "Slack: new regressions, thread replies for known ones, a release "
                    "summary (Connection `perfpipe_slack`, else PERFPIPE_SLACK_TOKEN, else a "
                    "file in the run folder).")(perf_run)
    closed = _step("teardown", "Stop drivers and broker, restore tuning, close the run.",
                   pool=LAB_POOL)(perf_run)

    provisioned >> tuned >> broker >> measured >> collected >> aggregated
    aggregated >> loaded >> compared >> reported >> alerted >> closed
    closed.as_teardown(setups=broker)
    return names, closed


def dag_run_id() -> str:
    context = get_current_context()
    return f"{context['dag'].dag_id}/{context['run_id']}"

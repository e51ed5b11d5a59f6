"""Nightly MQTT broker performance run, at 02:00.

plan, then the steps of `tasks.steps.STEPS` in order (provision and tune per host, the
stages in one task, aggregate through spark-submit), with teardown (stop drivers and
broker, restore tuning, close the run) running whatever happens. Failures are alerted.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task
from tasks.airflow_glue.dag_runs import NIGHTLY_DAG
from perfpipe_graph import dag_run_id, on_failure, pipeline, suite_param

with DAG(
    dag_id=NIGHTLY_DAG,
    description="Nightly MQTT broker performance regression run",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    is_paused_upon_creation=False,  # scheduled: runs once deployed, no unpausing by hand
    max_active_runs=1,
    tags=["perfpipe", "mqtt", "nightly"],
    default_args={"owner": "perf-team", "retries": 0, "on_failure_callback": on_failure},
    params={
        "suite": suite_param(),
        "inventory": Param(None, type=["null", "string"],
                           description="inventory YAML path; empty: PERFPIPE_INVENTORY or the local default"),
    },
    doc_md=__doc__,
) as dag:

    @task(doc_md="Validate suite and inventory, expand stages, create the run row.")
    def plan(params: dict | None = None) -> str:
        from tasks.steps.plan import plan_run

        return plan_run(kind="nightly", suite=params["suite"],
                        inventory=params["inventory"] or None, dag_run_id=dag_run_id())

    pipeline(plan())

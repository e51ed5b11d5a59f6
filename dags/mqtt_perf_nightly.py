"""Nightly MQTT broker performance run: wiring only, every task is one call into `tasks`.

plan -> provision[host] -> tune[host] -> broker -> stages -> collect -> aggregate ->
compare -> report -> alert, with teardown (stop drivers and broker, close the run)
running whatever happens.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

with DAG(
    dag_id="mqtt_perf_nightly",
    description="Nightly MQTT broker performance regression run",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["perfpipe", "mqtt", "nightly"],
    default_args={"owner": "perf-team", "retries": 0},
    params={
        "suite": Param("smoke", type="string", description="suite from scenarios/suites.yml"),
        "inventory": Param("", type="string",
                           description="inventory YAML path; empty: PERFPIPE_INVENTORY or the local default"),
    },
    doc_md=__doc__,
) as dag:

    @task(doc_md="Validate suite and inventory, expand stages, create the run row.")
    def plan() -> str:
        from tasks.steps import plan_step

        context = get_current_context()
        params = context["params"]
        return plan_step(kind="nightly", suite=params["suite"], inventory=params["inventory"] or None,
                         dag_run_id=f"{context['dag'].dag_id}/{context['run_id']}")

    @task(doc_md="Host names of the run's inventory, to map provision and tune over.")
    def hosts(perf_run: str) -> list[str]:
        from tasks.steps import host_names

        return host_names(perf_run)

    @task(doc_md="Check one host and record its fingerprint.", retries=2)
    def provision(perf_run: str, host: str) -> dict:
        from tasks.steps import run_step

        return run_step("provision", perf_run, host=host)

    @task(doc_md="Read the tuning profile back on one host and record it.", retries=2)
    def tune(perf_run: str, host: str) -> dict:
        from tasks.steps import run_step

        return run_step("tune", perf_run, host=host)

    def step_task(name: str, doc: str, **kwargs):
        @task(task_id=name, doc_md=doc, **kwargs)
        def step(perf_run: str) -> str:
            from tasks.steps import run_step

            return str(run_step(name, perf_run))

        return step

    perf_run = plan()  # the perfpipe run id (Airflow's own run_id is a context name)
    names = hosts(perf_run)
    provisioned = provision.partial(perf_run=perf_run).expand(host=names)
    tuned = tune.partial(perf_run=perf_run).expand(host=names)
    broker = step_task("broker", "Start the broker under test and health-check it.")(perf_run)
    stages = step_task("stages", "Run every stage: barrier, common start, measure window.")(perf_run)
    collected = step_task("collect", "Fetch raw driver files with checksums.", retries=2)(perf_run)
    aggregated = step_task("aggregate", "spark-submit the aggregation, load metrics to SQL.")(perf_run)
    compared = step_task("compare", "Verdicts per stage and metric against history.")(perf_run)
    reported = step_task("report", "Write the HTML report.")(perf_run)
    alerted = step_task("alert", "Slack message (to a file without a token).")(perf_run)
    closed = step_task("teardown", "Stop drivers and broker, close the run.")(perf_run)

    provisioned >> tuned >> broker >> stages >> collected >> aggregated >> compared
    compared >> reported >> alerted >> closed
    closed.as_teardown(setups=broker)

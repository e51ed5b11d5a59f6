"""Release run, triggered by hand with its parameters.

Same pipeline as the nightly run. The run carries a release label and the broker version
it must find (checked when the broker starts), compares against the rolling history or a
pinned release baseline, and with `promote` pins itself as the label's baseline when it
finished ok. `dry_run` only plans: it prints the stage table and loads no host.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task
from perfpipe_graph import dag_run_id, on_failure, pipeline, suite_param

from tasks.metrics import RELEASE_LABEL

with DAG(
    dag_id="mqtt_perf_release",
    description="Release MQTT broker performance run (manual trigger)",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["perfpipe", "mqtt", "release"],
    default_args={"owner": "perf-team", "retries": 0, "on_failure_callback": on_failure},
    params={
        "release_label": Param("", type="string", pattern=RELEASE_LABEL,
                               description="the release this run measures, e.g. 9.4.5"),
        "broker_version": Param(None, type=["null", "string"],
                                description="version the broker must report; empty: not checked"),
        "suite": suite_param(),
        "inventory": Param(None, type=["null", "string"],
                           description="inventory YAML; empty: the default"),
        "baseline": Param(None, type=["null", "string"],
                          description="compare with 'rolling' history or a release label "
                          "pinned for this broker kind (refused at plan otherwise); empty: "
                          "its release pinned most recently (rolling if none)"),
        "promote": Param(False, type="boolean",
                         description="pin this run as the label's baseline when it finishes ok"),
        "dry_run": Param(False, type="boolean",
                         description="plan only: print the stages, load no host"),
    },
    doc_md=__doc__,
) as dag:

    @task(doc_md="Validate parameters, suite and inventory; expand stages; create the run row.")
    def plan(params: dict | None = None) -> str:
        from tasks.steps.plan import plan_run, release_choices

        options = release_choices(params["baseline"], params["promote"],
                                  params["broker_version"])
        return plan_run(kind="release", suite=params["suite"],
                        inventory=params["inventory"] or None, dag_run_id=dag_run_id(),
                        release_label=params["release_label"], options=options)

    @task.short_circuit(doc_md="Dry run: print the stage table and stop here.",
                        ignore_downstream_trigger_rules=True)
    def load_hosts(perf_run: str, params: dict | None = None) -> bool:
        from tasks.steps.plan import goes_on

        return goes_on(perf_run, params["dry_run"])

    @task(doc_md="Pin this run as the release baseline of its label (when asked and ok).")
    def promote(perf_run: str, params: dict | None = None) -> str:
        from tasks.manage import promote_release

        return promote_release(perf_run, params["release_label"], params["promote"])

    perf_run = plan()
    gate = load_hosts(perf_run)
    first, closed = pipeline(perf_run)
    gate >> first
    closed >> promote(perf_run)

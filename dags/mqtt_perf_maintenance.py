"""Baseline and alert maintenance, triggered by hand after a person decided.

- promote: pin a finished run as the release baseline of a label;
- ack / accept / false-positive / fixed (`tasks.metrics.ALERT_ACTIONS`, as the CLI's
  `perfpipe alerts ACTION`): move an alert through its lifecycle ("accept" takes the
  change as the new normal, which restarts its metric's rolling history from that run); `together`
  also acts on the alerts the run's stages flagged with it (one change on every stage).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from tasks.metrics import ALERT_ACTIONS

with DAG(
    dag_id="mqtt_perf_maintenance",
    description="Promote a baseline or act on an alert",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["perfpipe", "mqtt", "maintenance"],
    default_args={"owner": "perf-team", "retries": 0},
    params={
        "action": Param("promote", enum=["promote", *ALERT_ACTIONS], description="what to do"),
        "run_id": Param("", type="string", description="promote: the perfpipe run id"),
        "label": Param("", type="string", description="promote: the release label"),
        "alert_id": Param(0, type="integer", minimum=0,
                          description=f"{'/'.join(ALERT_ACTIONS)}: the alert (perfpipe alerts list)"),
        "together": Param(False, type="boolean",
                          description="and the alerts the run's stages flagged with it"),
    },
    doc_md=__doc__,
) as dag:

    @task(doc_md="Carry out the chosen action and say what changed.")
    def maintain(params: dict | None = None) -> str:
        from tasks.manage import maintenance

        return maintenance(params["action"], run_id=params["run_id"], label=params["label"],
                           alert_id=params["alert_id"], together=params["together"])

    maintain()

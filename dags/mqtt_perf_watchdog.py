"""Morning watchdog: say so in Slack when no nightly run started in the last 26 hours
(PERFPIPE_NIGHTLY_MAX_AGE_H). A nightly that silently did not run would otherwise look
like a quiet night.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

with DAG(
    dag_id="mqtt_perf_watchdog",
    description="Alert when the nightly MQTT performance run did not run",
    schedule="0 8 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    is_paused_upon_creation=False,  # scheduled: runs once deployed, no unpausing by hand
    max_active_runs=1,
    tags=["perfpipe", "mqtt", "watchdog"],
    default_args={"owner": "perf-team", "retries": 1},
    doc_md=__doc__,
) as dag:

    @task(doc_md="Look up the latest nightly run in the results store; alert when it is too old.")
    def check_nightly() -> str:
        from tasks.notify.watchdog import check_nightly as check

        return check(airflow=True)["text"]

    check_nightly()

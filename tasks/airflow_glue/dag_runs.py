"""How a perfpipe run names the Airflow DAG run that made it (the run row's `dag_run_id`),
in one place: the DAGs write it, `perfpipe nightly` finds its run by it, and Slack links
back to the Airflow run from it. Pure: names only, no Airflow import."""

from __future__ import annotations

NIGHTLY_DAG = "mqtt_perf_nightly"


def dag_run_key(dag_id: str, airflow_run_id: str) -> str:
    return f"{dag_id}/{airflow_run_id}"


def split_dag_run_key(key: str | None) -> tuple[str, str] | None:
    """(dag id, Airflow run id) of a `dag_run_key`; None for a run not made by a DAG."""
    if not key or "/" not in key:
        return None
    dag_id, airflow_run_id = key.split("/", 1)
    return dag_id, airflow_run_id

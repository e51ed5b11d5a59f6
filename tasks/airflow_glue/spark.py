"""The aggregate step under Airflow: the Spark provider's operator, run as every other step
runs (`tasks.steps.as_step`)."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class AggregateOperator(SparkSubmitOperator):
    """spark-submit of the run's Spark job, refused over a closed run (it would rewrite the
    metrics its status and verdicts were decided on) and inside the lab lock (a CLI run's
    measure window never shares the machine with it), then marked finished."""

    def execute(self, context: Any) -> Any:
        from tasks.steps import Call, as_step, context_of

        ctx = context_of(context["ti"].xcom_pull(task_ids="plan"))
        with as_step(self.task_id, ctx, Call(airflow=True)):
            return super().execute(context)

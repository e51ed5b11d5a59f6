"""The aggregate step under Airflow: the Spark provider's operator, run as every other step
runs (`tasks.steps.as_step`), spark-submit started with perfpipe's child environment."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class ChildEnvSubmitHook(SparkSubmitHook):
    """The provider's hook, but spark-submit gets the worker's environment without its
    secrets (`tasks.child_env`): the hook hands it a copy of every variable, the results
    DB's Connection and the Slack token among them. Variables given to the operator
    (`env_vars`) are added, as the hook adds them."""

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        from tasks.child_env import child_env

        kwargs["env"] = child_env(**{k: str(v) for k, v in (self._env_vars or {}).items()})
        return super().submit(application, **kwargs)

    def _build_spark_submit_command(self, application: str) -> list[str]:
        command = super()._build_spark_submit_command(application)
        self._env = None  # the hook would start spark-submit with os.environ and these
        return command


class AggregateOperator(SparkSubmitOperator):
    """spark-submit of the run's Spark job, refused over a closed run (it would rewrite the
    metrics its status and verdicts were decided on) and inside the lab lock (a CLI run's
    measure window never shares the machine with it), then marked finished."""

    def execute(self, context: Any) -> Any:
        from tasks.steps import Call, as_step, context_of

        ctx = context_of(context["ti"].xcom_pull(task_ids="plan"))
        with as_step(self.task_id, ctx, Call(airflow=True)):
            return super().execute(context)

    def _get_hook(self) -> SparkSubmitHook:
        hook = super()._get_hook()  # the provider's hook with every setting the operator has
        hook.__class__ = ChildEnvSubmitHook  # ... and spark-submit started without secrets
        return hook

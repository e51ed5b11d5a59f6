"""The aggregate step under Airflow: the Spark provider's operator, run as every other step
runs (`tasks.steps.as_step`), spark-submit started with perfpipe's child environment."""

from __future__ import annotations

import threading
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


class ChildEnvSubmitHook(SparkSubmitHook):
    """The provider's hook for perfpipe's job (local or standalone, client mode), with two
    changes. spark-submit gets the worker's environment without its secrets
    (`tasks.child_env`; the hook hands it a copy of every variable, the results DB's
    Connection and the Slack token among them), plus the operator's `env_vars`; and it is
    killed after `AGGREGATE_TIMEOUT_S`, the CLI's bound (a standalone master with no free
    worker would hold the lab for ever; a task timeout would count the lab lock's wait
    too). Not for YARN or Kubernetes: their credentials look like secrets and are dropped."""

    timed_out = False

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        from tasks.child_env import child_env
        from tasks.steps import AGGREGATE_TIMEOUT_S

        kwargs["env"] = child_env(**{k: str(v) for k, v in (self._env_vars or {}).items()})
        timer = threading.Timer(AGGREGATE_TIMEOUT_S, self._time_out)
        timer.start()
        try:
            return super().submit(application, **kwargs)
        except Exception as exc:
            if self.timed_out:
                raise RuntimeError(f"spark-submit killed after {AGGREGATE_TIMEOUT_S} s") from exc
            raise
        finally:
            timer.cancel()

    def _time_out(self) -> None:
        process = getattr(self, "_submit_sp", None)
        if process is not None and process.poll() is None:
            self.timed_out = True
            process.kill()

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

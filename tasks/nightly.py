"""`perfpipe nightly` (what `make run` does): the nightly DAG once through Airflow's
dag.test() in this process, quietly. On the terminal: a line per step as it ends (the
stages' progress lines between them), a short summary and the Airflow run's state;
Airflow's own log lines (about 200 a run) go to a file under its log folder, named at the
end. A failure is one line on stderr with where the full log is."""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from .airflow_glue.dag_runs import NIGHTLY_DAG, dag_run_key
from .airflow_glue.dag_test import TaskEnd, airflow_log_path, dags_folder_problem, test_dag
from .config_files import ConfigError
from .metrics import exit_code
from .settings import Settings

def run_nightly(settings: Settings, suite: str) -> int:
    """Run the nightly DAG once; returns the exit code `perfpipe nightly` documents."""
    from . import rundir
    from .notify.failure import latest_message
    from .steps.plan import check_plan
    from .views.summary import short_summary

    # a suite or inventory no run can use, an Airflow home without these DAGs: one line
    # before Airflow starts, not a task trace
    check_plan(settings, suite, Path(settings.inventory))
    if problem := dags_folder_problem(NIGHTLY_DAG):
        raise ConfigError(problem)
    log = airflow_log_path(NIGHTLY_DAG)
    steps = StepLines()
    started = time.time()
    try:
        airflow_run_id, state = test_dag(NIGHTLY_DAG, {"suite": suite}, log_path=log,
                                         on_task_end=steps.tell)
    except Exception as exc:  # Airflow itself failed (its metadata DB, say): the trace to its log
        with log.open("a") as trace:
            traceback.print_exc(file=trace)
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"perfpipe: Airflow could not run {NIGHTLY_DAG}: {type(exc).__name__}: {first} "
              f"(the trace is in Airflow's log: {log})", file=sys.stderr)
        return 1
    where = f"Airflow run {airflow_run_id}: {state}; Airflow's log: {log}"
    failed_plan = latest_message(settings.state_dir / rundir.FAILURES_DIR, "plan", started)
    if failed_plan is not None:  # no run was planned: say why, not what the store lacks
        print(f"perfpipe: {failed_plan['text']} ({where})", file=sys.stderr)
        return 1
    store = settings.store()
    run = store.run(nightly_run_id(airflow_run_id))
    if run is None:
        print(f"perfpipe: Airflow run {airflow_run_id} ended {state} before perfpipe planned "
              f"a run (Airflow's log: {log})", file=sys.stderr)
        return 1
    run_dir = Path(run["artifact_dir"])
    print(short_summary(run, store.stages(run["run_id"]),
                        {"report": run_dir / rundir.REPORT,
                         "slack message": run_dir / rundir.SLACK_MESSAGE}))
    print(f"Airflow run {airflow_run_id}: {state} (Airflow's log: {log})")
    if state != "success":
        print(f"perfpipe: {steps.failure or 'the run did not succeed'} ({where})",
              file=sys.stderr)
    return exit_code(run["status"], run["warning"], airflow_state=state)


def nightly_run_id(airflow_run_id: str) -> str:
    """The perfpipe run id the nightly DAG's plan task gives the Airflow run."""
    from .steps.plan import new_run_id

    return new_run_id("nightly", dag_run_key(NIGHTLY_DAG, airflow_run_id))


class StepLines:
    """Told of each task of the nightly DAG as it ends: a line per pipeline step (a helper
    task only when it did not succeed), and the first failure, said the way the failure
    alert says it."""

    def __init__(self) -> None:
        self.failure: str | None = None

    def tell(self, end: TaskEnd) -> None:
        from .notify.messages import failure_message
        from .steps import BY_NAME

        if end.state == "failed" and self.failure is None:
            self.failure = failure_message(dag_id=end.dag_id, task_id=end.task_id,
                                           item=end.item, error=end.error or "failed",
                                           log_url=None, run_id=None)["text"]
        if end.task_id not in BY_NAME and end.state in ("success", "skipped"):
            return
        name = f"{end.task_id}@{end.item}" if end.item else end.task_id
        line = f"{name:<20} {end.state:<8} {end.seconds:6.1f} s"
        if end.task_id == "plan" and end.state == "success":
            line += f"  run id: {nightly_run_id(end.run_id)}"
        print(line, flush=True)

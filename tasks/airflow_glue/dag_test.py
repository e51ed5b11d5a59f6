"""Run a DAG of dags/ once through Airflow's own `dag.test()` (what `make run` does).

`perfpipe nightly` wants Airflow's own log lines (about 200 a run: the in-process API
server, the task runner, the DAG loop) in a file and a line per task on the terminal:
`test_dag(..., log_path=..., on_task_end=...)`. What a task prints (the stages' progress
lines) still reaches the terminal: `dag.test()` runs tasks in this process.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..settings import REPO_ROOT

DAGS_DIR = REPO_ROOT / "dags"
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Airflow colours its console lines on a terminal


@dataclass(frozen=True)
class TaskEnd:
    """A task instance that ran and finished (tasks never started, e.g. upstream_failed,
    are not reported)."""

    dag_id: str
    run_id: str  # the Airflow run's
    task_id: str
    item: str | None  # a mapped task's item (its rendered map index, e.g. the host)
    state: str  # success, failed, skipped, up_for_retry
    seconds: float
    error: str | None  # what a failed task raised


def load_dag(dag_id: str, dags_dir: Path = DAGS_DIR):
    """Import dags/<dag_id>.py and return its DAG object."""
    if str(dags_dir) not in sys.path:  # as Airflow does: DAG files import their neighbours
        sys.path.insert(0, str(dags_dir))
    path = Path(dags_dir) / f"{dag_id}.py"
    spec = importlib.util.spec_from_file_location(f"perfpipe_dag_{dag_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def dags_folder_problem(dag_id: str, dags_dir: Path = DAGS_DIR) -> str | None:
    """Why `dag.test()` cannot run dags/<dag_id>.py from this Airflow home, or None.
    dag.test() runs the DAG as the home's configured DAG bundles serialize it: bundles
    without this checkout's file end in "the dag is not serialized". A local bundle that
    holds the file (the dags folder itself, or a link to it or to dags/) will do; with a
    bundle that is not a local folder (git), it cannot be told here, and dag.test() tries.
    The home is never changed (a bundle synced with perfpipe's DAGs alone would drop its
    other DAGs)."""
    from airflow.configuration import conf

    target = (dags_dir / f"{dag_id}.py").resolve()
    folder = Path(conf.get("core", "dags_folder")).expanduser()
    # [dag_processor] dag_bundle_config_list, read as Airflow's bundle manager reads it
    # (the manager itself logs to stdout); a local bundle without a path is the dags folder
    for bundle in conf.getjson("dag_processor", "dag_bundle_config_list") or []:
        if not str(bundle.get("classpath", "")).endswith(".LocalDagBundle"):
            return None
        path = (bundle.get("kwargs") or {}).get("path") or folder
        for root, _dirs, files in os.walk(path, followlinks=True):
            if target.name in files and (Path(root) / target.name).resolve() == target:
                return None
    return (f"Airflow's dags folder {folder} does not hold {target}, so dag.test() cannot "
            f"run {dag_id}: set AIRFLOW__CORE__DAGS_FOLDER={dags_dir} (as `make run` does) "
            f"or link {dags_dir} into it")


def airflow_log_path(dag_id: str) -> Path:
    """Where a `perfpipe nightly` run's Airflow log goes: Airflow's own log folder
    ([logging] base_log_folder, `$AIRFLOW_HOME/logs`), `dag_test/<dag id>/<UTC time>.log`."""
    from airflow.configuration import conf

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")
    folder = Path(conf.get("logging", "base_log_folder")).expanduser()
    return folder / "dag_test" / dag_id / f"{stamp}.log"


def test_dag(dag_id: str, conf: dict | None = None, *, log_path: Path | None = None,
             on_task_end: Callable[[TaskEnd], None] | None = None,
             dags_dir: Path = DAGS_DIR) -> tuple[str, str]:
    """Run the DAG once in this process; returns (Airflow run id, its final state).
    With `log_path`, Airflow's own log lines go to that file, not the terminal;
    `on_task_end` is told of each task as it finishes."""
    with _logs_to(log_path), _task_listener(on_task_end):
        dag = load_dag(dag_id, dags_dir)
        dag_run = dag.test(run_conf=conf or {})
    return dag_run.run_id, str(dag_run.state)


class _LogFile:
    """The file Airflow's log lines go to, without terminal colours. A line logged after
    the run (a logger bound during it) is appended too: nothing is ever left writing to a
    closed stream."""

    encoding = "utf-8"

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding=self.encoding)

    def write(self, text: str) -> int:
        if self._file.closed:
            with self.path.open("a", encoding=self.encoding) as late:
                return late.write(ANSI.sub("", text))
        return self._file.write(ANSI.sub("", text))

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def _console_handlers() -> list[logging.StreamHandler]:
    """The stdlib handlers writing to the console that Airflow's logging config installed
    (`logging.StreamHandler` itself: pytest's capture handlers are subclasses of it)."""
    loggers = [logging.getLogger(), *(logger for logger in logging.root.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    found: list[logging.StreamHandler] = []
    for logger in loggers:
        found += [h for h in logger.handlers if type(h) is logging.StreamHandler and h not in found]
    return found


@contextmanager
def _logs_to(path: Path | None) -> Iterator[None]:
    """Airflow's own log lines to `path` while the block runs, then back where they went.

    Airflow 3 logs through structlog (each logger writes to the stream of its logger
    factory) and, for stdlib loggers, through the StreamHandlers its logging config puts on
    the root logger. Both are pointed at the file and restored after; loggers are not
    cached meanwhile, so none keeps the file once the block ends."""
    if path is None:
        yield
        return
    import airflow  # noqa: F401  (configures Airflow's logging first, if not yet done)
    import structlog

    sink = _LogFile(path)
    saved = structlog.get_config()
    factory = copy.copy(saved["logger_factory"])
    if hasattr(factory, "io"):  # Airflow's LoggerFactory: keeps the per-logger levels
        factory.io = sink
    else:
        factory = structlog.WriteLoggerFactory(sink)
    handlers = _console_handlers()
    streams = [_point(handler, sink) for handler in handlers]
    structlog.configure(logger_factory=factory, cache_logger_on_first_use=False)
    try:
        yield
    finally:
        structlog.configure(logger_factory=saved["logger_factory"],
                            cache_logger_on_first_use=saved["cache_logger_on_first_use"])
        for handler, stream in zip(handlers, streams):
            _point(handler, stream)
        sink.close()


def _point(handler: logging.StreamHandler, stream) -> object:
    """Point `handler` at `stream`; returns the stream it had. One that is closed already
    (pytest's capture of an earlier test, when Airflow configured its logging then) is
    replaced without the flush that would fail on it."""
    old = handler.stream
    try:
        handler.setStream(stream)
    except ValueError:
        handler.stream = stream
    return old


def _listener(tell: Callable[[TaskEnd], None]):
    """An Airflow listener (airflow.listeners) telling each task instance that finishes,
    as a TaskEnd: dag.test() runs the task runner, which calls it, in this process."""
    from airflow.listeners import hookimpl

    def told(ti, error=None) -> None:
        state = getattr(ti.state, "value", str(ti.state))
        end = ti.end_date or datetime.now(timezone.utc)
        tell(TaskEnd(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                     item=ti.rendered_map_index or (str(ti.map_index) if ti.map_index >= 0 else None),
                     state=state, seconds=(end - ti.start_date).total_seconds(),
                     error=None if error is None else str(error).strip() or type(error).__name__))

    class TaskEnds:
        @hookimpl
        def on_task_instance_success(self, previous_state, task_instance) -> None:
            told(task_instance)

        @hookimpl
        def on_task_instance_failed(self, previous_state, task_instance, error) -> None:
            told(task_instance, error or "failed")

        @hookimpl
        def on_task_instance_skipped(self, previous_state, task_instance) -> None:
            told(task_instance)

    return TaskEnds()


@contextmanager
def _task_listener(tell: Callable[[TaskEnd], None] | None) -> Iterator[None]:
    if tell is None:
        yield
        return
    from airflow.sdk.listener import get_listener_manager

    hooks = _listener(tell)
    manager = get_listener_manager()
    manager.add_listener(hooks)
    try:
        yield
    finally:
        manager.pm.unregister(hooks)

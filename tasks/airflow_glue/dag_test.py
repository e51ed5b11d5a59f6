"""Run a DAG of dags/ once through Airflow's own `dag.test()` (what `make run` does)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ..settings import REPO_ROOT

DAGS_DIR = REPO_ROOT / "dags"


def load_dag(dag_id: str, dags_dir: Path = DAGS_DIR):
    """Import dags/<dag_id>.py and return its DAG object."""
    if str(dags_dir) not in sys.path:  # as Airflow does: DAG files import their neighbours
        sys.path.insert(0, str(dags_dir))
    path = Path(dags_dir) / f"{dag_id}.py"
    spec = importlib.util.spec_from_file_location(f"perfpipe_dag_{dag_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def test_dag(dag_id: str, conf: dict | None = None) -> tuple[str, str]:
    """Run the DAG once in this process; returns (Airflow run id, its final state)."""
    dag = load_dag(dag_id)
    dag_run = dag.test(run_conf=conf or {})
    return dag_run.run_id, str(dag_run.state)

"""Step aggregate: spark/aggregate.py over the run's raw files, through spark-submit, or as a
client of a running Spark Connect server (PERFPIPE_SPARK_MASTER=sc://HOST:PORT).

The job writes per-stage metrics into the run's `metrics/` folder; the next step,
`load_metrics`, judges their validity and loads them into SQL. Under Airflow the same job
runs through the Spark provider's `SparkSubmitOperator` (`spark_job` gives its arguments).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .. import rundir
from ..child_env import child_env
from ..run_context import RunContext
from ..settings import REPO_ROOT, load_settings
from . import AGGREGATE_TIMEOUT_S, Call

SPARK_JOB = REPO_ROOT / "spark" / "aggregate.py"


class AggregationError(RuntimeError):
    """spark-submit failed; the message carries the end of its output."""


def spark_submit_binary() -> str:
    beside_python = Path(sys.executable).parent / "spark-submit"
    found = str(beside_python) if beside_python.exists() else shutil.which("spark-submit")
    if not found:
        raise AggregationError("spark-submit not found: install pyspark (make deps)")
    return found


def job_arguments(run_dir: Path) -> list[str]:
    """The arguments of spark/aggregate.py for a run folder."""
    return ["--run-dir", str(run_dir), "--out", str(Path(run_dir) / rundir.METRICS_DIR)]


# spark-submit's settings, the CLI's and the DAG's: no UI, and the C1 JIT only (a short job
# starts about 10 s sooner; spark-submit reads the driver's JVM options before starting it)
SUBMIT_CONF = {"spark.ui.enabled": "false",
               "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}


def spark_job(run_id: str) -> dict:
    """What the DAG's SparkSubmitOperator runs: the application, its arguments and conf."""
    return {"application": str(SPARK_JOB), "conf": dict(SUBMIT_CONF),
            "application_args": job_arguments(load_settings().run_dir(run_id))}


def submit(run_dir: Path, master: str) -> str:
    """Run the Spark job; returns its stdout (the timing line). `master`: a Spark master for
    spark-submit, or a Spark Connect server (sc://HOST:PORT), whose client the job then
    is: no JVM of its own to start."""
    if master.startswith("sc://"):
        argv = [sys.executable, str(SPARK_JOB), "--master", master, *job_arguments(run_dir)]
    else:
        conf = [arg for key, value in SUBMIT_CONF.items() for arg in ("--conf", f"{key}={value}")]
        argv = [spark_submit_binary(), "--master", master, *conf, str(SPARK_JOB),
                *job_arguments(run_dir)]
    env = child_env(PYTHONPATH=str(REPO_ROOT), PYSPARK_PYTHON=sys.executable)
    done = subprocess.run(argv, capture_output=True, text=True, env=env,
                          timeout=AGGREGATE_TIMEOUT_S)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise AggregationError(f"spark-submit exited {done.returncode}:\n{tail}")
    return done.stdout.strip()


def run(ctx: RunContext, call: Call) -> dict:
    timing = submit(ctx.run_dir, ctx.settings.spark_master)
    return {"timing": timing.splitlines()[-1] if timing else ""}

"""Step 7, aggregate: spark-submit spark/aggregate.py over the raw files, load into SQL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .driver.output import FAILFAST_FILE
from .provision import run_fingerprint
from .run_context import RunContext
from .settings import REPO_ROOT
from .validity import judge

SPARK_JOB = REPO_ROOT / "spark" / "aggregate.py"
METRICS_DIR = "metrics"


class AggregationError(RuntimeError):
    """spark-submit failed; the message carries the end of its output."""


def spark_submit_binary() -> str:
    beside_python = Path(sys.executable).parent / "spark-submit"
    found = str(beside_python) if beside_python.exists() else shutil.which("spark-submit")
    if not found:
        raise AggregationError("spark-submit not found: install pyspark (make deps)")
    return found


def job_arguments(run_dir: Path) -> list[str]:
    """The arguments of spark/aggregate.py for a run (also what the DAG hands to Spark)."""
    return ["--run-dir", str(run_dir), "--out", str(Path(run_dir) / METRICS_DIR)]


def submit(run_dir: Path, out_dir: Path, master: str) -> str:
    """Run the Spark job; returns its stdout (the timing line)."""
    argv = [spark_submit_binary(), "--master", master, "--conf", "spark.ui.enabled=false",
            # the C1 JIT only: a short job starts about 10 s sooner
            "--driver-java-options", "-XX:TieredStopAtLevel=1",
            str(SPARK_JOB), "--run-dir", str(run_dir), "--out", str(out_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise AggregationError(f"spark-submit exited {done.returncode}:\n{tail}")
    return done.stdout.strip()


def load_results(ctx: RunContext) -> list[dict]:
    """Record every stage's metrics and validity in the store; returns one row per stage."""
    document = json.loads((ctx.run_dir / METRICS_DIR / "stage_metrics.json").read_text())
    stages = {stage.stage_id: stage for stage in ctx.measured_stages}
    fingerprint = run_fingerprint(ctx)
    broker_kind = ctx.inventory.broker.kind
    store = ctx.store()
    rows = []
    for result in document["stages"]:
        stage = stages[result["stage_id"]]
        validity, reasons = judge(result["metrics"], qos=stage.qos, series=result.get("series"),
                                  aggregation_status=result["status"], problems=result["problems"])
        stopped = ctx.run_dir / "raw" / stage.stage_id / FAILFAST_FILE
        if stopped.exists():
            validity = "invalid"
            reasons.insert(0, "stopped early: " + json.loads(stopped.read_text())["reason"])
        store.record_stage(ctx.run_id, stage.stage_id, scenario=stage.scenario,
                           stage_key=f"{broker_kind}|{stage.stage_id}", params=stage.to_dict(),
                           fingerprint_hash=fingerprint)
        store.record_results(ctx.run_id, stage.stage_id, metrics=result["metrics"],
                             series=result.get("series", {}), validity=validity,
                             reason="; ".join(reasons) or None)
        rows.append({"stage_id": stage.stage_id, "validity": validity, "reasons": reasons})
    return rows + record_searches(ctx, store, fingerprint)


def record_searches(ctx: RunContext, store, fingerprint: str) -> list[dict]:
    """Each max-rate search as a stage of its own whose one metric is `max_rate`: valid
    only when the search converged (its probes are stages too, never compared)."""
    templates = {stage.stage_id: stage for stage in ctx.stages if stage.search is not None}
    rows = []
    for template_id, outcome in sorted(ctx.searches()["outcomes"].items()):
        template = templates[template_id]
        store.record_stage(ctx.run_id, template_id, scenario=template.scenario,
                           stage_key=f"{ctx.inventory.broker.kind}|{template_id}",
                           params={**template.to_dict(), "search_outcome": outcome},
                           fingerprint_hash=fingerprint)
        validity = "valid" if outcome["converged"] else "invalid"
        store.record_results(ctx.run_id, template_id, metrics={"max_rate": outcome["max_rate"]},
                             series={}, validity=validity, reason=outcome["reason"])
        rows.append({"stage_id": template_id, "validity": validity,
                     "reasons": [outcome["reason"]] if outcome["reason"] else []})
    return rows


def aggregate(ctx: RunContext) -> dict:
    timing = submit(ctx.run_dir, ctx.run_dir / METRICS_DIR, ctx.settings.spark_master)
    rows = load_results(ctx)
    return {"timing": timing.splitlines()[-1] if timing else "", "stages": len(rows),
            "invalid": [r["stage_id"] for r in rows if r["validity"] != "valid"]}

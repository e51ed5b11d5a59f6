"""Aggregate one run's raw driver output into per-stage metrics (a spark-submit entry point).

    spark-submit spark/aggregate.py --run-dir RUN_DIR --out OUT_DIR [--stage ID ...]
                                    [--master local[*]]

Input is the raw-output contract of `tasks.driver.output`: ``RUN_DIR/raw/<stage>/stage.json``
(what the orchestrator intended), ``RUN_DIR/raw/<stage>/<host>/<proc>/{counters.csv,
histograms.csv,summary.json}`` for every driver process and
``RUN_DIR/raw/<stage>/<broker_host>/sampler/broker.csv``.

The heavy part runs on Spark: every CSV of every process is read with an explicit schema,
malformed rows are counted (and named per file when there are any) and dropped, rows are
kept or dropped by their ``second`` column against the stage's measure window
[measure_start, measure_end), counters are summed per (stage, second) and histogram bucket
counts per (stage, kind, bucket).
Only those small sums reach the driver, where percentiles are read from the summed buckets
with `tasks.driver.histogram` (per-process percentiles are never averaged).

Small files (stage.json, summary.json) are read on the driver; they also drive the checks:
a listed process without summary.json, a missing/empty/truncated/malformed CSV or a driver
that reported an error makes the stage "incomplete"; a stage without any traffic in its
measure window is "no_data" with null metrics (never 0). Every reason is a "problems" line.

Output: ``OUT_DIR/stage_metrics.json`` (deterministic: sorted keys, floats rounded to
``SIGNIFICANT_DIGITS`` significant digits, no timestamps) and
``OUT_DIR/stage_metrics.parquet/`` with one (run_id, stage_id, metric, value) row per metric.
Metric names are those of `tasks.metrics.METRICS`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from urllib.parse import unquote, urlparse

try:
    import tasks.driver.output  # noqa: F401  (the pipeline passes PYTHONPATH)
except ImportError:  # run straight from a checkout: the repo root is the parent of spark/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tasks.driver.histogram import summarize
from tasks.driver.output import (
    COUNTER_COLUMNS, COUNTERS_FILE, HISTOGRAM_COLUMNS, HISTOGRAM_KINDS, HISTOGRAMS_FILE,
    SAMPLER_COLUMNS, SAMPLER_FILE, STAGE_FILE, SUMMARY_FILE,
)
from tasks.metrics import LATENCY_KINDS, LATENCY_STATS, METRICS

SIGNIFICANT_DIGITS = 10
WHOLE_STAGE_KINDS = ("connect", "subscribe")  # happen before the window: use every second
CLOCK_OFFSET_LIMIT_S = 0.01
JSON_FILE = "stage_metrics.json"
PARQUET_DIR = "stage_metrics.parquet"
SAMPLER_DIR = "sampler"
_CORRUPT = "_corrupt_record"
_COLUMN_TYPES = {"kind": T.StringType(), "cpu_pct": T.DoubleType()}  # others are integers
_TOTAL_COLUMNS = ("duplicated", "out_of_order", "errors", "inflight_full", "delay_overruns",
                  "connects_ok", "connects_failed")
_BAD_DRIVER_STATUS = ("error", "no_start")
SPARK_SETTINGS = {
    "spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "4",
    "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "WARN", "spark.sql.session.timeZone": "UTC",
}


# ---- driver side: discovering and checking the small files ------------------------------
@dataclass
class Stage:
    """One stage's inputs as found on disk, and what is wrong with them."""

    stage_id: str
    doc: dict = field(default_factory=dict)
    window: tuple[int, int] | None = None
    problems: list[tuple[bool, str]] = field(default_factory=list)  # (notice only, text)
    incomplete: bool = False
    summaries: list[dict] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    files: dict[str, list[Path]] = field(default_factory=dict)  # counters/histograms/broker
    labels: dict[str, str] = field(default_factory=dict)  # resolved file path -> "host/proc"

    def problem(self, text: str, incomplete: bool = False, notice: bool = True) -> None:
        """Record a problem; `incomplete` ones (and status-setting ones) are listed first."""
        self.problems.append((notice and not incomplete, text))
        self.incomplete = self.incomplete or incomplete

    def problem_list(self) -> list[str]:
        return [text for _, text in sorted(self.problems, key=lambda p: p[0])]


def _read_json(path: Path) -> dict:
    document = json.loads(path.read_text())
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


def _window_of(doc: dict) -> tuple[int, int] | None:
    windows = doc.get("windows") or {}
    try:
        return int(windows["measure_start"]), int(windows["measure_end"])
    except (KeyError, TypeError, ValueError):
        return None


def _process_dirs(stage_dir: Path) -> set[tuple[str, str]]:
    return {
        (host.name, proc.name)
        for host in stage_dir.iterdir() if host.is_dir()
        for proc in host.iterdir() if proc.is_dir() and proc.name != SAMPLER_DIR
    }


def _listed_processes(stage: Stage) -> set[tuple[str, str]]:
    listed = stage.doc.get("processes") or []
    return {(str(p["host"]), str(p["proc"])) for p in listed if isinstance(p, dict)}


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if not size:
            return b""
        handle.seek(size - 1)
        return handle.read(1)


def _check_csv(stage: Stage, kind: str, path: Path, label: str) -> None:
    """Queue a CSV for Spark if it exists; flag it if it is empty or lacks a final newline."""
    name = path.name
    if not path.is_file():
        stage.problem(f"missing {name} in {label}", incomplete=True)
        return
    if _last_byte(path) != b"\n":
        stage.problem(f"truncated {name} in {label}: no final newline", incomplete=True)
    stage.files.setdefault(kind, []).append(path)
    stage.labels[str(path.resolve())] = label


def _check_summary(stage: Stage, summary: dict, label: str) -> None:
    status = summary.get("status")
    if status != "ok":
        stage.problem(f"process {label} reported status {status!r}",
                      incomplete=status in _BAD_DRIVER_STATUS)
    offset = (summary.get("clock") or {}).get("offset_s")
    if isinstance(offset, (int, float)) and abs(offset) > CLOCK_OFFSET_LIMIT_S:
        stage.problem(f"clock offset of {label} is {offset:+.3f} s")
    if stage.window and _window_of(summary) not in (None, stage.window):
        stage.problem(f"measure window of {label} {_window_of(summary)} differs from "
                      f"{STAGE_FILE} {stage.window}")


def _check_process(stage: Stage, stage_dir: Path, host: str, proc: str, listed: bool) -> None:
    label = f"{host}/{proc}"
    proc_dir = stage_dir / host / proc
    if not listed:
        stage.problem(f"unexpected process {label}: not listed in {STAGE_FILE}")
    try:
        summary = _read_json(proc_dir / SUMMARY_FILE)
    except FileNotFoundError:
        stage.problem(f"missing process {label}: no {SUMMARY_FILE}", incomplete=True)
        stage.missing.append(label)
        if not proc_dir.is_dir():
            return
    except (OSError, ValueError) as exc:
        stage.problem(f"unreadable {SUMMARY_FILE} in {label}: {exc}", incomplete=True)
        stage.missing.append(label)
    else:
        stage.summaries.append(summary)
        _check_summary(stage, summary, label)
    _check_csv(stage, "counters", proc_dir / COUNTERS_FILE, label)
    _check_csv(stage, "histograms", proc_dir / HISTOGRAMS_FILE, label)


def _check_broker(stage: Stage, stage_dir: Path) -> None:
    host = stage.doc.get("broker_host")
    if not host:
        stage.problem("no broker samples: broker_host is null in stage.json")
        return
    _check_csv(stage, "broker", stage_dir / str(host) / SAMPLER_DIR / SAMPLER_FILE,
               f"{host}/{SAMPLER_DIR}")


def load_stage(raw_dir: Path, stage_id: str) -> Stage:
    """Read stage.json and every summary.json of a stage; list the CSVs for Spark."""
    stage, stage_dir = Stage(stage_id), raw_dir / stage_id
    if not stage_dir.is_dir():
        stage.problem(f"no stage directory {stage_dir}", incomplete=True)
        return stage
    try:
        stage.doc = _read_json(stage_dir / STAGE_FILE)
    except (OSError, ValueError) as exc:
        stage.problem(f"unreadable {STAGE_FILE}: {exc}", incomplete=True)
    stage.window = _window_of(stage.doc)
    if stage.window is None:
        stage.problem(f"no measure window in {STAGE_FILE}", incomplete=True)
    listed = _listed_processes(stage)
    for host, proc in sorted(listed | _process_dirs(stage_dir)):
        _check_process(stage, stage_dir, host, proc, (host, proc) in listed)
    _check_broker(stage, stage_dir)
    return stage


def discover(run_dir: Path, wanted: list[str] | None) -> list[Stage]:
    raw_dir = run_dir / "raw"
    found = sorted(p.name for p in raw_dir.iterdir() if p.is_dir()) if raw_dir.is_dir() else []
    return [load_stage(raw_dir, stage_id) for stage_id in sorted(set(wanted or found))]


# ---- Spark: reading every CSV and summing --------------------------------------------------
def csv_schema(columns: tuple[str, ...]) -> T.StructType:
    fields = [T.StructField(c, _COLUMN_TYPES.get(c, T.LongType())) for c in columns]
    return T.StructType(fields + [T.StructField(_CORRUPT, T.StringType())])


def _valid(columns: tuple[str, ...]) -> Column:
    """A row that parsed completely: every column present, no corrupt record."""
    return reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in columns],
                  F.col(_CORRUPT).isNull())


def _in_window() -> Column:
    return (F.col("second") >= F.col("measure_start")) & (F.col("second") < F.col("measure_end"))


def read_csvs(spark: SparkSession, stages: list[Stage], kind: str,
              columns: tuple[str, ...]) -> DataFrame | None:
    """All `kind` CSVs of all stages with stage_id, window bounds, file path and `valid`."""
    parts = []
    for stage in stages:
        files = stage.files.get(kind)
        if not files or stage.window is None:
            continue
        frame = (spark.read.schema(csv_schema(columns)).option("header", True)
                 .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", _CORRUPT)
                 .csv([str(p) for p in files]))
        parts.append(frame.select(
            F.lit(stage.stage_id).alias("stage_id"), *columns,
            _valid(columns).alias("valid"), F.col("_metadata.file_path").alias("file_path"),
            F.lit(stage.window[0]).alias("measure_start"),
            F.lit(stage.window[1]).alias("measure_end")))
    return reduce(DataFrame.unionByName, parts) if parts else None


def _if(condition: str, column: str) -> Column:
    return F.when(F.col(condition), F.col(column))


def _malformed() -> Column:
    return F.count_if(~F.col("valid")).alias("malformed")


def aggregate_counters(frame: DataFrame) -> list[Row]:
    """Counter sums per (stage, second), each flagged in or out of the measure window."""
    sums = [F.sum(_if("valid", c)).alias(c) for c in COUNTER_COLUMNS[1:]]
    return (frame.groupBy("stage_id", "second", _in_window().alias("in_window"))
            .agg(*sums, _malformed()).collect())


def aggregate_histograms(frame: DataFrame) -> list[Row]:
    """Summed bucket counts per (stage, kind, bucket): window only, or all of the stage."""
    keep = (F.col("valid") & (_in_window() | F.col("kind").isin(*WHOLE_STAGE_KINDS))
            & F.col("kind").isin(*HISTOGRAM_KINDS) & (F.col("count") > 0))
    return (frame.filter(keep | ~F.col("valid")).groupBy("stage_id", "kind", "bucket")
            .agg(F.sum(_if("valid", "count")).alias("count"), _malformed()).collect())


def aggregate_broker(frame: DataFrame) -> list[Row]:
    """Broker CPU and RSS over the samples inside the measure window, per stage."""
    frame = frame.withColumn("inside", F.col("valid") & _in_window())
    return frame.groupBy("stage_id").agg(
        F.count(_if("inside", "second")).alias("samples"),
        F.avg(_if("inside", "cpu_pct")).alias("cpu_avg"),
        F.max(_if("inside", "cpu_pct")).alias("cpu_max"),
        F.avg(_if("inside", "rss_bytes")).alias("rss_avg"),
        F.max(_if("inside", "rss_bytes")).alias("rss_max"), _malformed(),
    ).collect()


def count_malformed(frame: DataFrame, stage_ids: list[str]) -> list[tuple[str, str, int]]:
    """(stage_id, file URI, rows) of rows that did not parse; run only when some did not."""
    bad = (frame.filter(F.col("stage_id").isin(*stage_ids) & ~F.col("valid"))
           .groupBy("stage_id", "file_path").count())
    return sorted((r["stage_id"], r["file_path"], r["count"]) for r in bad.collect())


# ---- the small sums on the driver --------------------------------------------------------
@dataclass
class Sums:
    """What Spark hands back: small per-stage tables."""

    series: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    whole: dict[str, dict[int, int]] = field(default_factory=dict)  # delivered, every second
    totals: dict[str, dict[str, int]] = field(default_factory=dict)
    connect_seconds: dict[str, list[int]] = field(default_factory=dict)
    histograms: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
    broker: dict[str, dict] = field(default_factory=dict)
    malformed: dict[str, set[str]] = field(default_factory=dict)  # dataset -> stage ids

    def flag(self, dataset: str, row: Row) -> None:
        if row["malformed"]:
            self.malformed.setdefault(dataset, set()).add(row["stage_id"])


def collect_counters(sums: Sums, rows: list[Row]) -> None:
    for row in rows:
        sums.flag("counters", row)
        if row["second"] is None:
            continue
        stage_id = row["stage_id"]
        totals = sums.totals.setdefault(stage_id, dict.fromkeys(COUNTER_COLUMNS[1:], 0))
        for name in COUNTER_COLUMNS[1:]:
            totals[name] += row[name] or 0
        if row["connects_ok"]:
            sums.connect_seconds.setdefault(stage_id, []).append(row["second"])
        delivered = (row["received"] or 0) - (row["duplicated"] or 0)  # unique deliveries
        whole = sums.whole.setdefault(stage_id, {})
        whole[row["second"]] = whole.get(row["second"], 0) + delivered
        if row["in_window"]:
            sums.series.setdefault(stage_id, {})[row["second"]] = (delivered, row["published"] or 0)


def collect_histograms(sums: Sums, rows: list[Row]) -> None:
    # sorted: summarize() adds floats in dict order, and reruns must be byte-identical
    for row in sorted(rows, key=lambda r: (r["stage_id"], r["kind"] or "", r["bucket"] or 0)):
        sums.flag("histograms", row)
        if row["count"]:
            kinds = sums.histograms.setdefault(row["stage_id"], {})
            kinds.setdefault(row["kind"], {})[row["bucket"]] = row["count"]


def collect_broker(sums: Sums, rows: list[Row]) -> None:
    for row in rows:
        sums.flag("broker", row)
        if row["samples"]:
            sums.broker[row["stage_id"]] = row.asDict()


def report_malformed(stages: list[Stage], bad: list[tuple[str, str, int]]) -> None:
    by_id = {s.stage_id: s for s in stages}
    for stage_id, uri, rows in bad:
        path = Path(unquote(urlparse(uri).path))
        stage = by_id[stage_id]
        label = stage.labels.get(str(path.resolve()), str(path))
        stage.problem(f"{rows} malformed rows skipped in {path.name} of {label}",
                      incomplete=True)


_DATASETS = (
    ("counters", COUNTER_COLUMNS, aggregate_counters, collect_counters),
    ("histograms", HISTOGRAM_COLUMNS, aggregate_histograms, collect_histograms),
    ("broker", SAMPLER_COLUMNS, aggregate_broker, collect_broker),
)


def read(spark: SparkSession, stages: list[Stage]) -> dict[str, DataFrame]:
    """Lazy DataFrames over every counters/histograms/broker CSV of the stages."""
    frames = {name: read_csvs(spark, stages, name, columns)
              for name, columns, _, _ in _DATASETS}
    return {name: frame for name, frame in frames.items() if frame is not None}


def aggregate(stages: list[Stage], frames: dict[str, DataFrame]) -> Sums:
    """One Spark job per dataset, plus a per-file job only where rows were malformed."""
    sums = Sums()
    for name, _, spark_part, driver_part in _DATASETS:
        if name in frames:
            driver_part(sums, spark_part(frames[name]))
    for name, stage_ids in sorted(sums.malformed.items()):
        report_malformed(stages, count_malformed(frames[name], sorted(stage_ids)))
    return sums


# ---- driver side: metrics from the small sums -------------------------------------------
def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _cv(values: list[int]) -> float | None:
    if len(values) < 2 or not statistics.fmean(values):
        return None
    return statistics.pstdev(values) / statistics.fmean(values)


def traffic_metrics(stage: Stage, per_second: dict[int, tuple[int, int]]) -> tuple[dict, dict]:
    """Rates and the per-second series of the measure window (seconds without rows are 0)."""
    start, end = stage.window
    seconds = list(range(start, end))
    delivered = [per_second.get(s, (0, 0))[0] for s in seconds]
    published = [per_second.get(s, (0, 0))[1] for s in seconds]
    measure_s = len(seconds)
    delivered_rate = _ratio(sum(delivered), measure_s)
    metrics = {
        "delivered_rate": delivered_rate,
        "published_rate": _ratio(sum(published), measure_s),
        "achieved_ratio": _ratio(delivered_rate, stage.doc.get("expected_delivery_rate")),
        "throughput_cv": _cv(delivered),
        "messages_delivered": sum(delivered),
    }
    series = {"seconds": seconds, "delivered_per_s": delivered, "published_per_s": published}
    return metrics, series


def stage_series(stage: Stage, whole: dict[int, int]) -> dict[str, list[int]]:
    """Delivered per second over the whole stage (warm-up and cool-down too), for charts."""
    windows = stage.doc.get("windows") or {}
    if "start" not in windows or "end" not in windows:
        return {}
    seconds = list(range(windows["start"], windows["end"]))
    return {"stage_seconds": seconds, "stage_delivered_per_s": [whole.get(s, 0) for s in seconds]}


def loss_metrics(stage: Stage) -> dict:
    """Whole-stage loss: expected (last_seq x receivers) minus unique deliveries."""
    if stage.missing:
        stage.problem("loss not computed: processes without summary: " + ", ".join(stage.missing))
        return {}
    receivers = stage.doc.get("receivers") or {}
    expected = unique = 0
    for summary in stage.summaries:
        for index, last_seq in sorted((summary.get("last_seq") or {}).items()):
            if str(index) not in receivers:
                stage.problem(f"publisher {index} of {summary.get('host')}/"
                              f"{summary.get('proc')} has no receivers in {STAGE_FILE}")
            expected += int(last_seq) * int(receivers.get(str(index), 0))
        unique += int(summary.get("unique_received") or 0)
    lost = max(0, expected - unique)
    return {"lost": lost, "loss_ratio": _ratio(lost, expected)}


def counter_metrics(totals: dict[str, int] | None, connect_seconds: list[int]) -> dict:
    """Whole-stage counter sums; connect rate over the seconds that saw CONNACKs."""
    if not totals:
        return {}
    metrics = {name: totals[name] for name in _TOTAL_COLUMNS}
    if connect_seconds:
        span = max(connect_seconds) - min(connect_seconds) + 1
        metrics["connect_rate"] = totals["connects_ok"] / span
    return metrics


def latency_metrics(histograms: dict[str, dict[int, int]]) -> dict:
    metrics = {}
    for kind in LATENCY_KINDS:
        summary = summarize(histograms.get(kind, {}))
        for stat in LATENCY_STATS:
            metrics[f"{kind}_latency_{stat}"] = summary.get(stat)
    return metrics


def broker_metrics(stage: Stage, broker: dict | None, delivered_rate: float | None) -> dict:
    if not broker:
        if stage.files.get("broker"):
            stage.problem("no broker samples in the measure window")
        return {}
    metrics = {f"broker_{k}": broker[k] for k in ("cpu_avg", "cpu_max", "rss_avg", "rss_max")}
    metrics["broker_cpu_per_10k"] = _ratio(broker["cpu_avg"], (delivered_rate or 0) / 10000)
    return metrics


def stage_result(stage: Stage, sums: Sums) -> dict:
    """The stage's entry of stage_metrics.json: status, problems, every metric, series."""
    metrics: dict = dict.fromkeys(METRICS)
    metrics["target_rate"] = stage.doc.get("target_publish_rate")
    series: dict = {"seconds": [], "delivered_per_s": [], "published_per_s": []}
    status = "incomplete" if stage.incomplete else "ok"
    traffic = {}
    if stage.window is not None:
        traffic, series = traffic_metrics(stage, sums.series.get(stage.stage_id, {}))
        series.update(stage_series(stage, sums.whole.get(stage.stage_id, {})))
    if not (sum(series["delivered_per_s"]) or sum(series["published_per_s"])):
        stage.problem("zero traffic in the measure window", notice=False)
        status = "no_data"
    else:
        metrics.update(traffic)
        metrics.update(loss_metrics(stage))
        metrics.update(counter_metrics(sums.totals.get(stage.stage_id),
                                       sums.connect_seconds.get(stage.stage_id, [])))
        metrics.update(latency_metrics(sums.histograms.get(stage.stage_id, {})))
        metrics.update(broker_metrics(stage, sums.broker.get(stage.stage_id),
                                      metrics["delivered_rate"]))
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise KeyError(f"metrics missing from tasks.metrics: {sorted(unknown)}")
    return {"stage_id": stage.stage_id, "scenario": stage.doc.get("scenario"),
            "status": status, "problems": stage.problem_list(),
            "metrics": {k: tidy(v) for k, v in metrics.items()}, "series": series}


def tidy(value):
    """Round floats to SIGNIFICANT_DIGITS so reruns are byte-identical; NaN/inf -> None."""
    if value is None or isinstance(value, (bool, int)):
        return value
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}") + 0.0  # + 0.0 turns -0.0 into 0.0


# ---- output ------------------------------------------------------------------------------
def run_id_of(run_dir: Path, stages: list[Stage]) -> str:
    ids = sorted({str(s.doc["run_id"]) for s in stages if s.doc.get("run_id")})
    for stage in stages:
        if len(ids) > 1 and stage.doc.get("run_id") != ids[0]:
            stage.problem(f"run_id {stage.doc.get('run_id')!r} differs from {ids[0]!r}")
    return ids[0] if ids else run_dir.resolve().name


def write_json(out_dir: Path, document: dict) -> None:
    text = json.dumps(document, indent=1, sort_keys=True, allow_nan=False) + "\n"
    tmp = out_dir / (JSON_FILE + ".tmp")
    tmp.write_text(text)
    tmp.replace(out_dir / JSON_FILE)


def write_parquet(spark: SparkSession, out_dir: Path, document: dict) -> None:
    schema = T.StructType([T.StructField("run_id", T.StringType(), False),
                           T.StructField("stage_id", T.StringType(), False),
                           T.StructField("metric", T.StringType(), False),
                           T.StructField("value", T.DoubleType(), True)])
    rows = [(document["run_id"], s["stage_id"], name,
             None if value is None else float(value))
            for s in document["stages"] for name, value in sorted(s["metrics"].items())]
    (spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite")
     .parquet(str(out_dir / PARQUET_DIR)))


# ---- entry point -------------------------------------------------------------------------
def build_session(master: str | None) -> SparkSession:
    """A small local session: few partitions, no UI, WARN logs (sized for 2 cores)."""
    warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")
    builder = SparkSession.builder.appName("perfpipe-aggregate")
    for key, value in SPARK_SETTINGS.items():
        builder = builder.config(key, value)
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master(master or "local[*]")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="spark-submit spark/aggregate.py",
        description="Aggregate RUN_DIR/raw into OUT_DIR/stage_metrics.{json,parquet}.")
    parser.add_argument("--run-dir", type=Path, required=True, help="holds raw/<stage_id>/")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--stage", action="append", metavar="STAGE_ID",
                        help="aggregate only this stage (repeatable); default: all of raw/")
    parser.add_argument("--master", help="Spark master, e.g. local[*] (default: spark-submit's)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    spark = build_session(args.master)
    t1 = time.monotonic()
    stages = discover(args.run_dir, args.stage)
    frames = read(spark, stages)
    t2 = time.monotonic()
    sums = aggregate(stages, frames)
    document = {"run_id": run_id_of(args.run_dir, stages),
                "stages": [stage_result(s, sums) for s in stages]}
    t3 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out, document)
    write_parquet(spark, args.out, document)
    t4 = time.monotonic()
    master = spark.sparkContext.master
    spark.stop()
    statuses = ", ".join(f"{s['stage_id']}={s['status']}" for s in document["stages"])
    print(f"aggregate: {len(stages)} stages ({statuses}) on {master}; session {t1 - t0:.1f}s, "
          f"read {t2 - t1:.1f}s, aggregate {t3 - t2:.1f}s, write {t4 - t3:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

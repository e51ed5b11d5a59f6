"""Aggregate one run's raw driver output into per-stage metrics (a spark-submit entry point).

    spark-submit spark/aggregate.py --run-dir RUN_DIR --out OUT_DIR [--stage ID ...]
                                    [--master local[*]] [--timings FILE]

Input is the raw-output contract of `tasks.driver.output`: ``RUN_DIR/raw/<stage>/stage.json``
(what the orchestrator intended), ``RUN_DIR/raw/<stage>/<host>/<proc>/{counters.csv,
histograms.csv,summary.json}`` for every driver process and the broker sampler's
``RUN_DIR/raw/<stage>/<broker_host>/sampler/`` (a row a second: read on the driver).

The heavy part runs on Spark: the CSVs of one kind, of every stage and process, are one
text scan whose lines are split and cast to the contract's typed columns (`parse_lines`);
malformed rows are counted (and named per file when there are any) and dropped, rows are
kept or dropped by their ``second`` column against the stage's measure window
[measure_start, measure_end), counters are summed per (stage, second) and histogram bucket
counts per (stage, kind, bucket) (first per file and window segment, then joined to the
stage: `aggregate_histograms`). The two datasets are planned and summed in threads
of their own (`read_and_sum`), so the counters run while the histogram scan keeps the
cores busy. ``--timings FILE`` writes the phases' durations
(bench/bench_spark.py times the job on a generated hour of driver output).
Only those small sums reach the driver, where percentiles are read from the summed buckets
with `tasks.driver.histogram` (per-process percentiles are never averaged).

The driver side is plain Python in two modules of its own: `spark.stage_files` reads and
checks the small files (stage.json, summary.json; a listed process without its files or a
truncated CSV makes the stage "incomplete"), and `spark.stage_metrics` turns the sums into
the metrics (a stage without traffic in its window is "no_data" with null metrics, never 0;
every reason is a "problems" line).

Output: ``OUT_DIR/stage_metrics.json`` (deterministic: sorted keys, floats rounded to
``spark.stage_metrics.SIGNIFICANT_DIGITS`` significant digits, no timestamps) and
``OUT_DIR/stage_metrics.parquet/`` with one (run_id, stage_id, metric, value) row per metric.
Metric names are those of `tasks.metrics.METRICS`.
"""

from __future__ import annotations

import time

PYTHON_STARTED_AT = time.time()  # before pyspark is imported: for --timings

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from urllib.parse import unquote, urlparse

# spark-submit puts this file's folder on sys.path, not the checkout's root, which holds
# this job's own modules (spark.*) and the pure ones it shares with the pipeline (tasks.*).
REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.stage_files import StageFiles, discover
from spark.stage_metrics import Sums, stage_result
from tasks.driver.output import (
    COUNTER_COLUMNS,
    HISTOGRAM_COLUMNS,
    HISTOGRAM_KINDS,
)
from tasks.rundir import STAGE_METRICS_JSON as JSON_FILE
from tasks.rundir import STAGE_METRICS_PARQUET as PARQUET_DIR

WHOLE_STAGE_KINDS = ("connect", "subscribe")  # happen before the window: use every second
_COLUMN_TYPES = {"kind": T.StringType()}  # others are integers
SESSION_SETTINGS = ("spark.sql.shuffle.partitions", "spark.sql.session.timeZone")  # per session
SPARK_SETTINGS = {
    "spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "4",
    "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
    # list the input files on the driver: a listing job for >32 paths costs more locally
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    "spark.log.level": "WARN", "spark.sql.session.timeZone": "UTC",
}


def parse_lines(lines: DataFrame, columns: tuple[str, ...]) -> DataFrame:
    """Lines of contract CSVs (``value``) as typed columns plus ``valid``; the frame's other
    columns are kept.

    The files hold plain comma-separated numbers and kind names (csv.writer never quotes
    them), so a line is split on commas and every field cast to its type
    (``_COLUMN_TYPES``, else a long): about twice as fast as Spark's CSV reader on these
    narrow rows. The header line and empty lines are skipped; a line is valid when it has
    exactly the contract's fields and each one parses (an empty string is not a kind).
    Nothing downstream filters rows before the sums (conditions sit inside the
    aggregates): a filter would be pushed below this projection and split every line
    once per reference.
    """
    header = ",".join(columns)
    others = [c for c in lines.columns if c != "value"]
    tokens = lines.filter((F.col("value") != header) & (F.col("value") != "")).select(
        *others, F.split("value", ",").alias("_tokens"))
    typed = [F.get("_tokens", i).try_cast(_COLUMN_TYPES.get(c, T.LongType())).alias(c)
             for i, c in enumerate(columns)]
    checks = [F.col(c).isNotNull() & (F.col(c) != "") if _COLUMN_TYPES.get(c) == T.StringType()
              else F.col(c).isNotNull() for c in columns]
    width = (F.size("_tokens") == len(columns)).alias("_width")
    return (tokens.select(*others, *typed, width)
            .select(*others, *columns,
                    reduce(lambda a, b: a & b, checks, F.col("_width")).alias("valid")))


def _in_window() -> Column:
    return (F.col("second") >= F.col("measure_start")) & (F.col("second") < F.col("measure_end"))


def _file_key(uri: str) -> str:
    """The last four parts of a file URI as Spark spells it (``<stage>/<host>/<proc>/<file>``
    in the contract layout): the join key between ``_metadata.file_path`` and the stage
    table, cut the same way on both sides so Spark's URI escaping never matters."""
    return "/".join(uri.rsplit("/", 4)[-4:])


def _spark_file_key(column: str = "file_path") -> Column:
    return F.substring_index(column, "/", -4)


def _local_path(uri: str) -> str:
    return str(Path(unquote(urlparse(uri).path)).resolve())


def _segment(second: Column, bounds: list[int]) -> Column:
    """How many of the sorted `bounds` are <= second (a balanced CASE tree, null for null)."""
    def node(lo: int, hi: int) -> Column:
        if lo == hi:
            return F.lit(lo)
        mid = (lo + hi) // 2
        return F.when(second < bounds[mid], node(lo, mid)).otherwise(node(mid + 1, hi))
    return F.when(second.isNotNull(), node(0, len(bounds)))


@dataclass
class Dataset:
    """The parsed lines of every CSV of one kind, and which stage each file belongs to.

    ``rows``: file_path, the contract columns and ``valid``, one row per line.
    ``files``: one row per file: file_key, stage_id, measure_start, measure_end and
    seg_lo, seg_hi: its measure window as a range of `_segment` values over ``bounds``
    (every stage's window edges), so second in [measure_start, measure_end) exactly when
    seg_lo <= _segment(second) < seg_hi, even where windows of stages overlap.
    """

    rows: DataFrame
    files: DataFrame
    bounds: list[int]

    def tagged(self) -> DataFrame:
        """Every row with its stage_id and window: a broadcast join per row (small data)."""
        return (self.rows.withColumn("file_key", _spark_file_key())
                .join(F.broadcast(self.files), "file_key"))


def read_csvs(spark: SparkSession, stages: list[StageFiles], kind: str,
              columns: tuple[str, ...]) -> Dataset | None:
    """One text scan over every `kind` CSV of all stages (one plan and one generated parser,
    however many stages there are), and the table of their stages."""
    owner: dict[str, StageFiles] = {}
    for stage in stages:
        if stage.window is not None:
            owner.update((str(p.resolve()), stage) for p in stage.files.get(kind, []))
    if not owner:
        return None
    lines = spark.read.text(sorted(owner))
    bounds = sorted({edge for stage in owner.values() for edge in stage.window})
    table = {}
    for uri in lines.inputFiles():  # Spark's own spelling of each file, as in _metadata
        stage = owner[_local_path(uri)]
        start, end = stage.window
        table[_file_key(uri)] = {
            "file_key": _file_key(uri), "stage_id": stage.stage_id, "measure_start": start,
            "measure_end": end, "seg_lo": bounds.index(start) + 1, "seg_hi": bounds.index(end) + 1}
    if len(table) != len(owner):
        raise ValueError(f"{kind} files are not told apart by their last four path parts")
    # one JSON literal (one py4j call, folded once by the optimizer), not a struct per file
    files = spark.range(1).select(F.inline(F.from_json(
        F.lit(json.dumps(sorted(table.values(), key=lambda r: r["file_key"]))),
        "array<struct<file_key: string, stage_id: string, measure_start: bigint, "
        "measure_end: bigint, seg_lo: int, seg_hi: int>>")))
    rows = parse_lines(lines.select("value", F.col("_metadata.file_path").alias("file_path")),
                       columns)
    return Dataset(rows, files, bounds)


def _if(condition: str, column: str) -> Column:
    return F.when(F.col(condition), F.col(column))


def _malformed() -> Column:
    return F.count_if(~F.col("valid")).alias("malformed")


def aggregate_counters(data: Dataset) -> list[Row]:
    """Counter sums per (stage, second), each flagged in or out of the measure window."""
    sums = [F.sum(_if("valid", c)).alias(c) for c in COUNTER_COLUMNS[1:]]
    return (data.tagged().groupBy("stage_id", "second", _in_window().alias("in_window"))
            .agg(*sums, _malformed()).collect())


def aggregate_histograms(data: Dataset) -> list[Row]:
    """Summed bucket counts per (stage, kind, bucket): window only, or all of the stage.

    The big dataset, so no per-row join: lines are summed per (file, kind, bucket, window
    segment of their second) first, which needs nothing of the stage, and only those sums
    are joined to their stage and kept when the segment lies in its window (connect and
    subscribe: every segment). Out-of-window sums stay in the group as null, not 0."""
    keep = F.col("valid") & F.col("kind").isin(*HISTOGRAM_KINDS) & (F.col("count") > 0)
    per_file = (data.rows.groupBy("file_path", "kind", "bucket",
                                  _segment(F.col("second"), data.bounds).alias("segment"))
                .agg(F.sum(F.when(keep, F.col("count"))).alias("count"), _malformed()))
    inside = (((F.col("segment") >= F.col("seg_lo")) & (F.col("segment") < F.col("seg_hi")))
              | F.col("kind").isin(*WHOLE_STAGE_KINDS))
    return (per_file.withColumn("file_key", _spark_file_key())
            .join(F.broadcast(data.files), "file_key")
            .groupBy("stage_id", "kind", "bucket")
            .agg(F.sum(F.when(inside, F.col("count"))).alias("count"),
                 F.sum("malformed").alias("malformed")).collect())


def count_malformed(data: Dataset, stage_ids: list[str]) -> list[tuple[str, str, int]]:
    """(stage_id, file URI, rows) of rows that did not parse; run only when some did not."""
    bad = (data.tagged().filter(F.col("stage_id").isin(*stage_ids))
           .groupBy("stage_id", "file_path").agg(_malformed()).filter(F.col("malformed") > 0))
    return sorted((r["stage_id"], r["file_path"], r["malformed"]) for r in bad.collect())


# ---- the small sums on the driver --------------------------------------------------------
def collect_counters(sums: Sums, rows: list[Row]) -> None:
    for row in rows:
        sums.flag("counters", row)
        if row["second"] is None:
            continue
        stage_id = row["stage_id"]
        totals = sums.totals.setdefault(stage_id, dict.fromkeys(COUNTER_COLUMNS[1:], 0))
        for name in COUNTER_COLUMNS[1:]:
            totals[name] += row[name] or 0
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


def report_malformed(stages: list[StageFiles], bad: list[tuple[str, str, int]]) -> None:
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
)


def read_and_sum(spark: SparkSession, stages: list[StageFiles]) -> tuple[Sums, dict[str, Dataset],
                                                                  float]:
    """Plan each dataset's scan and run its job in a thread of its own, histograms first.

    Locally the job's time goes to a cold JVM: planning and code generation on the driver
    and the first job's fixed cost. In threads, the small counters dataset is
    planned and summed while the histogram scan keeps both cores busy, instead of one after
    the other. Results are handed to the driver-side code in the fixed order of _DATASETS,
    so the output does not depend on which job finished first. Returns the sums, the
    datasets and the time at which the last plan was made (the end of the "read" phase)."""
    planned: dict[str, float] = {}

    def one(name: str, columns: tuple[str, ...], spark_part):
        data = read_csvs(spark, stages, name, columns)
        planned[name] = time.time()
        return data, (spark_part(data) if data is not None else None)

    order = sorted(_DATASETS, key=lambda d: d[0] != "histograms")
    with ThreadPoolExecutor(len(order)) as pool:
        futures = {name: pool.submit(one, name, columns, spark_part)
                   for name, columns, spark_part, _ in order}
        results = {name: future.result() for name, future in futures.items()}
    sums, frames = Sums(), {}
    for name, _, _, driver_part in _DATASETS:
        data, rows = results[name]
        if data is not None:
            frames[name] = data
            driver_part(sums, rows)
    for name, stage_ids in sorted(sums.malformed.items()):
        report_malformed(stages, count_malformed(frames[name], sorted(stage_ids)))
    return sums, frames, max(planned.values())


def run_id_of(run_dir: Path, stages: list[StageFiles]) -> str:
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
    """One (run_id, stage_id, metric, value) row per metric, in one file. The rows reach the
    JVM as one JSON literal (one py4j call, nothing pickled, no Python worker); Python's
    float repr and Spark's JSON parser round-trip doubles exactly."""
    rows = [{"run_id": document["run_id"], "stage_id": s["stage_id"], "metric": name,
             "value": None if value is None else float(value)}
            for s in document["stages"] for name, value in sorted(s["metrics"].items())]
    schema = "array<struct<run_id: string, stage_id: string, metric: string, value: double>>"
    frame = spark.range(1).select(F.inline(F.from_json(F.lit(json.dumps(rows)), schema)))
    frame.coalesce(1).write.mode("overwrite").parquet(str(out_dir / PARQUET_DIR))


# ---- entry point -------------------------------------------------------------------------
def is_connect(master: str | None) -> bool:
    """A Spark Connect URL (sc://HOST:PORT) rather than a master."""
    return bool(master) and master.startswith("sc://")


def build_session(master: str | None) -> SparkSession:
    """A small local session: few partitions, no UI, WARN logs (sized for 2 cores)."""
    warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")
    if is_connect(master):  # Spark Connect: a client of a running Spark
        spark = SparkSession.builder.remote(master).getOrCreate()
        for key in SESSION_SETTINGS:
            spark.conf.set(key, SPARK_SETTINGS[key])
        return spark
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
    parser.add_argument("--master", help="Spark master, e.g. local[*] (default: spark-submit's), "
                        "or a Spark Connect server, sc://HOST:PORT (run with python, not "
                        "spark-submit: the job is then a client of that Spark)")
    parser.add_argument("--timings", type=Path, metavar="FILE",
                        help="write the phases' Unix timestamps and durations here as JSON "
                             "(bench/bench_spark.py)")
    return parser.parse_args(argv)


def write_timings(path: Path, ends: dict[str, float]) -> None:
    """``ends``: the Unix time at which each phase ended, in order (the first entry is the
    start of this Python process's job code). Written with the phases' durations:
    imports (pyspark), session (SparkContext and session up), read (discover the files,
    until the last dataset's scan is planned: the histogram job already runs by then),
    spark_jobs (until every CSV is scanned and summed: Spark reads lazily, so parsing is
    timed here), metrics (percentiles etc. on the driver), write (JSON + Parquet), stop."""
    names = list(ends)
    phases = {b: round(ends[b] - ends[a], 3) for a, b in zip(names, names[1:])}
    path.write_text(json.dumps({"ends_at": ends, "phases_s": phases}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ends = {"python_started": PYTHON_STARTED_AT, "imports": time.time()}
    spark = build_session(args.master)
    ends["session"] = time.time()
    stages = discover(args.run_dir, args.stage)
    sums, _, ends["read"] = read_and_sum(spark, stages)
    ends["spark_jobs"] = time.time()
    document = {"run_id": run_id_of(args.run_dir, stages),
                "stages": [stage_result(s, sums) for s in stages]}
    ends["metrics"] = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out, document)
    write_parquet(spark, args.out, document)
    ends["write"] = time.time()
    master = args.master if is_connect(args.master) else spark.sparkContext.master
    spark.stop()
    ends["stop"] = time.time()
    if args.timings:
        write_timings(args.timings, ends)
    t0, t1, t2, t3, t4 = (ends[k] for k in ("imports", "session", "read", "metrics", "write"))
    statuses = ", ".join(f"{s['stage_id']}={s['status']}" for s in document["stages"])
    print(f"aggregate: {len(stages)} stages ({statuses}) on {master}; session {t1 - t0:.1f}s, "
          f"read {t2 - t1:.1f}s, aggregate {t3 - t2:.1f}s, write {t4 - t3:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

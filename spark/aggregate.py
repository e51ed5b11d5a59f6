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
counts per (stage, kind, bucket), per second too for the kinds whose tail is read per
second (`aggregate_histograms`, `tasks.analysis.tails`). The two datasets are planned and
summed in threads of their own (`read_and_sum`), so the counters run while the histogram
scan keeps the cores busy. ``--timings FILE`` writes the phases' durations
(bench/bench_spark.py times the job on a generated hour of driver output).
Only small sums reach the driver (each second's tail as its percentile buckets, read in
Spark), where percentiles are read from the summed buckets with `tasks.driver.histogram`
(per-process percentiles are never averaged).

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
from pyspark.sql.window import Window

from spark.stage_files import StageFiles, discover
from spark.stage_metrics import Sums, stage_result
from tasks.analysis.tails import SecondTail, stalled_seconds
from tasks.driver.histogram import bucket_value
from tasks.driver.output import (
    COUNTER_COLUMNS,
    HISTOGRAM_COLUMNS,
    HISTOGRAM_KINDS,
)
from tasks.metrics import TAIL_KINDS
from tasks.rundir import STAGE_METRICS_JSON as JSON_FILE
from tasks.rundir import STAGE_METRICS_PARQUET as PARQUET_DIR

WHOLE_STAGE_KINDS = ("connect", "subscribe")  # happen before the window: use every second
_COLUMN_TYPES = {"kind": T.StringType()}  # others are integers
_COLUMN_VALUES = {"kind": HISTOGRAM_KINDS}  # a string column's values (others: not negative)
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
    exactly the contract's fields and each one parses: a kind one of the contract's
    (`HISTOGRAM_KINDS`), a number not negative (seconds, buckets, counts and counters all
    count up from 0). Any other line is malformed and said (a negative bucket read as a
    negative latency, an unknown kind was dropped unsaid).
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
    checks = [F.col(c).isNotNull() & (F.col(c).isin(*_COLUMN_VALUES[c]) if c in _COLUMN_VALUES
                                      else F.col(c) >= 0) for c in columns]
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


@dataclass
class Dataset:
    """The parsed lines of every CSV of one kind, and which stage each file belongs to.

    ``rows``: file_path, the contract columns and ``valid``, one row per line.
    ``files``: one row per file: file_key, stage_id, measure_start, measure_end.
    """

    rows: DataFrame
    files: DataFrame

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
    table = {}
    for uri in lines.inputFiles():  # Spark's own spelling of each file, as in _metadata
        stage = owner[_local_path(uri)]
        start, end = stage.window
        table[_file_key(uri)] = {
            "file_key": _file_key(uri), "stage_id": stage.stage_id, "measure_start": start,
            "measure_end": end}
    if len(table) != len(owner):
        raise ValueError(f"{kind} files are not told apart by their last four path parts")
    # one JSON literal (one py4j call, folded once by the optimizer), not a struct per file
    files = spark.range(1).select(F.inline(F.from_json(
        F.lit(json.dumps(sorted(table.values(), key=lambda r: r["file_key"]))),
        "array<struct<file_key: string, stage_id: string, measure_start: bigint, "
        "measure_end: bigint>>")))
    rows = parse_lines(lines.select("value", F.col("_metadata.file_path").alias("file_path")),
                       columns)
    return Dataset(rows, files)


def _if(condition: str, column: str) -> Column:
    return F.when(F.col(condition), F.col(column))


def _malformed() -> Column:
    return F.count_if(~F.col("valid")).alias("malformed")


def aggregate_counters(data: Dataset) -> list[Row]:
    """Counter sums per (stage, second), each flagged in or out of the measure window."""
    sums = [F.sum(_if("valid", c)).alias(c) for c in COUNTER_COLUMNS[1:]]
    return (data.tagged().groupBy("stage_id", "second", _in_window().alias("in_window"))
            .agg(*sums, _malformed()).collect())


def _rank(pct: int) -> Column:
    """The nearest rank of the pct-th percentile of ``total`` samples, in integers:
    ceil(pct x total / 100), at least 1, as `tasks.driver.histogram.percentile` reads it."""
    return F.greatest(F.lit(1), F.expr(f"(total * {pct} + 99) div 100"))


def second_tails(per_second: DataFrame) -> DataFrame:
    """Each window second's count, p50, p99 and max bucket per (stage, kind), from the
    second's buckets summed over every process: what `tasks.analysis.tails` reads."""
    second = Window.partitionBy("stage_id", "kind", "tail_second")
    seen = F.sum("count").over(second.orderBy("bucket").rowsBetween(
        Window.unboundedPreceding, Window.currentRow))
    ranked = (per_second.filter(F.col("tail_second").isNotNull() & (F.col("count") > 0))
              .select("stage_id", "kind", "tail_second", "bucket", seen.alias("seen"),
                      F.sum("count").over(second).alias("total")))
    return (ranked.groupBy("stage_id", "kind", "tail_second")
            .agg(F.max("total").alias("total"),
                 F.min(F.when(F.col("seen") >= _rank(50), F.col("bucket"))).alias("p50"),
                 F.min(F.when(F.col("seen") >= _rank(99), F.col("bucket"))).alias("p99"),
                 F.max("bucket").alias("top")))


def _second_tail(row: Row) -> SecondTail:
    return SecondTail(row["tail_second"], row["total"], bucket_value(row["p50"]),
                      bucket_value(row["p99"]), bucket_value(row["top"]))


def stalled_buckets(per_second: DataFrame, rows: list[Row]) -> DataFrame | None:
    """The summed buckets of each (stage, tail kind)'s stall seconds
    (`tasks.analysis.tails.stalled_seconds` of its ``second`` rows); None when none stalled."""
    seconds: dict[tuple[str, str], list[SecondTail]] = {}
    for row in rows:
        if row["part"] == "second":
            seconds.setdefault((row["stage_id"], row["kind"]), []).append(_second_tail(row))
    picks = [(F.col("stage_id") == stage_id) & (F.col("kind") == kind)
             & F.col("tail_second").isin(*stalled)
             for (stage_id, kind), tails in sorted(seconds.items())
             if (stalled := stalled_seconds(tails))]
    if not picks:
        return None
    return (per_second.filter(reduce(lambda a, b: a | b, picks) & (F.col("count") > 0))
            .groupBy("stage_id", "kind", "bucket").agg(F.sum("count").alias("count"))
            .withColumn("part", F.lit("stalled")))


def aggregate_histograms(data: Dataset) -> list[Row]:
    """Summed bucket counts per (stage, kind, bucket) over the window (connect and
    subscribe: all of the stage), part "window"; for the tail kinds, each window second's
    percentile buckets (`second_tails`), part "second", and the summed buckets of its
    stall seconds, part "stalled" (`tasks.analysis.tails`).

    Every line is tagged with its stage (a broadcast join) and summed per (stage, kind,
    bucket, and the second for `TAIL_KINDS`): the processes of a stage merge in the
    partial sums, so that is the one large shuffle. Out-of-window sums stay in the group
    as null, not 0. Those sums are cached: the window and second rows are one query over
    them, and the stall seconds, known only from the second rows, a small second one.
    On bench_spark's hour of output: summing per file and window segment with no join (the
    shape before) took 16 s of Spark jobs but cannot tell seconds apart; that shape with
    the seconds kept, 48 s; this one, 25 s (bench/README.md)."""
    keep = F.col("valid") & (F.col("count") > 0)  # a valid row's kind is a contract one
    inside = _in_window() | F.col("kind").isin(*WHOLE_STAGE_KINDS)
    tail_second = F.when(F.col("kind").isin(*TAIL_KINDS), F.col("second"))
    per_second = (data.tagged()
                  .groupBy("stage_id", "kind", "bucket", tail_second.alias("tail_second"))
                  .agg(F.sum(F.when(keep & inside, F.col("count"))).alias("count"),
                       _malformed())).persist()
    try:
        window = (per_second.groupBy("stage_id", "kind", "bucket")
                  .agg(F.sum("count").alias("count"), F.sum("malformed").alias("malformed"))
                  .withColumn("part", F.lit("window")))
        seconds = second_tails(per_second).withColumn("part", F.lit("second"))
        rows = window.unionByName(seconds, allowMissingColumns=True).collect()
        stalled = stalled_buckets(per_second, rows)
        return rows + (stalled.collect() if stalled is not None else [])
    finally:
        per_second.unpersist()


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
    for row in sorted(rows, key=lambda r: (r["stage_id"], r["kind"] or "", r["part"],
                                           r["tail_second"] if r["part"] == "second"
                                           else r["bucket"] or 0)):
        stage_id, kind = row["stage_id"], row["kind"]
        if row["part"] == "second":
            sums.tails.setdefault(stage_id, {}).setdefault(kind, []).append(_second_tail(row))
        elif row["part"] == "stalled":
            sums.stalled.setdefault(stage_id, {}).setdefault(kind, {})[row["bucket"]] = row["count"]
        else:
            sums.flag("histograms", row)
            if row["count"]:
                kinds = sums.histograms.setdefault(stage_id, {})
                kinds.setdefault(kind, {})[row["bucket"]] = row["count"]


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

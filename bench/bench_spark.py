"""How fast is the Spark aggregation? `spark-submit spark/aggregate.py` on a generated raw
run of realistic size, against the 60 s bar, with the same aggregation done naively in one
Python process as the ratio to beat.

    .state/venv/bin/python bench/bench_spark.py [--stages 20] [--hosts 2] [--procs 8]
        [--seconds 3600] [--e2e-samples 52000000] [--master 'local[*]']
        [--java-options OPTS] [--keep DIR]

1. Generate: RUN_DIR/raw in the driver-output contract (`tasks.driver.output`, written
   with its own `write_csv`/`write_json`/`RawWriter`): `--stages` stages, each with
   `--procs` driver processes spread over `--hosts` hosts and a broker sampler, `--seconds`
   per-second rows in total per process (20 x 180 s = 1 hour: 10 s warm-up, 160 s measure
   window, 10 s drain). Stages step the publish rate from 10% to 100% of a peak, at QoS 0
   and QoS 1, sized so that the e2e histograms alone hold `--e2e-samples` latency samples
   (the CSVs hold sparse (second, kind, bucket, count) rows; the counts are the samples).
   Latencies are drawn per second and process from a lognormal with a slow tail, bucketed
   with `tasks.driver.histogram` (multinomial counts over the bucket probabilities); in two
   seconds of each window the host stalls: 10% of that second's e2e and PUBACK samples are
   about 100 ms late in every process (the per-second tails and stalls have work to do).
2. Spark: `spark-submit --master local[*] spark/aggregate.py --timings FILE` as the
   nightly DAG's SparkSubmitOperator and the CLI run it (tasks/steps/aggregate.py's
   SUBMIT_CONF: UI off, the C1-only JIT; `--java-options ''` for the JVM's defaults).
   Wall time from launch to exit against the bar, rows/s and samples/s, and the split:
   JVM start (launch to SparkSession ready), read (find files, plan the scans), Spark jobs
   (parse every CSV and sum: Spark reads lazily, so CSV parsing is inside this phase),
   metrics on the driver, write (JSON + Parquet), stop and JVM exit.
3. Naive: the same aggregation in this Python process with `csv` and dicts (window by
   timestamp, sum counters per second and bucket counts per kind, percentiles from the
   summed buckets with `tasks.driver.histogram`); its numbers must equal Spark's.

Everything printed is measured in the one run. The generated run is deleted at the end
unless `--keep DIR` names where to put it (an existing generated DIR is reused).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.special import ndtr

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from spark.stage_metrics import tidy  # noqa: E402
from tasks.analysis.tails import tails_of_seconds  # noqa: E402
from tasks.steps.aggregate import SUBMIT_CONF  # noqa: E402
from tasks.driver.histogram import bucket_bounds, bucket_of, summarize  # noqa: E402
from tasks.driver.output import (  # noqa: E402
    COUNTER_COLUMNS,
    COUNTERS_FILE,
    HISTOGRAM_COLUMNS,
    HISTOGRAMS_FILE,
    SAMPLER_COLUMNS,
    SAMPLER_FILE,
    STAGE_FILE,
    SUMMARY_FILE,
    RawWriter,
    write_csv,
    write_json,
)
from tasks.driver.spec import (  # noqa: E402
    BrokerEndpoint,
    ProcessSpec,
    PublisherSpec,
    SubscriberSpec,
)
from tasks.metrics import TAIL_KINDS  # noqa: E402

BAR_S = 60.0
RUN_ID = "bench-spark"
T0 = 1_900_000_000  # first stage start, Unix seconds
WARMUP_S, DRAIN_S, GAP_S = 10, 10, 20
PUBLISHER_RATE = 100  # msg/s per publisher client
CONNECT_RATE = 500.0  # paced connects per second and process (the driver's default)
MAX_US = 60_000_000
STALL_SECONDS, STALL_US, STALL_SHARE = (40, 120), 100_000, 0.1  # two host stalls per stage
BROKER_HOST = "broker1"
MARKER = "bench_spark.json"
COMPARED = ("delivered_rate", "published_rate", "messages_delivered", "lost", "connects_ok",
            "connect_rate", "broker_cpu_avg") + tuple(
    f"{kind}_latency_{stat}" for kind in ("e2e", "pub_ack", "pub_delay", "connect")
    for stat in ("avg", "p50", "p99", "p99_9", "max")) + tuple(
    f"{kind}_{name}" for kind in TAIL_KINDS
    for name in ("latency_p99_typical", "latency_p99_no_stall", "stall_seconds", "stall_longest"))


# ---- generator ---------------------------------------------------------------------------
def bucket_table() -> tuple[np.ndarray, np.ndarray]:
    """Every bucket up to MAX_US: (index, lower bound, upper bound) as arrays."""
    last = bucket_of(MAX_US)
    bounds = np.array([bucket_bounds(i) for i in range(last + 1)], dtype=float)
    return np.arange(last + 1), bounds


BUCKETS, BOUNDS = bucket_table()


def latency_probs(median_us: float, sigma: float, tail: float = 0.01,
                  tail_mult: float = 8.0) -> tuple[np.ndarray, np.ndarray]:
    """Bucket indexes and probabilities of a lognormal with a slower lognormal tail."""
    def cdf(x):
        with np.errstate(divide="ignore"):
            logx = np.log(np.maximum(x, 1e-9))
        body = ndtr((logx - math.log(median_us)) / sigma)
        slow = ndtr((logx - math.log(median_us * tail_mult)) / (sigma * 1.5))
        return (1 - tail) * body + tail * slow

    # integer microseconds: bucket [lower, upper) holds values lower .. upper-1
    probs = cdf(BOUNDS[:, 1] - 0.5) - cdf(BOUNDS[:, 0] - 0.5)
    keep = probs > 1e-12
    return BUCKETS[keep], probs[keep] / probs[keep].sum()


def mixture(body: tuple[np.ndarray, np.ndarray], stall: tuple[np.ndarray, np.ndarray],
            share: float) -> tuple[np.ndarray, np.ndarray]:
    """`body` with `share` of its samples drawn from `stall` instead (bucket index, prob)."""
    index = np.union1d(body[0], stall[0])
    probs = np.zeros(len(index))
    probs[np.searchsorted(index, body[0])] += (1 - share) * body[1]
    probs[np.searchsorted(index, stall[0])] += share * stall[1]
    return index, probs


KIND_ORDER = {k: i for i, k in enumerate(sorted(("connect", "e2e", "pub_ack", "pub_delay",
                                                  "subscribe")))}


def hist_rows(rng, seconds: np.ndarray, counts: np.ndarray, kind: str,
              dist: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Sparse histogram rows (second, kind order, bucket, count) of `counts[i]` samples in
    `seconds[i]`, drawn from `dist`."""
    index, probs = dist
    drawn = rng.multinomial(counts, probs)  # (seconds, buckets)
    sec_i, bucket_i = np.nonzero(drawn)
    return (seconds[sec_i], np.full(len(sec_i), KIND_ORDER[kind]), index[bucket_i],
            drawn[sec_i, bucket_i])


def write_histograms(path: Path, parts: list[tuple[np.ndarray, ...]]) -> int:
    """Rows sorted as RawWriter.histograms sorts them, written with its write_csv."""
    second, kind, bucket, count = (np.concatenate(c) for c in zip(*parts))
    order = np.lexsort((bucket, kind, second))
    names = np.array(sorted(KIND_ORDER, key=KIND_ORDER.get))
    write_csv(path, HISTOGRAM_COLUMNS, zip(second[order].tolist(), names[kind[order]].tolist(),
                                           bucket[order].tolist(), count[order].tolist()))
    return len(order)


class Generator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = np.random.default_rng(args.seed)
        self.stage_s = args.seconds // args.stages
        self.measure_s = self.stage_s - WARMUP_S - DRAIN_S
        if self.measure_s < 1:
            sys.exit(f"--seconds {args.seconds} over {args.stages} stages leaves no measure "
                     f"window after {WARMUP_S} s warm-up and {DRAIN_S} s drain")
        levels = [(i // 2 + 1) / math.ceil(args.stages / 2) for i in range(args.stages)]
        publishing_s = WARMUP_S + self.measure_s
        # e2e samples = sum(level x peak x publishing seconds); * 1.002 covers QoS 0 loss
        self.peak = args.e2e_samples * 1.002 / (sum(levels) * publishing_s)
        self.levels = levels
        self.rows = {"counters": 0, "histograms": 0, "broker": 0}
        self.samples = defaultdict(int)
        self.bytes = 0

    def hosts(self) -> list[tuple[str, int]]:
        n = self.args.procs
        return [(f"driver{p % self.args.hosts + 1}", p // self.args.hosts) for p in range(n)]

    def run(self, run_dir: Path) -> None:
        for i, level in enumerate(self.levels):
            self.stage(run_dir / "raw", i, level)
        for path in (run_dir / "raw").rglob("*"):
            if path.is_file():
                self.bytes += path.stat().st_size

    def stage(self, raw: Path, i: int, level: float) -> None:
        args = self.args
        qos = i % 2
        stage_id = f"s{i + 1:02d}_q{qos}_r{round(level * 100):03d}"
        start = T0 + i * (self.stage_s + GAP_S)
        windows = {"start": start, "measure_start": start + WARMUP_S,
                   "measure_end": start + WARMUP_S + self.measure_s, "end": start + self.stage_s}
        rate = level * self.peak  # msg/s over all processes
        per_proc = rate / args.procs
        publishers = max(1, round(per_proc / PUBLISHER_RATE))
        # latency grows with load; QoS 1 pays the PUBACK round trip
        median = 250.0 * (1 + 3 * level ** 2) * (1.4 if qos else 1.0)
        dists = {"e2e": latency_probs(median, 0.45),
                 "pub_ack": latency_probs(median * 0.8, 0.4),
                 "pub_delay": latency_probs(20 + 40 * level, 0.8, tail=0.002, tail_mult=50),
                 "connect": latency_probs(1500, 0.6), "subscribe": latency_probs(800, 0.5)}
        stage_dir = raw / stage_id
        receivers, processes = {}, []
        seconds = np.arange(windows["start"], windows["end"])
        sending = seconds < windows["measure_end"]
        for n, (host, proc) in enumerate(self.hosts()):
            first_index = n * publishers
            receivers.update({str(first_index + k): 1 for k in range(publishers)})
            processes.append({"host": host, "proc": proc})
            self.process(stage_dir / host / str(proc), stage_id, qos, windows, seconds,
                         sending, per_proc, publishers, first_index, dists, host, proc)
        self.broker(stage_dir, seconds, windows, level)
        write_json(stage_dir / STAGE_FILE, {
            "run_id": RUN_ID, "stage_id": stage_id, "scenario": f"ibm_fanin_q{qos}", "qos": qos,
            "clients": 2 * publishers * args.procs, "windows": windows,
            "target_publish_rate": publishers * args.procs * PUBLISHER_RATE,
            "expected_delivery_rate": publishers * args.procs * PUBLISHER_RATE,
            "receivers": receivers, "processes": processes, "broker_host": BROKER_HOST})

    def process(self, proc_dir: Path, stage_id: str, qos: int, windows: dict,
                seconds: np.ndarray, sending: np.ndarray, per_proc: float, publishers: int,
                first_index: int, dists: dict, host: str, proc: int) -> None:
        rng = self.rng
        published = np.where(sending, rng.poisson(per_proc, len(seconds)), 0)
        lost = rng.binomial(published, 1e-4) if qos == 0 else np.zeros_like(published)
        duplicated = rng.binomial(published, 1e-5) if qos == 1 else np.zeros_like(published)
        received = published - lost + duplicated
        acked = published if qos else np.zeros_like(published)
        overruns = rng.binomial(published, 2e-4)
        clients = 2 * publishers
        connect_s = math.ceil(clients / CONNECT_RATE)
        first_at = windows["start"] - connect_s - 2 + float(rng.uniform(0, 0.3))
        last_at = first_at + clients / CONNECT_RATE + float(rng.uniform(0.001, 0.05))
        connect_seconds = np.arange(int(first_at), int(last_at) + 1)
        connects = np.diff(np.linspace(0, clients, len(connect_seconds) + 1).round()).astype(int)
        subs = np.diff(np.linspace(0, publishers, len(connect_seconds) + 1).round()).astype(int)

        rows = {}
        for k, second in enumerate(connect_seconds.tolist()):
            rows[second] = dict.fromkeys(COUNTER_COLUMNS[1:], 0) | {"connects_ok": int(connects[k])}
        for k, second in enumerate(seconds.tolist()):
            rows[second] = {"published": int(published[k]), "acked": int(acked[k]),
                            "received": int(received[k]), "lost": int(lost[k]),
                            "duplicated": int(duplicated[k]), "out_of_order": 0, "errors": 0,
                            "inflight_full": 0, "connects_ok": 0, "connects_failed": 0,
                            "delay_overruns": int(overruns[k])}
        writer = RawWriter(proc_dir)
        writer.counters(rows)
        self.rows["counters"] += len(rows)

        # the host stalls STALL_SECONDS into the window: every process's e2e and PUBACK
        # samples of that second include messages delayed by about STALL_US
        stalled = np.isin(seconds - windows["measure_start"], STALL_SECONDS)
        parts = [hist_rows(rng, connect_seconds, connects, "connect", dists["connect"]),
                 hist_rows(rng, connect_seconds, subs, "subscribe", dists["subscribe"]),
                 hist_rows(rng, seconds, published, "pub_delay", dists["pub_delay"])]
        for kind, counts in (("e2e", received), ("pub_ack", acked) if qos else (None, None)):
            if kind:
                stall = mixture(dists[kind], latency_probs(STALL_US, 0.3), STALL_SHARE)
                parts += [hist_rows(rng, seconds[~stalled], counts[~stalled], kind, dists[kind]),
                          hist_rows(rng, seconds[stalled], counts[stalled], kind, stall)]
        self.rows["histograms"] += write_histograms(proc_dir / HISTOGRAMS_FILE, parts)
        for kind, counts in (("connect", connects), ("subscribe", subs), ("e2e", received),
                             ("pub_delay", published), ("pub_ack", acked)):
            self.samples[kind] += int(counts.sum())

        totals = {c: int(sum(r[c] for r in rows.values())) for c in COUNTER_COLUMNS[1:]}
        spec = ProcessSpec(
            run_id=RUN_ID, stage_id=stage_id, host=host, proc=proc,
            broker=BrokerEndpoint(host=BROKER_HOST, port=1883),
            publishers=tuple(PublisherSpec(f"p{first_index + k}", f"bench/{first_index + k}",
                                           first_index + k, qos=qos, rate=PUBLISHER_RATE)
                             for k in range(publishers)),
            subscribers=tuple(SubscriberSpec(f"s{first_index + k}", (f"bench/{first_index + k}",),
                                             qos=qos) for k in range(publishers)),
            warmup_s=WARMUP_S, measure_s=windows["measure_end"] - windows["measure_start"],
            drain_s=DRAIN_S, connect_rate=CONNECT_RATE)
        sent = [int(x) for x in np.diff(np.linspace(0, totals["published"], publishers + 1)
                                        .round())]
        writer.summary({
            "run_id": RUN_ID, "stage_id": stage_id, "host": host, "proc": proc, "status": "ok",
            "windows": windows, "totals": totals,
            "unique_received": totals["received"] - totals["duplicated"], "missing_at_end": 0,
            "last_seq": {str(first_index + k): sent[k] for k in range(publishers)},
            "unacked_at_end": 0,
            "qos_judgement": {"by_qos": {str(q): {"unique": (totals["received"] -
                                                            totals["duplicated"]) if q == qos
                                                  else 0, "missing": 0, "duplicated": 0,
                                                  "out_of_order": 0} for q in (0, 1, 2)},
                              "violations": 0, "publishers_with_anomalies": []},
            "connect_phase": {"clients": clients, "connected": clients,
                              "first_connect_at": first_at, "last_connack_at": last_at,
                              "duration_s": round(last_at - first_at, 6)},
            "clients": {"publishers": publishers, "subscribers": publishers},
            "versions": {"paho_mqtt": "2.1.0", "python": "3.11.2"},
            "clock": {"source": "time.time_ns", "offset_s": None}, "fd_limit": 1048576,
            "elapsed_s": round(last_at - first_at + self.stage_s + 3, 3), "config": spec.echo(),
        })

    def broker(self, stage_dir: Path, seconds: np.ndarray, windows: dict, level: float) -> None:
        cpu = np.clip(self.rng.normal(85 * level, 3, len(seconds)), 0, None).round(2)
        rss = (40_000_000 + 60_000_000 * level + self.rng.normal(0, 1e6, len(seconds))).astype(int)
        path = stage_dir / BROKER_HOST / "sampler" / SAMPLER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        n = len(seconds)  # one broker process: user CPU only, 8 threads, 100 files, 50 switches/s
        write_csv(path, SAMPLER_COLUMNS, zip(seconds.tolist(), cpu.tolist(), rss.tolist(),
                                             cpu.tolist(), [0.0] * n, [1] * n, [8] * n,
                                             [100] * n, [50.0] * n))
        self.rows["broker"] += len(seconds)


# ---- naive: one Python process -----------------------------------------------------------
def naive(run_dir: Path) -> dict[str, dict]:
    """The job's arithmetic with csv + dicts: delivered/published per measure second, summed
    buckets per kind (connect and subscribe over the whole stage), broker CPU in the window,
    loss from the summaries, connection rate from connect_phase."""
    results = {}
    for stage_dir in sorted(p for p in (run_dir / "raw").iterdir() if p.is_dir()):
        stage = json.loads((stage_dir / STAGE_FILE).read_text())
        w = stage["windows"]
        lo, hi = w["measure_start"], w["measure_end"]
        delivered = published = connects_ok = 0
        hists: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        by_second: dict[tuple[str, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
        expected = unique = connected = 0
        firsts, lasts = [], []
        for p in stage["processes"]:
            proc_dir = stage_dir / p["host"] / str(p["proc"])
            summary = json.loads((proc_dir / SUMMARY_FILE).read_text())
            for index, seq in summary["last_seq"].items():
                expected += seq * stage["receivers"][index]
            unique += summary["unique_received"]
            phase = summary["connect_phase"]
            connected += phase["connected"]
            firsts.append(phase["first_connect_at"])
            lasts.append(phase["last_connack_at"])
            with open(proc_dir / COUNTERS_FILE, newline="") as handle:
                reader = csv.reader(handle)
                next(reader)
                for row in reader:
                    second = int(row[0])
                    connects_ok += int(row[9])
                    if lo <= second < hi:
                        delivered += int(row[3]) - int(row[5])
                        published += int(row[1])
            with open(proc_dir / HISTOGRAMS_FILE, newline="") as handle:
                reader = csv.reader(handle)
                next(reader)
                for second, kind, bucket, count in reader:
                    if kind in ("connect", "subscribe") or lo <= int(second) < hi:
                        hists[kind][int(bucket)] += int(count)
                    if kind in TAIL_KINDS and lo <= int(second) < hi:
                        by_second[(kind, int(second))][int(bucket)] += int(count)
        cpu = []
        with open(stage_dir / BROKER_HOST / "sampler" / SAMPLER_FILE, newline="") as handle:
            reader = csv.reader(handle)
            next(reader)
            for second, cpu_pct, *_ in reader:
                if lo <= int(second) < hi:
                    cpu.append(float(cpu_pct))
        metrics = {"delivered_rate": delivered / (hi - lo),
                   "published_rate": published / (hi - lo),
                   "messages_delivered": delivered, "lost": max(0, expected - unique),
                   "connects_ok": connects_ok,
                   "connect_rate": connected / (max(lasts) - min(firsts)),
                   "broker_cpu_avg": sum(cpu) / len(cpu)}
        for kind, counts in hists.items():
            summary = summarize(dict(sorted(counts.items())))  # the job sums in bucket order
            for stat in ("avg", "p50", "p99", "p99_9", "max"):
                metrics[f"{kind}_latency_{stat}"] = summary[stat]
        for kind in TAIL_KINDS:
            metrics.update(tails_of_seconds(kind, {second: h for (k, second), h
                                                   in by_second.items() if k == kind}))
        results[stage_dir.name] = metrics
    return results


# ---- running -----------------------------------------------------------------------------
def spark_submit(run_dir: Path, out: Path, timings: Path, master: str,
                 java_options: str) -> tuple[float, float, str]:
    """Launch the job as tasks/steps/aggregate.py does; (launch Unix time, wall s, stdout)."""
    binary = Path(sys.executable).parent / "spark-submit"
    argv = [str(binary if binary.exists() else shutil.which("spark-submit")), "--master", master]
    for key, value in SUBMIT_CONF.items():  # the DAG's and CLI's, the JVM's options as asked
        if key == "spark.driver.extraJavaOptions":
            value = java_options
        if value:
            argv += ["--conf", f"{key}={value}"]
    argv += [str(REPO / "spark" / "aggregate.py"), "--run-dir", str(run_dir), "--out", str(out),
             "--timings", str(timings)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    launched, t0 = time.time(), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        sys.exit(f"spark-submit exited {done.returncode}:\n{done.stderr[-3000:]}")
    return launched, wall, done.stdout.strip()


def compare(spark_doc: dict, naive_results: dict) -> list[str]:
    """Differences between Spark's and the naive metrics (after the job's rounding)."""
    diffs = []
    stages = {s["stage_id"]: s for s in spark_doc["stages"]}
    if sorted(stages) != sorted(naive_results):
        return [f"stages differ: {sorted(stages)} vs {sorted(naive_results)}"]
    for stage_id, mine in sorted(naive_results.items()):
        theirs = stages[stage_id]
        if theirs["status"] != "ok":
            diffs.append(f"{stage_id}: Spark status {theirs['status']}: {theirs['problems']}")
        for name in COMPARED:
            if name.startswith("pub_ack") and name not in mine and theirs["metrics"][name] is None:
                continue  # QoS 0: no acks
            if tidy(mine.get(name)) != theirs["metrics"][name]:
                diffs.append(f"{stage_id} {name}: naive {tidy(mine.get(name))} "
                             f"Spark {theirs['metrics'][name]}")
    return diffs


def generated(run_dir: Path, args: argparse.Namespace) -> bool:
    marker = run_dir / MARKER
    keys = ("stages", "hosts", "procs", "seconds", "e2e_samples", "seed")
    want = {k: getattr(args, k) for k in keys}
    return marker.exists() and json.loads(marker.read_text()).get("args") == want


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, default=20)
    parser.add_argument("--hosts", type=int, default=2, help="driver hosts")
    parser.add_argument("--procs", type=int, default=8, help="driver processes in all")
    parser.add_argument("--seconds", type=int, default=3600,
                        help="per-second rows per process, all stages together")
    parser.add_argument("--e2e-samples", type=int, default=52_000_000,
                        help="e2e latency samples in the histogram counts, all stages")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--java-options", default=SUBMIT_CONF["spark.driver.extraJavaOptions"],
                        help="the driver JVM's options (spark.driver.extraJavaOptions; default: "
                             f"{SUBMIT_CONF['spark.driver.extraJavaOptions']}, as the DAG and the "
                             "CLI run the job, tasks/steps/aggregate.py's SUBMIT_CONF; '' for the "
                             "JVM's defaults)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="generate into DIR and keep it (reused when it matches)")
    args = parser.parse_args(argv)

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(load_before)}")
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench_spark_"))
    run_dir = base / "run"
    marker = base / MARKER
    try:
        if args.keep and generated(base, args):
            info = json.loads(marker.read_text())
            print(f"input: reusing {run_dir} (generated in {info['generate_s']:.1f} s)")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
            gen, t0 = Generator(args), time.monotonic()
            gen.run(run_dir)
            info = {"args": {k: getattr(args, k) for k in
                             ("stages", "hosts", "procs", "seconds", "e2e_samples", "seed")},
                    "generate_s": time.monotonic() - t0, "rows": gen.rows,
                    "samples": dict(gen.samples), "bytes": gen.bytes,
                    "stage_s": gen.stage_s, "measure_s": gen.measure_s}
            marker.write_text(json.dumps(info, indent=1))
            print(f"input: generated {run_dir} in {info['generate_s']:.1f} s")
        rows, samples = info["rows"], info["samples"]
        total_rows, total_samples = sum(rows.values()), sum(samples.values())
        print(f"  {args.stages} stages x {info['stage_s']} s ({WARMUP_S} s warm-up, "
              f"{info['measure_s']} s measure, {DRAIN_S} s drain), {args.procs} driver processes "
              f"on {args.hosts} hosts: {args.stages * info['stage_s']} s per process")
        print(f"  {total_rows:,} CSV rows ({rows['histograms']:,} histogram, "
              f"{rows['counters']:,} counter, {rows['broker']:,} broker), "
              f"{info['bytes'] / 1e6:.0f} MB")
        print(f"  {total_samples:,} latency samples in the histogram counts: "
              + ", ".join(f"{k} {v:,}" for k, v in sorted(samples.items())))

        out, timings = base / "out", base / "timings.json"
        shutil.rmtree(out, ignore_errors=True)
        launched, wall, stdout = spark_submit(run_dir, out, timings, args.master,
                                              args.java_options)
        doc = json.loads((out / "stage_metrics.json").read_text())
        phases = json.loads(timings.read_text())
        ends, ph = phases["ends_at"], phases["phases_s"]
        jvm = ends["session"] - launched
        exit_s = wall - (ends["stop"] - launched)
        verdict = "PASS" if wall < BAR_S else "FAIL"
        jvm_flags = (f" --conf spark.driver.extraJavaOptions='{args.java_options}'"
                     if args.java_options else "")
        print(f"\nspark-submit --master {args.master}{jvm_flags} spark/aggregate.py: {wall:.1f} s "
              f"wall (bar {BAR_S:.0f} s): {verdict}")
        print(f"  {total_rows / wall:,.0f} rows/s, {total_samples / wall:,.0f} samples/s "
              f"(over the whole wall time)")
        spark_part = ph["read"] + ph["spark_jobs"]
        print(f"  {total_rows / spark_part:,.0f} rows/s, {total_samples / spark_part:,.0f} "
              f"samples/s over read + Spark jobs ({spark_part:.1f} s)")
        split = [("JVM start (launch to SparkSession ready)", jvm),
                 ("  of which Python job start + pyspark import", ends["imports"] - launched),
                 ("  of which SparkContext + session", ph["session"]),
                 ("read: find files, plan the scans", ph["read"]),
                 ("aggregate: Spark jobs (CSV parse + sums)", ph["spark_jobs"]),
                 ("aggregate: metrics on the driver", ph["metrics"]),
                 ("write: JSON + Parquet", ph["write"]),
                 ("stop + JVM exit", ph["stop"] + exit_s)]
        for name, seconds in split:
            print(f"  {name:<46} {seconds:6.1f} s")
        statuses = defaultdict(int)
        for stage in doc["stages"]:
            statuses[stage["status"]] += 1
        said = stdout.splitlines()[-1].split("; ", 1)[-1] if stdout else ""
        print(f"  stages: {dict(statuses)}; the job's own timing line: {said}")

        t0 = time.monotonic()
        naive_results = naive(run_dir)
        naive_s = time.monotonic() - t0
        diffs = compare(doc, naive_results)
        print(f"\nnaive (one Python process, csv + dicts): {naive_s:.1f} s, "
              f"{total_rows / naive_s:,.0f} rows/s")
        print(f"  agreement on {len(COMPARED)} metrics x {len(naive_results)} stages "
              f"(delivered/published rate, loss, connect rate, broker CPU, per-second tails "
              f"and stalls, latency avg/p50/p99/"
              f"p99.9/max): {'equal' if not diffs else f'{len(diffs)} DIFFER'}")
        for line in diffs[:20]:
            print(f"    {line}")
        print(f"  naive / Spark wall time: {naive_s / wall:.2f}")
        example = doc["stages"][-1]
        m = example["metrics"]
        print(f"  e.g. {example['stage_id']}: delivered {m['delivered_rate']:,.1f} msg/s, "
              f"e2e p99 {m['e2e_latency_p99']:,.1f} us ({m['e2e_stall_seconds']:.0f} stall "
              f"seconds), without them {m['e2e_latency_p99_no_stall']:,.1f} us, connect rate "
              f"{m['connect_rate']:,.1f} conn/s")
        load_after = Path("/proc/loadavg").read_text().split()[:3]
        print(f"\nload average after: {' '.join(load_after)}")
        return 0 if verdict == "PASS" and not diffs else 1
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

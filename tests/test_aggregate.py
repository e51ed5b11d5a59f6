"""spark/aggregate.py end to end: raw run directories built from known samples with the
driver's own writers, aggregated by a real ``spark-submit``, checked against the samples.

One session-scoped fixture builds the run and submits the job twice (the JVM is the slow
part); every test reads the results of those two runs.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tasks.driver.histogram import MAX_RELATIVE_ERROR, bucket_bounds, bucket_of, percentile  # noqa: E402
from tasks.driver.output import (  # noqa: E402
    COUNTER_COLUMNS,
    COUNTERS_FILE,
    HISTOGRAMS_FILE,
    HOST_COLUMNS,
    HOST_COLUMNS_BEFORE,
    HOST_FILE,
    SAMPLER_COLUMNS,
    SAMPLER_FILE,
    STAGE_FILE,
    RawWriter,
    write_csv,
    write_json,
)
from spark.stage_files import read_samples  # noqa: E402
from tasks.analysis.policy import Policy, judged_metrics  # noqa: E402
from tasks.metrics import (  # noqa: E402
    BROKER_CPU_SERIES,
    LATENCY_STATS,
    METRICS,
    TAIL_KINDS,
    bucket_series,
    p99_per_s_series,
)

# runs Spark
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark-aggregate")]

RUN_ID = "run-test"
START = 1_800_000_000
WINDOWS = {"start": START, "measure_start": START + 2, "measure_end": START + 7,
           "end": START + 8}
MEASURE = list(range(WINDOWS["measure_start"], WINDOWS["measure_end"]))
MEASURE_S = len(MEASURE)
CONNECT_SECONDS = (START - 2, START - 1)  # connections happen before the stage starts
OUTSIDE = (START, START + 1, START + 7)  # warm-up and drain seconds: must be ignored
EMPTY_SECOND = MEASURE[2]  # no process writes a row for it: it counts as 0, not missing
HUGE = 10**9  # counter values outside the window
HUGE_US = 60_000_000  # latencies outside the window
HOSTS, PROCS = ("h1", "h2"), (0, 1)
RECEIVERS = 2  # subscribers that get each message
SHUFFLED = ("h2", 1)  # this process's counters.csv rows are written out of order
# provisioning's record of each host's clock: h1's is 50 ms off, beyond what it trusts
CLOCKS = {"h1": {"clock_offset_s": 0.05, "clock_uncertainty_s": 0.0001, "clock_trusted": False},
          "h2": {"clock_offset_s": 0.0002, "clock_uncertainty_s": 0.0001, "clock_trusted": True}}
CONNECTED = 10  # per process, in connect_phase (2 x 5 CONNACKs in the counters)
# connect_phase times per (host, proc), after CONNECT_SECONDS[0]: exact binary fractions.
# The stage's connect phase runs from the earliest first CONNECT (h1/0) to the latest last
# CONNACK (h2/0), 1.25 s, across hosts: 4 x 10 / 1.25 = 32 conn/s (the per-second
# CONNACK counters would say 40 / 2 s = 20).
FIRST_AT = {("h1", 0): 0.25, ("h1", 1): 0.375, ("h2", 0): 0.5, ("h2", 1): 0.625}
LAST_AT = {("h1", 0): 1.0, ("h1", 1): 1.125, ("h2", 0): 1.5, ("h2", 1): 1.25}
CONNECT_RATE = 32.0
NO_PHASE = ("h1", 0)  # in stage s5_no_phase, this summary has no connect_phase (nor CPU)
# publish_cpu (cpu_s, wall_s) per process: h1/1 is the busiest, at 62.5% of a core.
PUBLISH_CPU = {("h1", 0): (1.0, 4.0), ("h1", 1): (2.5, 4.0), ("h2", 0): (0.5, 2.0),
               ("h2", 1): (3.0, 8.0)}
DRIVER_CPU_MAX = 62.5
# The % of its publish phase the CPUs each process may run on were idle: h1/0's least,
# on the broker's host (h1); of h2's, apart from it, h2/0's
CPUS_IDLE = {("h1", 0): 5.0, ("h1", 1): 7.5, ("h2", 0): 8.0, ("h2", 1): 60.0}
# The CPUs each process may run on: h1's two share CPU 1 (the broker kept on CPU 0), 25% +
# 62.5% of it; h2's two share CPUs 0-1, 25% + 37.5% over two.
CPUS = {("h1", 0): [1], ("h1", 1): [1], ("h2", 0): [0, 1], ("h2", 1): [0, 1]}
DRIVERS_CPUS_USED = {"h1": 87.5, "h2": 31.25}
# One second of the window stalls: a process gets 60 e2e samples 200 ms late in it, enough
# to carry the window's p99 (60 of about 4,000 samples) but one second of four.
STALL = ("h1", 0)
STALL_SECOND = MEASURE[3]
STALL_US, STALL_SAMPLES = 200_000, 60


@dataclass
class Expect:
    """What the samples say, computed here independently of the job."""

    per_second: dict[int, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    totals: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    samples: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    # window samples per kind and second, every process together
    by_second: dict[str, dict[int, list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    last_seq_total: int = 0
    unique: int = 0
    cpu: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    pace: list[int] = field(default_factory=list)
    steal: list[float] = field(default_factory=list)
    connect_phases: list[dict] = field(default_factory=list)


# ---- building raw run directories from known samples -------------------------------------
class Proc:
    """One driver process's counters, histograms and summary, built from raw samples."""

    def __init__(self, host: str, proc: int, expect: Expect) -> None:
        self.host, self.proc, self.expect = host, proc, expect
        self.counters: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.hist: dict[tuple[int, str], dict[int, int]] = defaultdict(dict)

    def count(self, second: int, **values: int) -> None:
        for name, n in values.items():
            self.counters[second][name] += n
            self.expect.totals[name] += n
        if second in MEASURE:
            # delivered = received minus duplicates (tasks/driver/output.py)
            self.expect.per_second[second][0] += values.get("received", 0) - values.get("duplicated", 0)
            self.expect.per_second[second][1] += values.get("published", 0)

    def observe(self, second: int, kind: str, values, counted: bool) -> None:
        hist = self.hist[(second, kind)]
        for value in values:
            bucket = bucket_of(int(value))
            hist[bucket] = hist.get(bucket, 0) + 1
            if counted:
                self.expect.samples[kind].append(int(value))
                if second in MEASURE:
                    self.expect.by_second[kind][second].append(int(value))


def fill(proc: Proc, rng: np.random.Generator, traffic: bool) -> None:
    for second in CONNECT_SECONDS:
        proc.count(second, connects_ok=5, connects_failed=1, errors=1)
        proc.observe(second, "connect", rng.integers(300, 40_000, 5), True)
        proc.observe(second, "subscribe", rng.integers(100, 5_000, 2), True)
    for second in OUTSIDE:
        proc.count(second, published=HUGE, acked=HUGE, received=HUGE, duplicated=3)
        proc.observe(second, "e2e", [HUGE_US] * 40, False)
        proc.observe(second, "pub_ack", [HUGE_US] * 40, False)
    for second in MEASURE:
        if second == EMPTY_SECOND or not traffic:
            continue
        received, published = (int(n) for n in rng.integers(700, 1300, 2))
        proc.count(second, published=published, acked=published, received=received,
                   duplicated=1, out_of_order=2, inflight_full=1, delay_overruns=4)
        proc.observe(second, "e2e", rng.lognormal(7.5, 0.7, 250).astype(int) + 1, True)
        proc.observe(second, "pub_ack", rng.lognormal(6.5, 0.5, 120).astype(int) + 1, True)
        if second == STALL_SECOND and (proc.host, proc.proc) == STALL:
            proc.observe(second, "e2e", [STALL_US] * STALL_SAMPLES, True)


def connect_phase(proc: Proc) -> dict:
    first = CONNECT_SECONDS[0] + FIRST_AT[(proc.host, proc.proc)]
    last = CONNECT_SECONDS[0] + LAST_AT[(proc.host, proc.proc)]
    phase = {"clients": CONNECTED + 2, "connected": CONNECTED, "first_connect_at": first,
             "last_connack_at": last, "duration_s": round(last - first, 6)}
    proc.expect.connect_phases.append(phase)
    return phase


def summary(proc: Proc, stage_id: str, rng: np.random.Generator) -> dict:
    last_seq = {str(2 * proc.proc + 10 * HOSTS.index(proc.host) + i): int(rng.integers(4000, 6000))
                for i in range(2)}
    expected = sum(last_seq.values()) * RECEIVERS
    unique = expected - int(rng.integers(0, 20))
    proc.expect.last_seq_total += sum(last_seq.values())
    proc.expect.unique += unique
    return {"run_id": RUN_ID, "stage_id": stage_id, "host": proc.host, "proc": proc.proc,
            "status": "ok", "windows": WINDOWS, "unique_received": unique,
            "last_seq": last_seq, "clock": {"source": "time.time_ns"},
            "connect_phase": connect_phase(proc),
            "publish_cpu": dict(zip(("cpu_s", "wall_s", "cpus_idle_pct"),
                                    (*PUBLISH_CPU[(proc.host, proc.proc)],
                                     CPUS_IDLE[(proc.host, proc.proc)]))),
            "cpus": CPUS[(proc.host, proc.proc)]}


def write_process(proc_dir: Path, proc: Proc, document: dict) -> None:
    writer = RawWriter(proc_dir)
    if (proc.host, proc.proc) == SHUFFLED:
        rows = [[s] + [proc.counters[s][c] for c in COUNTER_COLUMNS[1:]] for s in proc.counters]
        random.Random(7).shuffle(rows)
        write_csv(proc_dir / COUNTERS_FILE, COUNTER_COLUMNS, rows)
    else:
        writer.counters(proc.counters)
    writer.histograms(proc.hist)
    writer.summary(document)


def write_broker(stage_dir: Path, rng: np.random.Generator, expect: Expect,
                 old_host: bool = False) -> None:
    # second, cpu %, rss, user %, sys %, processes, threads, open files, context switches/s
    rows = [(s, 999.0, 10**12, 999.0, 0.0, 1, 4, 10, 5.0) for s in OUTSIDE]
    for second in MEASURE:
        cpu, rss = round(float(rng.uniform(20, 90)), 2), int(rng.integers(10**7, 10**8))
        rows.append((second, cpu, rss, cpu, 0.0, 1, 4, 10, 5.0))
        expect.cpu.append(cpu)
        expect.rss.append(rss)
    (stage_dir / "h1" / "sampler").mkdir(parents=True)
    write_csv(stage_dir / "h1" / "sampler" / SAMPLER_FILE, SAMPLER_COLUMNS, rows)
    # the host: second, cpu %, cpus, memory, rx, tx, pace (ns), steal (%); a sampler from
    # before the pace was read writes the same columns but the last two
    columns = HOST_COLUMNS_BEFORE[0] if old_host else HOST_COLUMNS
    host = [(s, 999.0, 2, 10**9, 0, 0, 1, 99.0) for s in OUTSIDE]
    for second in MEASURE:
        pace, steal = int(rng.integers(200_000, 400_000)), round(float(rng.uniform(0, 30)), 2)
        host.append((second, 50.0, 2, 10**9, 0, 0, pace, steal))
        expect.pace.append(pace)
        expect.steal.append(steal)
    write_csv(stage_dir / "h1" / "sampler" / HOST_FILE, columns,
              [row[:len(columns)] for row in host])


def build_stage(raw: Path, stage_id: str, seed: int, traffic: bool = True,
                skip: tuple[str, int] | None = None,
                no_phase: tuple[str, int] | None = None,
                hosts: tuple[str, ...] = HOSTS) -> Expect:
    """2 processes on each of `hosts` (the broker's host is h1); `skip` is listed in
    stage.json but writes nothing; the summary of `no_phase` has no connect_phase."""
    rng, expect = np.random.default_rng(seed), Expect()
    stage_dir = raw / stage_id
    publishers = []
    for host in hosts:
        for number in PROCS:
            proc = Proc(host, number, expect if (host, number) != skip else Expect())
            fill(proc, rng, traffic)
            document = summary(proc, stage_id, rng)
            publishers += list(document["last_seq"])
            if (host, number) == no_phase:
                del document["connect_phase"], document["publish_cpu"]
            if (host, number) != skip:
                write_process(stage_dir / host / str(number), proc, document)
    write_broker(stage_dir, rng, expect, old_host=no_phase is not None)
    write_json(stage_dir / STAGE_FILE, {
        "run_id": RUN_ID, "stage_id": stage_id, "scenario": "fanout", "qos": 1,
        "clients": 16, "windows": WINDOWS, "target_publish_rate": 4000,
        "expected_delivery_rate": 8000, "receivers": {p: RECEIVERS for p in publishers},
        "processes": [{"host": h, "proc": p} for h in hosts for p in PROCS],
        "broker_host": "h1", "sampler": {"processes": "pid 1", "host": True},
    })
    return expect


def truncate(path: Path, n_bytes: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-n_bytes])


# ---- running the job ---------------------------------------------------------------------
def submit(run_dir: Path, out: Path, pythonpath: bool) -> subprocess.Popen:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    if pythonpath:  # as the pipeline runs it; without it the job finds the repo itself
        env["PYTHONPATH"] = str(ROOT)
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
               "--driver-java-options", "-XX:TieredStopAtLevel=1",  # fast JVM start
               str(ROOT / "spark" / "aggregate.py"), "--run-dir", str(run_dir),
               "--out", str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=run_dir)


def finish(job: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stdout + stderr
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


@dataclass
class Run:
    expect: dict[str, Expect]
    doc: dict
    stages: dict[str, dict]
    json_bytes: tuple[bytes, bytes]
    out: Path
    results: list[subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def run(tmp_path_factory) -> Run:
    run_dir = tmp_path_factory.mktemp("run")
    raw = run_dir / "raw"
    expect = {
        "s1_ok": build_stage(raw, "s1_ok", 1),
        "s2_missing": build_stage(raw, "s2_missing", 2, skip=("h2", 1)),
        "s3_zero": build_stage(raw, "s3_zero", 3, traffic=False),
        "s4_truncated": build_stage(raw, "s4_truncated", 4),
        "s5_no_phase": build_stage(raw, "s5_no_phase", 5, no_phase=NO_PHASE),
        "s6_broker_host": build_stage(raw, "s6_broker_host", 6, hosts=("h1",)),
    }
    for host, clock in CLOCKS.items():
        (run_dir / "hosts").mkdir(exist_ok=True)
        (run_dir / "hosts" / f"{host}.json").write_text(json.dumps({"host": host, **clock}))
    # cut the last row (a drain second) of one file mid-way: two columns and the newline
    truncate(raw / "s4_truncated" / "h1" / "0" / COUNTERS_FILE, 5)
    # four bad lines in a histogram file: a field that is no number, a row one field short,
    # a kind the contract has not, a negative bucket (it read as a negative latency)
    hist = raw / "s4_truncated" / "h2" / "0" / HISTOGRAMS_FILE
    header, rest = hist.read_text().split("\n", 1)
    hist.write_text(f"{header}\n{MEASURE[0]},e2e,x7,3\n{MEASURE[0]},e2e,100\n"
                    f"{MEASURE[0]},e2e2,100,3\n{MEASURE[0]},e2e,-5,3\n{rest}")
    outs = [run_dir / "out1", run_dir / "out2"]
    # two independent submits at once (one with PYTHONPATH as the pipeline sets it, one
    # without): their outputs must be byte-identical
    jobs = [submit(run_dir, outs[0], True), submit(run_dir, outs[1], False)]
    results = [finish(job) for job in jobs]
    json_bytes = tuple((o / "stage_metrics.json").read_bytes() for o in outs)
    doc = json.loads(json_bytes[0])
    return Run(expect, doc, {s["stage_id"]: s for s in doc["stages"]}, json_bytes, outs[0],
               results)


# ---- tests -------------------------------------------------------------------------------
def _tolerance(value: float) -> float:
    """The bucket precision: MAX_RELATIVE_ERROR plus one bucket's width at that value."""
    lower, upper = bucket_bounds(bucket_of(int(value)))
    return value * MAX_RELATIVE_ERROR + (upper - lower) + 0.5


def test_document_shape(run: Run):
    assert run.doc["run_id"] == RUN_ID
    assert [s["stage_id"] for s in run.doc["stages"]] == sorted(run.expect)
    for stage in run.doc["stages"]:
        assert set(stage) == {"stage_id", "scenario", "status", "problems", "metrics", "series"}
        assert set(stage["metrics"]) == set(METRICS)
        assert set(stage["series"]) >= {"seconds", "delivered_per_s", "published_per_s",
                                         "stage_seconds", "stage_delivered_per_s"}
        series = stage["series"]
        whole = dict(zip(series["stage_seconds"], series["stage_delivered_per_s"]))
        # the whole-stage series (for charts) holds the window series and the warm-up too
        assert [whole[s] for s in series["seconds"]] == series["delivered_per_s"]
        assert series["stage_seconds"][0] < series["seconds"][0]
        assert stage["scenario"] == "fanout"


def test_rates_are_window_sums_over_measure_seconds(run: Run):
    stage, expect = run.stages["s1_ok"], run.expect["s1_ok"]
    delivered = sum(v[0] for v in expect.per_second.values())
    published = sum(v[1] for v in expect.per_second.values())
    metrics = stage["metrics"]
    assert stage["status"] == "ok", stage["problems"]
    assert metrics["messages_delivered"] == delivered
    assert metrics["delivered_rate"] == delivered / MEASURE_S
    assert metrics["published_rate"] == published / MEASURE_S
    assert metrics["target_rate"] == 4000
    assert metrics["expected_delivery_rate"] == 8000  # each message reaches 2 subscribers
    assert metrics["achieved_ratio"] == pytest.approx(delivered / MEASURE_S / 8000, rel=1e-9)
    # backlog: each message owes 8000 / 4000 = 2 deliveries; running sum of what is owed
    owed, backlog = 0, []
    for second in MEASURE:
        got, sent = expect.per_second.get(second, (0, 0))
        owed += 2 * sent - got
        backlog.append(owed)
    assert metrics["backlog_max"] == max(0, *backlog)
    assert metrics["backlog_slope"] == pytest.approx(
        np.polyfit(range(len(backlog)), backlog, 1)[0], abs=1e-6)


def test_series_cover_every_measure_second(run: Run):
    series, expect = run.stages["s1_ok"]["series"], run.expect["s1_ok"]
    assert series["seconds"] == MEASURE
    assert series["delivered_per_s"] == [expect.per_second[s][0] for s in MEASURE]
    assert series["published_per_s"] == [expect.per_second[s][1] for s in MEASURE]
    assert series["delivered_per_s"][MEASURE.index(EMPTY_SECOND)] == 0
    values = np.array(series["delivered_per_s"], dtype=float)
    cv = run.stages["s1_ok"]["metrics"]["throughput_cv"]
    assert cv == pytest.approx(values.std() / values.mean(), rel=1e-8)


def test_warmup_and_drain_are_excluded(run: Run):
    metrics = run.stages["s1_ok"]["metrics"]
    assert metrics["messages_delivered"] < HUGE
    assert max(run.stages["s1_ok"]["series"]["delivered_per_s"]) < HUGE
    assert metrics["e2e_latency_max"] < HUGE_US and metrics["pub_ack_latency_max"] < HUGE_US
    assert metrics["broker_cpu_max"] < 999


@pytest.mark.parametrize("kind", ["e2e", "pub_ack", "connect", "subscribe"])
def test_percentiles_match_numpy_within_bucket_precision(run: Run, kind: str):
    metrics, samples = run.stages["s1_ok"]["metrics"], run.expect["s1_ok"].samples[kind]
    assert samples
    for stat, pct in (("p50", 50), ("p95", 95), ("p99", 99), ("p99_9", 99.9), ("max", 100)):
        got = metrics[f"{kind}_latency_{stat}"]
        # numpy's order statistics around the percentile, widened by the bucket precision
        low, high = (float(np.percentile(samples, pct, method=m)) for m in ("lower", "higher"))
        assert low - _tolerance(low) <= got <= high + _tolerance(high), (stat, got, low, high)
        # and the nearest-rank sample itself, within the bucket midpoint's relative error
        rank = max(1, math.ceil(Fraction(str(pct)) * len(samples) / 100))
        nearest = sorted(samples)[rank - 1]
        assert abs(got - nearest) <= MAX_RELATIVE_ERROR * got, (stat, got, nearest)
    mean = float(np.mean(samples))
    assert abs(metrics[f"{kind}_latency_avg"] - mean) <= _tolerance(mean)
    std = float(np.std(samples))
    assert metrics[f"{kind}_latency_stddev"] == pytest.approx(std, rel=0.02, abs=1.0)


def _nearest(values: list[int], pct: float) -> int:
    return sorted(values)[max(1, math.ceil(Fraction(str(pct)) * len(values) / 100)) - 1]


def test_per_second_tails_leave_the_stall_out_and_count_it(run: Run):
    metrics, expect = run.stages["s1_ok"]["metrics"], run.expect["s1_ok"]
    for kind in TAIL_KINDS:
        seconds = expect.by_second[kind]
        assert len(seconds) == MEASURE_S - 1  # the empty second has no samples
        typical = statistics.median(_nearest(v, 99) for v in seconds.values())
        assert abs(metrics[f"{kind}_latency_p99_typical"] - typical) <= _tolerance(typical)
    # the stall carries the window's p99 and not the typical second's
    typical = metrics["e2e_latency_p99_typical"]
    assert metrics["e2e_latency_p99"] >= STALL_US * (1 - MAX_RELATIVE_ERROR) > 5 * typical
    calm = [_nearest(v, 99) for s, v in expect.by_second["e2e"].items() if s != STALL_SECOND]
    assert typical <= max(calm) + _tolerance(max(calm))
    assert metrics["e2e_stall_seconds"] == 1 and metrics["pub_ack_stall_seconds"] == 0
    # the judged tail: the window's p99 without the stall second's samples
    unstalled = [v for s, values in expect.by_second["e2e"].items() if s != STALL_SECOND
                 for v in values]
    want = _nearest(unstalled, 99)
    assert abs(metrics["e2e_latency_p99_no_stall"] - want) <= _tolerance(want)
    assert metrics["pub_ack_latency_p99_no_stall"] == metrics["pub_ack_latency_p99"]
    median_p50 = statistics.median(_nearest(v, 50) for v in expect.by_second["e2e"].values())
    assert abs(metrics["e2e_stall_longest"] - (STALL_US - median_p50)) <= (
        _tolerance(STALL_US) + _tolerance(median_p50))
    assert metrics["pub_ack_stall_longest"] == 0.0
    assert run.stages["s3_zero"]["metrics"]["e2e_latency_p99_typical"] is None


def test_no_samples_is_null_not_zero(run: Run):
    metrics = run.stages["s1_ok"]["metrics"]
    assert all(metrics[f"pub_delay_latency_{stat}"] is None for stat in LATENCY_STATS)


def test_whole_stage_counters_connects_and_loss(run: Run):
    metrics, expect = run.stages["s1_ok"]["metrics"], run.expect["s1_ok"]
    for name in ("duplicated", "out_of_order", "errors", "inflight_full", "delay_overruns",
                 "connects_ok", "connects_failed"):
        assert metrics[name] == expect.totals[name], name
    expected = expect.last_seq_total * RECEIVERS
    assert metrics["lost"] == expected - expect.unique > 0
    assert metrics["loss_ratio"] == pytest.approx((expected - expect.unique) / expected)


def test_connect_rate_from_connect_phase_of_every_process(run: Run):
    phases = run.expect["s1_ok"].connect_phases
    span = (max(p["last_connack_at"] for p in phases)
            - min(p["first_connect_at"] for p in phases))
    assert sum(p["connected"] for p in phases) / span == CONNECT_RATE  # the test's own sums
    assert run.stages["s1_ok"]["metrics"]["connect_rate"] == CONNECT_RATE
    assert not [p for p in run.stages["s1_ok"]["problems"] if "connect" in p]
    assert METRICS["connect_rate"].unit == "conn/s"
    assert METRICS["connect_rate"].better == "higher"


def test_driver_cpu_max_is_the_busiest_process(run: Run):
    assert max(100 * c / w for c, w in PUBLISH_CPU.values()) == DRIVER_CPU_MAX
    assert run.stages["s1_ok"]["metrics"]["driver_cpu_max"] == DRIVER_CPU_MAX
    # h1/0 recorded none in s5_no_phase: the maximum of the others, not a zero
    assert run.stages["s5_no_phase"]["metrics"]["driver_cpu_max"] == DRIVER_CPU_MAX
    assert run.stages["s3_zero"]["metrics"]["driver_cpu_max"] is None


def test_the_driver_host_idle_cpu_is_the_least_idle_process_and_said_when_low(run: Run):
    stage = run.stages["s1_ok"]
    assert stage["metrics"]["driver_host_idle_pct"] == min(CPUS_IDLE.values()) == 5.0
    # said of the drivers apart from the broker's host (h1): h2's, 25% + 37.5% over 2 CPUs
    assert any(p.startswith("the CPUs a driver process may run on were idle 8% of its publish "
                            "phase (31% by the drivers themselves)") for p in stage["problems"])
    assert stage["status"] == "ok"  # a notice
    # h1/0 recorded none in s5_no_phase: the least of the others
    assert run.stages["s5_no_phase"]["metrics"]["driver_host_idle_pct"] == 7.5
    assert run.stages["s3_zero"]["metrics"]["driver_host_idle_pct"] is None
    # every driver on the broker's host: its CPUs busy with the broker, not said
    assert run.stages["s6_broker_host"]["metrics"]["driver_host_idle_pct"] == 5.0
    assert not [p for p in run.stages["s6_broker_host"]["problems"] if "idle" in p]


def test_drivers_cpus_used_is_a_hosts_processes_over_the_cpus_they_may_run_on(run: Run):
    """Two driver processes on one CPU use it up while neither is busy: the validity gate
    reads their sum over the CPUs they share, the highest host's."""
    for host, share in DRIVERS_CPUS_USED.items():
        procs = [key for key in CPUS if key[0] == host]
        cpus = set().union(*(CPUS[key] for key in procs))
        assert sum(100 * PUBLISH_CPU[key][0] / PUBLISH_CPU[key][1] for key in procs) \
            / len(cpus) == share
    assert run.stages["s1_ok"]["metrics"]["drivers_cpus_used_pct"] == DRIVERS_CPUS_USED["h1"]
    # h1/0 recorded no CPU there: left out, h1/1 alone on CPU 1 (a lower bound), over h2's
    h1_1 = 100 * PUBLISH_CPU[("h1", 1)][0] / PUBLISH_CPU[("h1", 1)][1]
    assert DRIVERS_CPUS_USED["h2"] < h1_1 < DRIVERS_CPUS_USED["h1"]
    assert run.stages["s5_no_phase"]["metrics"]["drivers_cpus_used_pct"] == h1_1
    assert run.stages["s3_zero"]["metrics"]["drivers_cpus_used_pct"] is None


def test_the_broker_cpu_over_the_driver_cpu_only_where_they_share_a_host(run: Run):
    """broker_cpu_per_driver_cpu: the broker's CPU over the sum of its driver processes'
    (each over its publish phase), when every driver process runs on the broker's host."""
    stage, expect = run.stages["s6_broker_host"], run.expect["s6_broker_host"]
    driver = sum(100 * c / w for (host, _), (c, w) in PUBLISH_CPU.items() if host == "h1")
    assert driver == 87.5  # h1/0 25%, h1/1 62.5%
    assert stage["metrics"]["broker_cpu_per_driver_cpu"] == pytest.approx(
        np.mean(expect.cpu) / driver, rel=1e-9)
    # and the drivers' CPU-seconds per 10,000 messages delivered: the broker cost's covariate
    assert stage["metrics"]["driver_cpu_s_per_10k"] == pytest.approx(
        driver / 100 / (stage["metrics"]["delivered_rate"] / 10_000), rel=1e-6)
    assert METRICS["broker_cpu_s_per_10k"].adjusted_by == "driver_cpu_s_per_10k"
    assert stage["status"] == "ok", stage["problems"]
    # drivers on h2 too: nothing shared with the broker's host, so no ratio (and no problem:
    # the topology is not a fault)
    assert run.stages["s1_ok"]["metrics"]["broker_cpu_per_driver_cpu"] is None
    assert run.stages["s1_ok"]["metrics"]["driver_cpu_s_per_10k"] is None
    assert not [p for p in run.stages["s1_ok"]["problems"]
                if "driver" in p and "idle" not in p]  # (their CPUs' idle share is said)
    # recorded; the cost at the driver's CPU is what is judged
    assert "broker_cpu_per_driver_cpu" not in judged_metrics(Policy())


def test_missing_connect_phase_is_null_with_a_problem(run: Run):
    stage = run.stages["s5_no_phase"]
    assert stage["status"] == "ok", stage["problems"]  # a notice: the traffic is all there
    assert stage["metrics"]["connect_rate"] is None
    assert stage["metrics"]["connects_ok"] == run.expect["s5_no_phase"].totals["connects_ok"]
    label = "/".join(map(str, NO_PHASE))
    assert any("connect_phase" in p and label in p for p in stage["problems"]), stage["problems"]
    missing = run.stages["s2_missing"]  # no summary at all: no rate either, said so
    assert missing["metrics"]["connect_rate"] is None
    assert any("connect_rate not computed" in p for p in missing["problems"])


def test_connect_rate_lands_in_sql(run: Run, tmp_path):
    """The job's metrics go to the store as they are (tasks.steps.load_metrics.load_results hands
    each stage's ``metrics`` to record_results): connect_rate with its unit, null as NULL."""
    from sql.store import Store

    store = Store(f"sqlite:///{tmp_path / 'results.db'}")
    store.migrate()
    store.create_run(RUN_ID, kind="manual", suite="test", broker_kind="mosquitto",
                     artifact_dir=str(tmp_path))
    for stage in run.doc["stages"]:
        store.record_stage(RUN_ID, stage["stage_id"], scenario=stage["scenario"],
                           stage_key=f"mosquitto|{stage['stage_id']}", params={},
                           fingerprint_hash=None)
        store.record_results(RUN_ID, stage["stage_id"], metrics=stage["metrics"],
                             series=stage["series"], validity="valid", reason=None)
    stored = {s["stage_id"]: s for s in store.stages(RUN_ID)}
    store.close()
    assert stored["s1_ok"]["metrics"]["connect_rate"] == CONNECT_RATE
    assert stored["s1_ok"]["units"]["connect_rate"] == "conn/s"
    assert stored["s5_no_phase"]["metrics"]["connect_rate"] is None


def test_broker_metrics_from_window_samples(run: Run):
    metrics, expect = run.stages["s1_ok"]["metrics"], run.expect["s1_ok"]
    assert metrics["broker_cpu_avg"] == pytest.approx(np.mean(expect.cpu), rel=1e-9)
    assert metrics["broker_cpu_max"] == max(expect.cpu)
    assert metrics["broker_rss_avg"] == pytest.approx(np.mean(expect.rss), rel=1e-9)
    assert metrics["broker_rss_max"] == max(expect.rss)
    per_10k = np.mean(expect.cpu) / 100 / (metrics["delivered_rate"] / 10_000)  # CPU-seconds
    assert metrics["broker_cpu_s_per_10k"] == pytest.approx(per_10k, rel=1e-8)
    assert metrics["host_cpu_avg"] == 50.0  # the host's file, its window only
    assert metrics["host_pace_us"] == pytest.approx(np.median(expect.pace) / 1000, rel=1e-9)
    assert metrics["host_steal_pct"] == pytest.approx(np.mean(expect.steal), rel=1e-9)


def test_only_the_headers_a_sampler_once_wrote_are_read(tmp_path):
    path = tmp_path / "broker.csv"
    write_csv(path, SAMPLER_COLUMNS[:-1], [(MEASURE[0], *range(1, len(SAMPLER_COLUMNS) - 1))])
    with pytest.raises(ValueError, match="header is not second,cpu_pct"):
        read_samples(path, SAMPLER_COLUMNS, (MEASURE[0], MEASURE[-1] + 1))
    rows = read_samples(path, SAMPLER_COLUMNS, (MEASURE[0], MEASURE[-1] + 1),
                        before=(SAMPLER_COLUMNS[:-1],))
    assert rows[0]["cpu_pct"] == 1 and rows[0][SAMPLER_COLUMNS[-1]] is None


def test_a_host_file_from_before_the_pace_leaves_it_null(run: Run):
    stage = run.stages["s5_no_phase"]
    assert stage["metrics"]["host_pace_us"] is None and stage["metrics"]["host_cpu_avg"] == 50.0
    assert stage["metrics"]["host_steal_pct"] is None
    assert not any("host.csv" in problem for problem in stage["problems"])


def test_a_host_file_from_before_the_steal_reads_the_pace(tmp_path):
    path = tmp_path / HOST_FILE
    assert HOST_COLUMNS_BEFORE[1] == HOST_COLUMNS[:-1]  # the header before steal_pct
    write_csv(path, HOST_COLUMNS_BEFORE[1], [(MEASURE[0], 40.0, 2, 10**9, 0, 0, 300_000)])
    rows = read_samples(path, HOST_COLUMNS, (MEASURE[0], MEASURE[-1] + 1),
                        before=HOST_COLUMNS_BEFORE)
    assert rows[0]["pace_ns"] == 300_000 and rows[0]["steal_pct"] is None


def test_per_second_p99_broker_cpu_and_buckets_are_series_for_the_report(run: Run):
    stage, expect = run.stages["s1_ok"], run.expect["s1_ok"]
    series = stage["series"]
    assert series[BROKER_CPU_SERIES] == expect.cpu  # one per window second, in order
    for kind in TAIL_KINDS:
        p99 = dict(zip(series["seconds"], series[p99_per_s_series(kind)]))
        assert p99[EMPTY_SECOND] is None  # a second without samples has no p99
        for second, values in expect.by_second[kind].items():
            want = _nearest(values, 99)
            assert abs(p99[second] - want) <= _tolerance(want), (kind, second)
        index, counts = (series[name] for name in bucket_series(kind))
        assert index == sorted(index) and len(index) == len(counts) and all(counts)
        assert sum(counts) == len(expect.samples[kind])
        # the stored buckets give back the window's percentiles
        assert percentile(dict(zip(index, counts)), 99) == stage["metrics"][f"{kind}_latency_p99"]


def test_a_stage_across_hosts_whose_clocks_are_not_trusted_says_so(run: Run):
    (line,) = [p for p in run.stages["s1_ok"]["problems"] if "clock" in p]
    assert line.startswith("clocks not trusted for latency across hosts: h1 +50.000 ms "
                           "(+-0.100 ms) off the orchestrator's"), line
    assert "h2" not in line.split(";")[0]
    # on one host, the clocks of its publishers and subscribers are the same clock
    assert not [p for p in run.stages["s6_broker_host"]["problems"] if "clock" in p]


def test_two_hosts_each_near_the_orchestrators_clock_but_apart_are_not_trusted():
    """Each host's clock within 1 ms of the orchestrator's, allowing for its reading, is
    trusted on its own; two of them 3.2 ms apart are not, for a message from one to the
    other (its e2e latency would read 3.2 ms off, or below 0). Pure: no Spark."""
    from spark.stage_files import StageFiles, _check_clocks

    def problems(offsets_ms: dict[str, float]) -> list[str]:
        stage = StageFiles("s", summaries=[{"host": h} for h in offsets_ms])
        clocks = {h: {"clock_offset_s": ms / 1000, "clock_uncertainty_s": 0.0007,
                      "clock_trusted": abs(ms) <= 1.0 + 0.7} for h, ms in offsets_ms.items()}
        _check_clocks(stage, clocks)
        return stage.problem_list()

    (line,) = problems({"h1": 1.6, "h2": -1.6})
    assert line.startswith("clocks not trusted for latency across hosts: h1 +1.600 ms "
                           "(+-0.700 ms), h2 -1.600 ms (+-0.700 ms) off the orchestrator's, "
                           "h1 and h2 3.200 ms apart; synchronise them"), line
    assert problems({"h1": 1.6, "h2": 0.8}) == []  # 0.8 ms apart: within 1 ms and their reading
    assert problems({"h1": 1.6}) == []  # one host: one clock


def test_missing_process_makes_stage_incomplete(run: Run):
    stage, expect = run.stages["s2_missing"], run.expect["s2_missing"]
    assert stage["status"] == "incomplete"
    # the cause comes first (the validity gate quotes the first problems); notices follow
    assert "missing process h2/1" in stage["problems"][0], stage["problems"]
    # what the other processes reported is still aggregated; loss cannot be known
    delivered = sum(v[0] for v in expect.per_second.values())
    assert stage["metrics"]["messages_delivered"] == delivered > 0
    assert stage["metrics"]["lost"] is None and stage["metrics"]["loss_ratio"] is None


def test_zero_traffic_is_no_data_with_null_metrics(run: Run):
    stage = run.stages["s3_zero"]
    assert stage["status"] == "no_data"
    assert "zero traffic" in stage["problems"][0], stage["problems"]
    measured = {k: v for k, v in stage["metrics"].items()
                if k not in ("target_rate", "expected_delivery_rate")}  # intended, not measured
    assert all(v is None for v in measured.values()), measured
    assert stage["series"]["delivered_per_s"] == [0] * MEASURE_S


def test_truncated_file_makes_stage_incomplete(run: Run):
    stage, expect = run.stages["s4_truncated"], run.expect["s4_truncated"]
    assert stage["status"] == "incomplete"
    named = [p for p in stage["problems"] if COUNTERS_FILE in p and "h1/0" in p]
    assert named, stage["problems"]
    # the cut row is counted as malformed, in the file it came from; so are bad lines
    assert f"1 malformed rows skipped in {COUNTERS_FILE} of h1/0" in stage["problems"]
    assert f"4 malformed rows skipped in {HISTOGRAMS_FILE} of h2/0" in stage["problems"]
    samples = expect.samples["e2e"]  # the bad lines added nothing to the percentiles
    assert stage["metrics"]["e2e_latency_max"] == pytest.approx(max(samples),
                                                                 abs=_tolerance(max(samples)))
    delivered = sum(v[0] for v in expect.per_second.values())
    assert stage["metrics"]["messages_delivered"] == delivered  # the cut row was outside


def test_second_run_is_byte_identical(run: Run):
    assert run.json_bytes[0] == run.json_bytes[1]


def test_parquet_has_one_row_per_stage_metric(run: Run):
    parquet = pytest.importorskip("pyarrow.parquet")
    table = parquet.read_table(run.out / "stage_metrics.parquet").to_pylist()
    assert len(table) == len(run.expect) * len(METRICS)
    for row in table:
        assert row["run_id"] == RUN_ID
        assert row["value"] == run.stages[row["stage_id"]]["metrics"][row["metric"]]


def test_prints_one_timing_line_and_few_logs(run: Run):
    for result in run.results:
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 1 and all(w in lines[0] for w in ("session", "read", "write"))
        assert sum(" INFO " in line for line in result.stderr.splitlines()) < 10


def test_a_raw_file_changed_or_gone_after_collect_makes_its_stage_incomplete(tmp_path):
    """What the Spark job checks before it reads a stage: its files against raw/MANIFEST.json
    as the collect step wrote it (here: a late write to one CSV, another one deleted)."""
    from spark.stage_files import discover
    from tasks.manifest import entry

    raw = tmp_path / "raw"
    build_stage(raw, "s1_touched", 1)
    build_stage(raw, "s2_kept", 2)
    files = {str(p.relative_to(tmp_path)): entry(p) for p in sorted(raw.rglob("*"))
             if p.is_file()}
    (raw / "MANIFEST.json").write_text(json.dumps({"files": files, "missing": []}))
    counters = raw / "s1_touched" / "h1" / "0" / COUNTERS_FILE
    counters.write_text(counters.read_text() + f"{MEASURE[0]},0,0,0\n")  # a late writer
    (raw / "s1_touched" / "h2" / "1" / HISTOGRAMS_FILE).unlink()
    stages = {s.stage_id: s for s in discover(tmp_path, None)}
    problems = stages["s1_touched"].problem_list()
    assert stages["s1_touched"].incomplete
    assert any(p.startswith("raw/s1_touched/h1/0/counters.csv changed since collect (")
               for p in problems), problems
    assert "raw/s1_touched/h2/1/histograms.csv is gone since collect" in problems, problems
    assert not stages["s2_kept"].incomplete, stages["s2_kept"].problem_list()


def test_more_unique_deliveries_than_expected_is_said_not_hidden_as_no_loss():
    """Loss is expected (last_seq x receivers) less unique deliveries, shown as 0 when
    negative: a receiver stage.json did not count would hide loss of the other streams,
    so the stage says so (a notice: the traffic is all there)."""
    from spark.stage_files import StageFiles
    from spark.stage_metrics import loss_metrics

    def stage(unique: int) -> StageFiles:
        return StageFiles("s", doc={"receivers": {"0": 1, "1": 1}}, summaries=[
            {"host": "h", "proc": 0, "last_seq": {"0": 100, "1": 100},
             "unique_received": unique}])

    short, over = stage(190), stage(230)
    assert loss_metrics(short) == {"lost": 10, "loss_ratio": 0.05, "unacked_deliveries": 0}
    assert short.problem_list() == [] and not short.incomplete
    assert loss_metrics(over)["lost"] == 0 and not over.incomplete
    (said,) = over.problem_list()
    assert said.startswith("230 unique deliveries where 200 were expected: loss reads 0")


def test_the_judged_broker_figures_come_only_from_its_nights_source_over_most_seconds(tmp_path):
    """A night whose broker process was not found falls back to its host's CPU and used
    memory, and a sampler that kept only a few seconds of the window: both are recorded,
    but neither gives the judged cost a message or memory per 1,000 clients, and the
    stage says why; a CSV cell of +Inf reads as empty. Pure: no Spark."""
    from spark.stage_files import StageFiles
    from spark.stage_metrics import _broker_source, broker_metrics

    window = (1000, 1060)
    seconds = range(*window)

    def stage(**samples) -> StageFiles:
        return StageFiles("s", window=window, samples=samples,
                          doc={"clients": 1000, "broker_host": "b",
                               "sampler": {"processes": "session 42", "dedicated": True}})

    def judged(files: StageFiles) -> dict:
        return broker_metrics(files, 50_000.0, _broker_source(files))

    proc = [{"second": s, "cpu_pct": 40.0, "rss_bytes": 2e7, "processes": 1} for s in seconds]
    whole = stage(broker=proc)
    metrics = judged(whole)
    assert metrics["broker_cpu_s_per_10k"] == pytest.approx(0.4 / 5)
    assert metrics["broker_rss_per_1k_conn"] == pytest.approx(2e7)
    assert not whole.problem_list()

    host = [{"second": s, "cpu_pct": 90.0, "mem_used_bytes": 9e8} for s in seconds]
    lost = stage(broker=[{**r, "processes": 0} for r in proc], host=host)
    metrics = judged(lost)
    assert metrics["broker_cpu_avg"] == 90.0  # recorded, said where from
    assert metrics.get("broker_cpu_s_per_10k") is None
    assert metrics.get("broker_rss_per_1k_conn") is None
    assert any("not computed: from its host, not the broker's processes" in p
               for p in lost.problem_list()), lost.problem_list()

    few = stage(broker=proc[:3])
    metrics = judged(few)
    assert metrics["broker_cpu_avg"] == 40.0 and metrics.get("broker_cpu_s_per_10k") is None
    assert any("sampled in 3 of the window's 60 seconds" in p for p in few.problem_list())
    # a window's seconds but a fifth of them, or one, will do: a late tick skips a second
    for window, kept, judged_then in (((1000, 1060), 48, True), ((1000, 1060), 47, False),
                                      ((1000, 1003), 2, True), ((1000, 1003), 1, False),
                                      ((1000, 1004), 3, True)):
        short = stage(broker=proc[:kept])
        short.window = window
        assert (judged(short).get("broker_cpu_s_per_10k") is not None) is judged_then, \
            (window, kept)

    path = tmp_path / "broker.csv"
    write_csv(path, SAMPLER_COLUMNS, [(1000, "inf", 5, *[1] * (len(SAMPLER_COLUMNS) - 3)),
                                      (1001, "-Inf", 5, *[1] * (len(SAMPLER_COLUMNS) - 3))])
    assert [r["cpu_pct"] for r in read_samples(path, SAMPLER_COLUMNS, window)] == [None, None]


def test_a_process_folder_the_stage_never_launched_is_left_out_and_said(tmp_path):
    """A stray raw/<stage>/<host>/<proc>/ (a hand run into the run folder, a copy): its
    messages are no stage's, so its files are not summed into the stage's rates and
    latencies (they were, with a notice); a stage.json that lists no process reads every
    folder, as before. Pure: no Spark."""
    from spark.stage_files import load_stage
    from tasks.driver.output import SUMMARY_FILE

    stage_dir = tmp_path / "raw" / "s1"
    for host, proc in (("h1", "0"), ("h9", "0")):
        (stage_dir / host / proc).mkdir(parents=True)
        (stage_dir / host / proc / SUMMARY_FILE).write_text(json.dumps(
            {"host": host, "proc": proc, "status": "ok"}))
        write_csv(stage_dir / host / proc / COUNTERS_FILE, COUNTER_COLUMNS,
                  [(MEASURE[0], *[1] * (len(COUNTER_COLUMNS) - 1))])
    doc = {"stage_id": "s1", "processes": [{"host": "h1", "proc": "0"}],
           "windows": {"measure_start": MEASURE[0], "measure_end": MEASURE[-1] + 1}}
    (stage_dir / STAGE_FILE).write_text(json.dumps(doc))
    stage = load_stage(tmp_path / "raw", "s1")
    assert [s["host"] for s in stage.summaries] == ["h1"]
    assert [p.parent.parent.name for p in stage.files["counters"]] == ["h1"]
    assert any("unexpected process h9/0" in p and "left out" in p for p in stage.problem_list())
    (stage_dir / STAGE_FILE).write_text(json.dumps({**doc, "processes": []}))
    assert len(load_stage(tmp_path / "raw", "s1").summaries) == 2

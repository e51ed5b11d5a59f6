"""Measure this machine's run-to-run noise: what `bench/bench_detector.py` draws from.

`bench/simulated_nights.py` draws the nights from it.

    .state/venv/bin/python bench/measure_noise.py --runs 10 --state /tmp/noise-state
    .state/venv/bin/python bench/measure_noise.py --analyse-only --state /tmp/noise-state

Runs `perfpipe run --suite SUITE` N times in a scratch state dir (PERFPIPE_STATE_DIR), then
reads the stored results and the raw latency histograms and writes, per metric:
- night-to-night noise: CV (stdev/mean) of the per-run values of each stage, and the
  robust sigma of the log values (1.4826 x MAD), which is what the detector estimates;
- per-second noise: CV of the per-second samples inside one run's measure window
  (delivered msg/s from the stored series; latency percentiles per second from the raw
  histograms), median over runs;
- the lag-1 autocorrelation of the per-second samples;
- for latency percentiles, the night-to-night noise a longer measure window would have
  (`window_projection`: 10, 60 and 300 s windows resampled from the measured seconds);
- ``tail_estimators``: the night-to-night noise of each way of reading a stage's latency
  tail (the window's p99, the median over seconds of each second's p99, the window's p99
  without the stall seconds) and the stall seconds per night (`tasks.analysis.tails`):
  what the judged tail was chosen by. The per-second tail metrics of runs stored before
  they existed are read from the raw histograms, as the Spark job reads them;
- ``host_pace``: per stage and with one slope for all, what the broker host's pace
  (`tasks.driver.pace`) explains of the broker's CPU per message from night to night
  (`bench/host_pace.py`'s figures), in the output file.
- ``covariates``: for each judged metric with a covariate (`MetricDef.adjusted_by`: the
  broker's CPU per message and e2e p50, on the driver's CPU per message), per stage, the
  slope the detector fits, the noise of the metric as it is and along that slope (in
  sample, as the detector estimates it, and out of sample), and the medians over stages
  that `simulated_nights.py` draws from; with --covariate METRIC=BY, also for a pairing the
  pipeline does not judge (yet).
Load average and the busiest other processes are recorded before every run: this machine
is shared, and the figures are only as quiet as it was.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sql import Store  # noqa: E402
from tasks.analysis import tails as tail_rules  # noqa: E402
from tasks.analysis.covariate import fit  # noqa: E402
from tasks.analysis.noise import noise_sigma  # noqa: E402
from tasks.analysis.policy import Policy, judged_metrics  # noqa: E402
from tasks.analysis.tails import tails_of_seconds  # noqa: E402
from tasks.driver.histogram import percentile  # noqa: E402
from tasks.metrics import METRICS as DEFS  # noqa: E402
from tasks.metrics import check_covariates  # noqa: E402

from host_pace import explained, explained_pooled  # noqa: E402  (bench/, beside it)

WINDOWS_S = (10, 60, 300)  # measure-window lengths projected by `window_projection`
# (stall seconds per night are in `tail_estimators`: a log noise of counts that are
# mostly 0 would mislead)
HEADLINE = ("delivered_rate", "e2e_latency_p50", "e2e_latency_p99", "pub_ack_latency_p99",
            "e2e_latency_p99_typical")
METRICS = tuple(dict.fromkeys(HEADLINE + tuple(judged_metrics(Policy()))))
PER_SECOND = {"e2e_latency_p50": ("e2e", 50), "e2e_latency_p99": ("e2e", 99),
              "pub_ack_latency_p99": ("pub_ack", 99)}
ADJUSTED = {m: DEFS[m].adjusted_by for m in METRICS if DEFS[m].adjusted_by}
# A covariate of runs stored before it was recorded, from what they did record: the
# drivers' CPU per message is the broker's over their ratio (spark.stage_metrics.relative_cost)
RECORDED_AS = {"driver_cpu_s_per_10k":
               lambda m: m["broker_cpu_s_per_10k"] / m["broker_cpu_per_driver_cpu"]
               if m.get("broker_cpu_s_per_10k") and m.get("broker_cpu_per_driver_cpu") else None}


def busy_processes(limit: int = 5) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"],
                         capture_output=True, text=True).stdout.splitlines()
    return [line.strip() for line in out[:limit]]


def run_one(suite: str, state: Path, log_file: Path, inventory: Path | None = None) -> dict:
    """One `perfpipe run --suite SUITE` in the scratch state dir `state` (on `inventory`,
    else the embedded default), its output in `log_file`: the conditions it ran in."""
    env = {**os.environ, "PERFPIPE_STATE_DIR": str(state)}
    for name in ("PERFPIPE_DB_URL", "PERFPIPE_SLACK_TOKEN", "PERFPIPE_INVENTORY"):
        env.pop(name, None)
    if inventory is not None:
        env["PERFPIPE_INVENTORY"] = str(inventory)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    before = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "loadavg": [round(x, 2) for x in os.getloadavg()], "busy": busy_processes()}
    t0 = time.monotonic()
    with open(log_file, "w") as log:
        rc = subprocess.call([str(REPO / ".state/venv/bin/perfpipe"), "run", "--suite", suite],
                             cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    return {**before, "exit": rc, "seconds": round(time.monotonic() - t0, 1),
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def run_all(runs: int, suite: str, state: Path) -> list[dict]:
    logs = state / "noise-logs"
    logs.mkdir(parents=True, exist_ok=True)
    conditions = []
    for i in range(runs):
        conditions.append(run_one(suite, state, logs / f"run-{i:02d}.log"))
        print(f"run {i + 1}/{runs}: exit {conditions[-1]['exit']} in "
              f"{conditions[-1]['seconds']} s, load {conditions[-1]['loadavg']}", flush=True)
    (logs / "conditions.json").write_text(json.dumps(conditions, indent=1))
    return conditions


def per_second_histograms(stage_dir: Path) -> dict[str, list[dict[int, int]]]:
    """Each second's latency histogram in the measure window, per kind, summed over every
    process of a stage."""
    doc = json.loads((stage_dir / "stage.json").read_text())
    lo, hi = doc["windows"]["measure_start"], doc["windows"]["measure_end"]
    sums: dict[tuple[int, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for path in stage_dir.glob("*/*/histograms.csv"):
        with open(path) as handle:
            for row in csv.DictReader(handle):
                second = int(row["second"])
                if lo <= second < hi:
                    sums[(second, row["kind"])][int(row["bucket"])] += int(row["count"])
    kinds = {kind for kind, _ in PER_SECOND.values()}
    return {kind: [sums[(s, kind)] for s in range(lo, hi) if (s, kind) in sums] for kind in kinds}


def tail_candidates(kind: str, seconds: list[dict[int, int]],
                    tails: dict[str, float | None]) -> dict[str, float | None]:
    """One night's value of each tail estimator considered (`tail_estimators`): the window's
    p99, the median over seconds of each second's p99 and the window's p99 with the stall
    seconds left out (`tails`: `tasks.analysis.tails.tails_of_seconds` of `seconds`), and
    the stall seconds themselves."""
    total: dict[int, int] = defaultdict(int)
    for counts in seconds:
        for bucket, count in counts.items():
            total[bucket] += count
    return {"window_p99": percentile(total, 99),
            "median_second_p99": tails[f"{kind}_latency_p99_typical"],
            "p99_without_stall_seconds": tails[f"{kind}_latency_p99_no_stall"],
            "stall_seconds": tails[f"{kind}_stall_seconds"]}


def tail_estimators(nights: dict[str, list[dict[str, float | None]]]) -> dict:
    """Night-to-night noise (robust sigma and sd of the logs) of each tail estimator, per
    stage and kind, and its median over them: the choice of the judged tail is this."""
    out: dict = {"stall_factor": tail_rules.STALL_FACTOR, "stages": {}}
    names = ("window_p99", "median_second_p99", "p99_without_stall_seconds")
    summary: dict[str, list[float]] = defaultdict(list)
    for key, runs in sorted(nights.items()):
        row = {}
        for name in names:
            values = [r[name] for r in runs if r[name]]
            row[name] = {"log_mad_sigma": _r(log_mad_sigma(values)), "log_sd": _r(log_sd(values))}
            for stat in ("log_mad_sigma", "log_sd"):
                if row[name][stat] is not None:
                    summary[f"{name}.{stat}"].append(row[name][stat])
        row["stall_seconds_per_night"] = [r["stall_seconds"] for r in runs]
        out["stages"][key] = row
    out["median"] = {k: _r(statistics.median(v)) for k, v in sorted(summary.items())}
    out["max"] = {k: _r(max(v)) for k, v in sorted(summary.items())}
    return out


def per_second_latency(seconds: dict[str, list[dict[int, int]]]) -> dict[str, list[float]]:
    """Per-second percentiles, from `per_second_histograms`."""
    out: dict[str, list[float]] = {}
    for metric, (kind, pct) in PER_SECOND.items():
        out[metric] = [v for v in (percentile(h, pct) for h in seconds.get(kind, [])) if v]
    return out


def window_projection(seconds: list[dict[int, int]], pct: float, draws: int = 300,
                      seed: int = 1) -> dict[str, float | None]:
    """Robust sigma of the log percentile of a longer window, per window length.

    A window of W seconds is W of the measured seconds drawn with replacement (pooled over
    the runs of the stage) and its percentile is read from their summed histograms. That is
    how much a longer measure window would quiet the metric if seconds were independent
    (their lag-1 autocorrelation is recorded next to it). A lower bound: pooling keeps the
    variation between seconds and drops a night's own level shift (e2e p50 moves 3% night
    to night here while its 10 s projection says 1.5%).
    """
    rng = random.Random(seed)
    out: dict[str, float | None] = {}
    for window in WINDOWS_S:
        values = []
        for _ in range(draws):
            total: dict[int, int] = defaultdict(int)
            for second in rng.choices(seconds, k=window):
                for bucket, count in second.items():
                    total[bucket] += count
            values.append(percentile(total, pct))
        out[str(window)] = _r(log_mad_sigma(values))
    return out


def cv(values: list[float]) -> float | None:
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def log_mad_sigma(values: list[float]) -> float | None:
    """The detector's robust sigma of the log values (None with fewer than 3)."""
    logs = [math.log(v) for v in values if v > 0]
    return noise_sigma(logs) if len(logs) >= 3 else None


def log_sd(values: list[float]) -> float | None:
    logs = [math.log(v) for v in values if v > 0]
    return statistics.stdev(logs) if len(logs) >= 3 else None


def lag1(values: list[float]) -> float | None:
    if len(values) < 4 or statistics.pvariance(values) == 0:
        return None
    m = statistics.fmean(values)
    num = sum((a - m) * (b - m) for a, b in zip(values, values[1:]))
    return num / sum((v - m) ** 2 for v in values)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def analyse(state: Path, adjusted: dict[str, str] = ADJUSTED) -> dict:
    """`adjusted`: judged metric -> its covariate, for ``covariates`` (the pipeline's by
    default; --covariate adds a candidate)."""
    store = Store(f"sqlite:///{state / 'results.db'}")
    # A run that failed after aggregation (e.g. in the report step) still measured its
    # stages: its valid stages count; the run statuses are recorded with the figures.
    runs = store.latest_runs(1000)
    nightly: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seconds: dict[str, dict[str, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
    pooled: dict[str, dict[str, list[dict[int, int]]]] = defaultdict(lambda: defaultdict(list))
    tails: dict[str, list[dict]] = defaultdict(list)
    paced: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    covaried: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list))  # metric -> stage -> (log value, log covariate) a night
    for run in runs:
        for st in store.stages(run["run_id"]):
            if st["validity"] != "valid":
                continue
            key = st["stage_key"]
            pair = (st["metrics"].get("host_pace_us"), st["metrics"].get("broker_cpu_s_per_10k"))
            if all(pair):
                paced[key].append((run["run_id"], *pair))
            for m, by in adjusted.items():
                x = st["metrics"].get(by) or (RECORDED_AS[by](st["metrics"]) if by in RECORDED_AS
                                              else None)
                if st["metrics"].get(m) and x:
                    covaried[m][key].append((math.log(st["metrics"][m]), math.log(x)))
            for m in METRICS:
                if st["metrics"].get(m):
                    nightly[key][m].append(st["metrics"][m])
            seconds[key]["delivered_rate"].append(st["series"].get("delivered_per_s", []))
            hists = per_second_histograms(Path(run["artifact_dir"]) / "raw" / st["stage_id"])
            for m, values in per_second_latency(hists).items():
                seconds[key][m].append(values)
            for kind, per_second in hists.items():
                pooled[key][kind] += per_second
                derived = tails_of_seconds(kind, dict(enumerate(per_second)))
                if per_second:
                    tails[f"{key} {kind}"].append(tail_candidates(kind, per_second, derived))
                # runs stored before the per-second tail metrics existed: read from raw
                for m, value in derived.items():
                    if m in METRICS and not st["metrics"].get(m) and value:
                        nightly[key][m].append(value)
    by_metric: dict[str, dict] = {}
    for m in METRICS:
        stages = {}
        for key in sorted(nightly):
            vals = nightly[key].get(m, [])
            within = [cv(s) for s in seconds[key].get(m, []) if cv(s) is not None]
            acs = [lag1(s) for s in seconds[key].get(m, []) if lag1(s) is not None]
            if len(vals) < 2:
                continue
            stages[key] = {"runs": len(vals), "mean": round(statistics.fmean(vals), 3),
                           "night_cv": _r(cv(vals)), "night_log_sd": _r(log_sd(vals)),
                           "night_log_mad_sigma": _r(log_mad_sigma(vals)),
                           "per_second_cv": _r(statistics.median(within)) if within else None,
                           "per_second_lag1_autocorr": _r(statistics.median(acs)) if acs else None,
                           "per_second_n": statistics.median(len(s) for s in seconds[key][m])
                           if seconds[key].get(m) else 0}
            if m in PER_SECOND and pooled[key].get(PER_SECOND[m][0]):
                kind, pct = PER_SECOND[m]
                stages[key]["window_log_mad_sigma"] = window_projection(pooled[key][kind], pct)
        if not stages:
            continue
        pick = lambda f: [s[f] for s in stages.values() if s[f] is not None]  # noqa: E731
        by_metric[m] = {
            "night_cv_median": _r(statistics.median(pick("night_cv"))),
            "night_cv_max": _r(max(pick("night_cv"))),
            "night_log_sd_median": _r(statistics.median(pick("night_log_sd")))
            if pick("night_log_sd") else None,
            "night_log_mad_sigma_median": _r(statistics.median(pick("night_log_mad_sigma")))
            if pick("night_log_mad_sigma") else None,
            "per_second_cv_median": _r(statistics.median(pick("per_second_cv")))
            if pick("per_second_cv") else None,
            "per_second_lag1_autocorr_median": _r(statistics.median(pick("per_second_lag1_autocorr")))
            if pick("per_second_lag1_autocorr") else None,
            "stages": stages}
        projected = [s["window_log_mad_sigma"] for s in stages.values() if "window_log_mad_sigma" in s]
        if projected:
            by_window = {w: [p[w] for p in projected if p[w] is not None] for w in projected[0]}
            by_metric[m]["window_log_mad_sigma_median"] = {
                w: _r(statistics.median(v)) if v else None for w, v in by_window.items()}
    store.close()
    statuses = {r["run_id"]: r["status"] for r in runs}
    return {"ok_runs": sum(s == "ok" for s in statuses.values()),
            "runs_measured": max((len(v) for k in nightly for v in nightly[k].values()), default=0),
            "run_statuses": statuses, "metrics": by_metric,
            "tail_estimators": tail_estimators(tails), "host_pace": pace_figures(paced),
            "covariates": {m: covariate_figures(adjusted[m], stages)
                           for m, stages in covaried.items()}}


def covariate_figures(by: str, stages: dict[str, list[tuple[float, float]]]) -> dict:
    """Per stage of at least `Policy.min_history` nights, (log value, log covariate) each,
    as the detector fits them (`tasks.analysis.covariate.fit`): the slope, the robust sigma
    of the covariate's logs, of the metric's logs as they are, and of the nights moved
    along the slope (in sample, as the detector estimates the noise it judges with); and
    the root mean square of each night's distance from the median of the other nights,
    moved along the slope fitted on them alone (out of sample). Medians over the stages:
    what simulated_nights.py draws the metric and its covariate from."""
    out: dict = {"by": by, "stages": {}}
    for key, pairs in sorted(stages.items()):
        if len(pairs) < Policy().min_history:
            continue
        whole = fit(pairs)
        left = []
        for i, (y, x) in enumerate(pairs):
            others = pairs[:i] + pairs[i + 1:]
            line = fit(others)
            left.append(line.adjust(y, x) - statistics.median(line.adjust(*p) for p in others))
        out["stages"][key] = {
            "nights": len(pairs), "slope": _r(whole.slope),
            "covariate_sigma": _r(noise_sigma([x for _, x in pairs])),
            "sigma": _r(noise_sigma([y for y, _ in pairs])),
            "adjusted_sigma": _r(noise_sigma([whole.adjust(y, x) for y, x in pairs])),
            "adjusted_rms_out_of_sample": _r(math.sqrt(statistics.fmean(e * e for e in left)))}
    if out["stages"]:
        out["median"] = {f: _r(statistics.median(s[f] for s in out["stages"].values()))
                         for f in ("slope", "covariate_sigma", "sigma", "adjusted_sigma",
                                   "adjusted_rms_out_of_sample")}
    return out


def pace_figures(paced: dict[str, list[tuple[str, float, float]]]) -> dict:
    """Per stage, what the host's pace explains of the broker's CPU per message from night
    to night (`host_pace.explained`: r, slope, the log cost's spread before and after, the
    line fitted on the other nights), and with one slope for every stage
    (`host_pace.explained_pooled`)."""
    stages = {key: pairs for key, pairs in sorted(paced.items()) if len(pairs) >= 4}
    out = {key: {k: _r(v) for k, v in explained([x for _, x, _ in pairs],
                                                  [y for _, _, y in pairs]).items()}
           for key, pairs in stages.items()}
    if stages:
        out["all stages, one slope"] = {k: _r(v) for k, v in explained_pooled(stages).items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--state", type=Path, required=True, help="scratch PERFPIPE_STATE_DIR")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "noise_measured.json")
    ap.add_argument("--analyse-only", action="store_true")
    ap.add_argument("--stall-factor", type=float, metavar="F",
                    help="analyse with stall seconds at F x the typical second's p99, to try "
                         "another factor than the pipeline's (tasks.analysis.tails.STALL_FACTOR)")
    ap.add_argument("--covariate", action="append", default=[], metavar="METRIC=BY",
                    help="also fit METRIC on BY in ``covariates``, as the detector would if "
                         "METRIC declared adjusted_by=BY (a candidate, before it does)")
    args = ap.parse_args()
    adjusted = dict(ADJUSTED)
    for pairing in args.covariate:
        metric, _, by = pairing.partition("=")
        unknown = [n for n in (metric, by) if n not in DEFS]
        if unknown or metric not in judged_metrics(Policy()):
            ap.error(f"--covariate {pairing!r}: {', '.join(unknown) or metric} is not a "
                     f"{'metric of tasks.metrics' if unknown else 'judged metric'}; give "
                     "METRIC=BY, a judged metric and a recorded one (e.g. "
                     "e2e_latency_avg=driver_cpu_s_per_10k)")
        try:
            check_covariates({**DEFS, metric: replace(DEFS[metric], adjusted_by=by)})
        except ValueError as e:
            ap.error(f"--covariate {pairing!r}: {e}")
        adjusted[metric] = by
    args.state.mkdir(parents=True, exist_ok=True)
    cond_file = args.state / "noise-logs" / "conditions.json"
    conditions = (json.loads(cond_file.read_text()) if args.analyse_only and cond_file.exists()
                  else [] if args.analyse_only else run_all(args.runs, args.suite, args.state))
    if args.stall_factor:
        tail_rules.STALL_FACTOR = args.stall_factor  # read by tasks.analysis.tails.stalls
    result = analyse(args.state, adjusted)
    this = " ".join([".state/venv/bin/python", "bench/measure_noise.py", *sys.argv[1:]])
    runs_cmd = f"{this} (each run: PERFPIPE_STATE_DIR={args.state} perfpipe run --suite {args.suite})"
    doc = {
        "command": runs_cmd if not args.analyse_only else
        f"{this} (re-analysis of the runs in {args.state})",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "suite": args.suite,
        "conditions": conditions,
        **result,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({m: {k: v for k, v in d.items() if k != "stages"}
                      for m, d in result["metrics"].items()}, indent=1))
    print(json.dumps({k: v for k, v in result["tail_estimators"].items() if k != "stages"},
                     indent=1))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much of the broker's CPU per message, run to run, is the host's pace or its steal:
one rated row run again and again, with the pipeline's broker sampler beside it.

    .state/venv/bin/python bench/host_pace.py [--row pub-q0-c100-r10k] [--runs 20]
        [--other-row pub-q0-c100-r20k]

Each run is `bench_driver.run_once` with perfpipe's driver on the row, against one
Mosquitto, while `python -m tasks.driver.sampler --pid BROKER --host-counters` samples as
a stage's sampler does. From the measure window it takes the broker's CPU per message as
the pipeline computes it (the sampler's CPU over the row's rate as run_once measured it:
the broker's own count), the host's pace (the median of host.csv's pace_ns:
`tasks.driver.pace`), the host's steal (the mean of host.csv's steal_pct: the time the
hypervisor ran something else while a virtual CPU was ready), and the driver's own CPU per
message. It prints every run (with the broker's system time a message and the host's CPU,
which tell the costly state bench/README.md describes), then what the pace and the steal
each explain of the broker's cost: the correlation with its log, the slope, and the spread
of the log cost before and after it is taken out, each run's line fitted on the other runs
only (what a detector fitting it on past nights would get). `bench/measure_noise.py`
writes the same for the pace (not the steal) on the pipeline's own stages, night by night,
into its output's ``host_pace``. The driver's CPU per message, on this host too, is
printed beside it for comparison: a covariate only where driver and broker share a host.

With --other-row, runs alternate between the two rows (another load on the same broker):
the median of their paired paces' ratio should be 1 if the pace measures the host and not
the broker's load.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_driver as bd  # noqa: E402
from broker_side import Broker, SysCounter, raise_nofile  # noqa: E402
from load_tools import REPO  # noqa: E402

from spark.stage_files import read_samples, sample_values  # noqa: E402
from tasks.driver.output import HOST_COLUMNS, HOST_FILE, SAMPLER_COLUMNS, SAMPLER_FILE  # noqa: E402

TIMING = {"warmup_s": 3, "measure_s": 12, "drain_s": 1}


def one_run(row: str, broker: Broker, sys_counter: SysCounter, workdir: Path, run: int) -> dict:
    out = workdir / f"sampler-{run}"
    sampler = subprocess.Popen(
        [sys.executable, "-m", "tasks.driver.sampler", "--pid", str(broker.pid),
         "--host-counters", "--no-sys", "--until", "2000000000", "--out", str(out)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        figure = bd.run_undisturbed("perfpipe", row, broker, sys_counter, workdir, TIMING,
                                    f"run {run + 1}")
    finally:
        sampler.terminate()  # it writes its files on SIGTERM's exit path
        _, err = sampler.communicate(timeout=30)
    if not (out / HOST_FILE).exists():
        raise SystemExit(f"the sampler wrote no {HOST_FILE}: {err.strip()}")
    window = figure["window"]
    host = read_samples(out / HOST_FILE, HOST_COLUMNS, window)
    broker = read_samples(out / SAMPLER_FILE, SAMPLER_COLUMNS, window)
    pace = sample_values(host, "pace_ns")
    tool_us, _, _ = bd.us_per_message(figure)
    per_message = 1e4 / figure["rate"]  # % of a core -> us a message
    return {"row": row, "rate": figure["rate"], "pace_us": statistics.median(pace) / 1000,
            "steal_pct": statistics.fmean(sample_values(host, "steal_pct")),
            "host_pct": statistics.fmean(sample_values(host, "cpu_pct")),
            "broker_us": per_message * statistics.fmean(sample_values(broker, "cpu_pct")),
            "broker_sys_us": per_message * statistics.fmean(sample_values(broker, "cpu_sys_pct")),
            "driver_us": tool_us,
            "wakes": figure["broker_wakes_per_msg"], "seconds": len(pace), "window": window}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
             / sum((x - mx) ** 2 for x in xs))
    return slope, my - slope * mx


def rms(errors: list[float]) -> float:
    return math.sqrt(statistics.fmean(e * e for e in errors))


def explained(covariate: list[float], cost: list[float], log_covariate: bool = True) -> dict:
    """What `covariate` (its log, or itself where it can be 0, as steal can) explains of the
    log of `cost`, pair by pair (at least 4 pairs): their correlation, the slope on all
    pairs, the log cost's sample sd, and its spread left when each pair's line is fitted on
    the other pairs only (as a detector fitting it on past nights would have it; a root mean
    square)."""
    xs = [math.log(v) if log_covariate else v for v in covariate]
    ys = [math.log(v) for v in cost]
    slope, _ = fit(xs, ys)
    left = []
    for i in range(len(xs)):
        others = [j for j in range(len(xs)) if j != i]
        b, a = fit([xs[j] for j in others], [ys[j] for j in others])
        left.append(ys[i] - (a + b * xs[i]))
    return {"pairs": len(xs), "r": statistics.correlation(xs, ys), "slope": slope,
            "sd": statistics.stdev(ys), "left_sd": rms(left)}


def explained_pooled(stages: dict[str, list[tuple[str, float, float]]]) -> dict:
    """`explained` with one slope for several stages: (night, covariate, cost) per stage,
    each night's pairs judged by the other nights alone, every stage centred on its own
    mean over them. Both spreads are out of sample (root mean squares of the log cost's
    distance from its stage's mean, and from the line)."""
    nights = sorted({night for pairs in stages.values() for night, _, _ in pairs})
    off_mean, left = [], []
    for left_out in nights:
        centred, means = [], []
        for pairs in stages.values():
            kept = [(math.log(x), math.log(y)) for night, x, y in pairs if night != left_out]
            mx, my = statistics.fmean(x for x, _ in kept), statistics.fmean(y for _, y in kept)
            centred += [(x - mx, y - my) for x, y in kept]
            means.append((mx, my))
        slope, _ = fit([x for x, _ in centred], [y for _, y in centred])
        for (mx, my), pairs in zip(means, stages.values()):
            for night, x, y in pairs:
                if night == left_out:
                    off_mean.append(math.log(y) - my)
                    left.append(math.log(y) - my - slope * (math.log(x) - mx))
    return {"nights": len(nights), "sd_out_of_sample": rms(off_mean), "left_sd": rms(left)}


# (a run's key, what it is, whether its log is fitted: steal is often 0, so not its log)
COVARIATES = (("pace_us", "the host's pace", True),
              ("steal_pct", "the host's steal (% of a core)", False),
              ("driver_us", "the driver's CPU a message (same host only)", True))


def summary(runs: list[dict]) -> None:
    ys = [math.log(r["broker_us"]) for r in runs]
    centre = statistics.median(ys)
    mad = 1.4826 * statistics.median(abs(y - centre) for y in ys)
    print(f"\n{runs[0]['row']}: {len(runs)} runs; broker CPU per message "
          f"{statistics.median(r['broker_us'] for r in runs):.2f} us (median); spread of its "
          f"log: sd {statistics.stdev(ys):.3f}, MAD-sigma {mad:.3f}")
    for covariate, what, log_covariate in COVARIATES:
        values = [r[covariate] for r in runs]
        if len(set(values)) < 3:  # then some run's other runs could all have one value
            print(f"  {what:<44} took {len(set(values))} value(s): nothing to fit")
            continue
        e = explained(values, [r["broker_us"] for r in runs], log_covariate)
        print(f"  {what:<44} r {e['r']:+.2f}  slope {e['slope']:+.2f}  "
              f"sd left, out of sample {e['left_sd']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", default="pub-q0-c100-r10k",
                        help="a bench_driver row name; publish rows may name any rate "
                        "(pub-q0-cN-rMk: N publishers, M thousand msgs/s in all)")
    parser.add_argument("--other-row", help="alternate with this row (another load)")
    parser.add_argument("--runs", type=int, default=20, help="runs of each row (>= 4)")
    args = parser.parse_args(argv)
    if args.runs < 4:
        parser.error(f"--runs {args.runs}: a slope fitted on the other runs needs at least 4")
    rows = [args.row] + ([args.other_row] if args.other_row else [])
    for row in rows:
        if not row.startswith("pub-"):
            parser.error(f"{row}: a publish row (pub-q0-c100-r10k): the rate must be the "
                         "row's, not what a subscriber kept up with")
    raise_nofile()
    workdir = Path(tempfile.mkdtemp(prefix="host-pace-"))
    broker = Broker(workdir)
    sys_counter = SysCounter(broker.port)
    runs: dict[str, list[dict]] = {row: [] for row in rows}
    try:
        for run in range(args.runs):
            for row in rows:
                r = one_run(row, broker, sys_counter, workdir, run)
                runs[row].append(r)
                print(f"  run {run + 1:>2} {row:<18} broker {r['broker_us']:6.2f} us/msg "
                      f"({r['broker_sys_us']:5.2f} system)  pace {r['pace_us']:6.1f} us "
                      f"({r['seconds']} s)  host CPU {r['host_pct']:5.1f}%, steal "
                      f"{r['steal_pct']:4.2f}%  driver {r['driver_us']:6.2f} us/msg  broker "
                      f"woke {r['wakes']:.3f}/msg", flush=True)
    finally:
        sys_counter.stop()
        broker.stop()
    for row in rows:
        summary(runs[row])
    if args.other_row:
        a, b = (runs[row] for row in rows)
        ratios = [y["pace_us"] / x["pace_us"] for x, y in zip(a, b)]
        print(f"\npace at {rows[1]} over pace at {rows[0]}, run by run: median "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f} to {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much of the broker's CPU per message, run to run, is the host's pace or its steal:
one rated row run again and again, with the pipeline's broker sampler beside it.

    .state/venv/bin/python bench/host_pace.py [--row pub-q0-c100-r10k] [--runs 20]
        [--other-row pub-q0-c100-r20k | --acl-patterns 8]

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

With --other-row, runs alternate between the two rows (another load on the same broker,
the order swapped every run):
the median of their paired paces' ratio should be 1 if the pace measures the host and not
the broker's load. With --acl-patterns N, runs alternate between two brokers on the same
row, the second costlier a message by a known kind of change (an ACL of N + 1 patterns no
published topic matches, checked for every message: `broker_side.acl_patterns`): the
paired ratios say how much of the broker's change its own CPU, the driver's, their
ratio (the pipeline's ``broker_cpu_per_driver_cpu``) and the broker's at the driver's
(moved along the slope fitted on the first broker's runs, as the pipeline judges
``broker_cpu_s_per_10k`` at tonight's ``driver_cpu_s_per_10k``) each show, pair by pair.
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
from broker_side import Broker, SysCounter, acl_patterns, raise_nofile  # noqa: E402
from load_tools import REPO  # noqa: E402

from spark.stage_files import read_samples, sample_values  # noqa: E402
from tasks.analysis.covariate import fit as theil_sen  # noqa: E402
from tasks.driver.output import HOST_COLUMNS, HOST_FILE, SAMPLER_COLUMNS, SAMPLER_FILE  # noqa: E402

TIMING = {"warmup_s": 3, "measure_s": 12, "drain_s": 1}


def one_run(row: str, broker: Broker, sys_counter: SysCounter, workdir: Path, run: int) -> dict:
    out = workdir / f"sampler-{run}-{broker.port}-{row}"
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


def over_driver(run: dict) -> float:
    """The broker's CPU a message over the driver's: the pipeline's broker_cpu_per_driver_cpu
    (there over the driver processes' CPU at the same rate)."""
    return run["broker_us"] / run["driver_us"]


def summary(label: str, runs: list[dict]) -> None:
    ys = [math.log(r["broker_us"]) for r in runs]
    centre = statistics.median(ys)
    mad = 1.4826 * statistics.median(abs(y - centre) for y in ys)
    print(f"\n{label}: {len(runs)} runs; broker CPU per message "
          f"{statistics.median(r['broker_us'] for r in runs):.2f} us (median); spread of its "
          f"log: sd {statistics.stdev(ys):.3f}, MAD-sigma {mad:.3f}")
    ratio = [math.log(over_driver(r)) for r in runs]
    what = "the broker's over the driver's, its log"
    print(f"  {what:<44} sd {statistics.stdev(ratio):.3f}  (the pipeline's "
          "broker_cpu_per_driver_cpu: the slope held at 1)")
    for covariate, what, log_covariate in COVARIATES:
        values = [r[covariate] for r in runs]
        if len(set(values)) < 3:  # then some run's other runs could all have one value
            print(f"  {what:<44} took {len(set(values))} value(s): nothing to fit")
            continue
        e = explained(values, [r["broker_us"] for r in runs], log_covariate)
        print(f"  {what:<44} r {e['r']:+.2f}  slope {e['slope']:+.2f}  "
              f"sd left, out of sample {e['left_sd']:.3f}")


def paired(label: str, a: list[dict], b: list[dict], key) -> None:
    """The median and range of b's figure over a's, run by run (each pair run back to
    back)."""
    ratios = [key(y) / key(x) for x, y in zip(a, b)]
    print(f"  {label:<44} median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f} to {max(ratios):.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", default="pub-q0-c100-r10k",
                        help="a bench_driver row name; publish rows may name any rate "
                        "(pub-q0-cN-rMk: N publishers, M thousand msgs/s in all)")
    variant = parser.add_mutually_exclusive_group()
    variant.add_argument("--other-row", help="alternate with this row (another load)")
    variant.add_argument("--acl-patterns", type=int, metavar="N",
                         help="alternate with a second broker that costs more a message "
                         "(an ACL of N + 1 patterns no published topic matches) on the same "
                         "row")
    parser.add_argument("--runs", type=int, default=20, help="runs of each variant (>= 4)")
    args = parser.parse_args(argv)
    if args.runs < 4:
        parser.error(f"--runs {args.runs}: a slope fitted on the other runs needs at least 4")
    if args.acl_patterns is not None and args.acl_patterns < 1:
        parser.error(f"--acl-patterns {args.acl_patterns}: at least 1 pattern")
    rows = [args.row] + ([args.other_row] if args.other_row else [])
    for row in rows:
        if not row.startswith("pub-"):
            parser.error(f"{row}: a publish row (pub-q0-c100-r10k): the rate must be the "
                         "row's, not what a subscriber kept up with")
    raise_nofile()
    workdir = Path(tempfile.mkdtemp(prefix="host-pace-"))
    variants = [(row, row, 0) for row in rows]
    if args.acl_patterns:
        variants.append((f"{args.row}, ACL of {args.acl_patterns}", args.row, 1))
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in variants}
    brokers: list[Broker] = []
    counters: list[SysCounter] = []
    try:  # a broker that fails to start (SystemExit) stops the ones started before it
        brokers.append(Broker(workdir))
        if args.acl_patterns:
            brokers.append(Broker(workdir, acl_patterns(args.acl_patterns)))
        for broker in brokers:
            counters.append(SysCounter(broker.port))
        width = max(len(label) for label, _, _ in variants)
        for run in range(args.runs):
            # the order alternates run by run (ABBA), so neither variant is always the first
            for label, row, b in variants[::-1] if run % 2 else variants:
                r = one_run(row, brokers[b], counters[b], workdir, run)
                runs[label].append(r)
                print(f"  run {run + 1:>2} {label:<{width}} broker {r['broker_us']:6.2f} us/msg "
                      f"({r['broker_sys_us']:5.2f} system)  pace {r['pace_us']:6.1f} us "
                      f"({r['seconds']} s)  host CPU {r['host_pct']:5.1f}%, steal "
                      f"{r['steal_pct']:4.2f}%  driver {r['driver_us']:6.2f} us/msg  broker "
                      f"woke {r['wakes']:.3f}/msg", flush=True)
    finally:
        for counter in counters:
            counter.stop()
        for broker in brokers:
            broker.stop()
    for label, _, _ in variants:
        summary(label, runs[label])
    if len(variants) == 2:
        a, b = (runs[label] for label, _, _ in variants)
        print(f"\n{variants[1][0]} over {variants[0][0]}, run by run:")
        paired("the host's pace", a, b, lambda r: r["pace_us"])
        paired("the broker's CPU a message", a, b, lambda r: r["broker_us"])
        paired("the driver's CPU a message", a, b, lambda r: r["driver_us"])
        paired("the broker's over the driver's", a, b, over_driver)
        line = theil_sen([(math.log(r["broker_us"]), math.log(r["driver_us"])) for r in a])
        paired(f"the broker's at the driver's, slope {line.slope:.2f}", a, b,
               lambda r: math.exp(line.adjust(math.log(r["broker_us"]), math.log(r["driver_us"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

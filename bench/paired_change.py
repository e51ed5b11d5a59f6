"""A known change in the broker through the pipeline's stages, run in pairs: what each figure keeps.

How much of the change each judged figure keeps, as measured and moved along its covariate:

    .state/venv/bin/python bench/paired_change.py --pairs 8 --burn-us 10 --state /tmp/pc
    .state/venv/bin/python bench/paired_change.py --analyse-only --state /tmp/pc

Each pair runs `perfpipe run --suite SUITE` twice on the embedded default
(infra/inventories/local.yml), once as it is and once with Mosquitto loading the burn
plugin (infra/slowdown: BURN_US of the broker's own CPU on every PUBLISH it takes, before it
delivers it), the order swapped every pair. So every message costs the broker BURN_US more
CPU and reaches its subscriber at least BURN_US later, while the driver's own work a
message stays what it was: a change of the broker, not of the host. Each variant keeps
its own results store (PERFPIPE_STATE_DIR: STATE/plain and STATE/burn), and the pairs'
run ids are kept in STATE/pairs.json.

Per stage and figure (METRICS below), the burning run over the plain one of the same
pair, as measured and, for a figure with a covariate (`MetricDef.adjusted_by`: the
driver's CPU per message), moved along it: both runs moved to a common covariate along
the slope fitted on the stage's other plain runs (Theil-Sen, `tasks.analysis.covariate.fit`;
out of sample, as a detector fitting past nights would), as the detector judges a metric
at tonight's value of its covariate. A figure worth judging at its covariate keeps the
change in every pair, with a narrower range of ratios than it has as measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra.slowdown.slowdown import build_burn_plugin, burn_config  # noqa: E402
from sql import Store  # noqa: E402
from tasks.analysis.covariate import fit, log_of  # noqa: E402
from tasks.metrics import DRIVER_CPU, METRICS as DEFS  # noqa: E402
from tasks.settings import Settings  # noqa: E402

from measure_noise import run_one  # noqa: E402  (bench/, beside it)

# the judged figures printed: both that the pipeline judges at the driver's CPU, and the
# judged tail, as measured
METRICS = ("e2e_latency_p50", "broker_cpu_s_per_10k", "e2e_latency_p99_no_stall")
VARIANTS = ("plain", "burn")
PAIRS_FILE = "pairs.json"  # [{variant: run id}], in the order the pairs ran
PIN = ("off", "on", "alternate")  # a bench's --pin: the broker on a CPU of its own, or not
EMBEDDED = Settings.model_fields["inventory"].default  # the embedded default's inventory


def local_inventory(path: Path, burn_us: int | None = None, pinned: bool = False,
                    cpus_for: str = "all") -> Path:
    """The embedded default written to `path`: with the burn plugin in its broker's config
    (`burn_us` of the broker's CPU on every PUBLISH; None: without it), and with its broker
    kept on the first CPU this process may use and perfpipe's processes on the others
    (`broker.cpus`) when `pinned`, for every stage or a max-rate search's only (`cpus_for`,
    `broker.cpus_for`). A pinned night is of another fingerprint than an unpinned one, so
    the detector judges each kind on its own history."""
    doc = yaml.safe_load(EMBEDDED.read_text())
    if burn_us is not None:
        doc["name"] = f"local-burn-{burn_us}us"
        doc["broker"]["extra_config"] = burn_config(build_burn_plugin(), burn_us)
    if pinned:
        doc["broker"]["cpus"] = str(min(os.sched_getaffinity(0)))
        if cpus_for != "all":
            doc["broker"]["cpus_for"] = cpus_for
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def pinned_nights(nights: int, pin: str) -> list[bool]:
    """Whether each of `nights` runs pinned (`local_inventory`): every one (`pin` on), none
    (off), or every other one, the first pinned (alternate)."""
    return [pin == "on" or (pin == "alternate" and i % 2 == 0) for i in range(nights)]


def pin_problem(pin: str) -> str | None:
    """Why `--pin PIN` cannot run on this machine (it leaves the broker one CPU and needs
    another for perfpipe's processes), or None."""
    if pin != "off" and len(os.sched_getaffinity(0)) < 2:
        return (f"--pin {pin} needs 2 CPUs or more; this process may use "
                f"{sorted(os.sched_getaffinity(0))}")
    return None


def newest_run(state: Path) -> str | None:
    """The id of the newest run in the state dir's store, None if it has none."""
    if not (state / "results.db").exists():
        return None
    store = Store(f"sqlite:///{state / 'results.db'}")
    try:
        newest = store.latest_runs(1)
    finally:
        store.close()
    return newest[0]["run_id"] if newest else None


def run_pairs(pairs: int, burn_us: int, suite: str, state: Path) -> None:
    inventories = {"plain": None, "burn": local_inventory(state / "burn.yml", burn_us)}
    ran: list[dict[str, str | None]] = []
    for i in range(pairs):
        pair: dict[str, str | None] = {}
        for variant in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            before = newest_run(state / variant)
            cond = run_one(suite, state / variant, state / "logs" / f"{i:02d}-{variant}.log",
                           inventories[variant])
            newest = newest_run(state / variant)
            pair[variant] = newest if newest != before else None  # None: it stored no run
            print(f"pair {i + 1}/{pairs} {variant}: exit {cond['exit']} in {cond['seconds']} s, "
                  f"load {cond['loadavg']}" + ("" if pair[variant] else ", stored no run"),
                  flush=True)
        ran.append(pair)
        (state / PAIRS_FILE).write_text(json.dumps(ran, indent=1))


def stage_nights(state: Path) -> dict[str, dict[str, list[dict | None]]]:
    """variant -> stage key -> each pair's metrics of that stage (None: invalid or absent),
    pairs in the order they ran (STATE/pairs.json)."""
    pairs = json.loads((state / PAIRS_FILE).read_text())
    out: dict[str, dict[str, list[dict | None]]] = {}
    for variant in VARIANTS:
        store = Store(f"sqlite:///{state / variant / 'results.db'}")
        stages: dict[str, list[dict | None]] = {}
        for i, pair in enumerate(pairs):
            for st in store.stages(pair[variant]) if pair.get(variant) else ():
                nights = stages.setdefault(st["stage_key"], [None] * len(pairs))
                nights[i] = st["metrics"] if st["validity"] == "valid" else None
        store.close()
        out[variant] = stages
    return out


def _logs(metrics: dict | None, *names: str) -> tuple[float, ...] | None:
    """The logs of these metrics of a run's stage, or None if one is missing."""
    logs = tuple(log_of((metrics or {}).get(n)) for n in names)
    return None if None in logs else logs


def _range(ratios: list[float]) -> str:
    higher = sum(r > 1 for r in ratios)
    return (f"median {statistics.median(ratios):.3f} ({min(ratios):.3f} to {max(ratios):.3f}, "
            f"higher in {higher} of {len(ratios)})")


def paired_figures(plain: list[dict | None], burn: list[dict | None], metric: str,
                   by: str | None) -> dict:
    """The burning run over the plain one, pair by pair: as measured and, with a covariate
    `by`, both moved along the slope fitted on the other pairs' plain runs."""
    names = (metric, by) if by else (metric,)
    pairs = []  # (pair index, the plain run's logs, the burning run's)
    for i, (a, b) in enumerate(zip(plain, burn)):
        logs_a, logs_b = _logs(a, *names), _logs(b, *names)
        if logs_a and logs_b:
            pairs.append((i, logs_a, logs_b))
    out: dict = {"pairs": len(pairs),
                 "measured": [math.exp(b[0] - a[0]) for _, a, b in pairs]}
    fitted = {i: logs for i, n in enumerate(plain) if by and (logs := _logs(n, *names))}
    if by and len(fitted) > 3:
        lines = [fit([p for j, p in fitted.items() if j != i]) for i, _, _ in pairs]
        out["slopes"] = [line.slope for line in lines]
        out["at_covariate"] = [math.exp(line.adjust(*b) - line.adjust(*a))
                               for line, (_, a, b) in zip(lines, pairs)]
    return out


def report(state: Path) -> None:
    nights = stage_nights(state)
    for key in sorted(nights["plain"]):
        plain, burn = nights["plain"][key], nights["burn"].get(key, [])
        print(f"\n{key}")
        for metric in METRICS:
            by = DEFS[metric].adjusted_by
            f = paired_figures(plain, burn, metric, by)
            if f["pairs"] < 2:
                print(f"  {metric}: {f['pairs']} usable pair(s), too few")
                continue
            print(f"  {metric}, burning over plain, {f['pairs']} pairs:")
            print(f"    as measured                          {_range(f['measured'])}")
            if "at_covariate" in f:
                slope = statistics.median(f["slopes"])
                print(f"    at {by}, slope {slope:.2f}  {_range(f['at_covariate'])}")
        driver = paired_figures(plain, burn, DRIVER_CPU, None)
        if driver["pairs"] >= 2:
            print(f"  {DRIVER_CPU}, burning over plain     {_range(driver['measured'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9,
                        help="pairs of runs (>= 4; with 9 or more every slope is fitted on "
                             "the detector's 8 nights or more)")
    parser.add_argument("--burn-us", type=int, default=10,
                        help="the broker's extra CPU on every message it takes, in us")
    parser.add_argument("--suite", default="smoke", help="the suite each run runs")
    parser.add_argument("--state", type=Path, required=True,
                        help="scratch folder: STATE/plain and STATE/burn are the runs' state dirs")
    parser.add_argument("--analyse-only", action="store_true",
                        help="only print the figures of the runs already in STATE")
    args = parser.parse_args(argv)
    if not args.analyse_only:
        if args.pairs < 4:
            parser.error(f"--pairs {args.pairs}: give 4 or more (each pair's slope is fitted "
                         "on the other pairs' plain runs)")
        if (args.state / PAIRS_FILE).exists():
            parser.error(f"--state {args.state}: it holds runs already ({PAIRS_FILE}); give "
                         "an empty folder, or add --analyse-only to read them")
        if args.burn_us <= 0:
            parser.error(f"--burn-us {args.burn_us}: give a positive number of microseconds")
        args.state.mkdir(parents=True, exist_ok=True)
        run_pairs(args.pairs, args.burn_us, args.suite, args.state)
    if not (args.state / PAIRS_FILE).exists():
        parser.error(f"--state {args.state}: no {PAIRS_FILE}, so no pairs ran there")
    report(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())

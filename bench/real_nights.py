"""Real nights through the pipeline, then a known change in the broker: what the nightly says.

    .state/venv/bin/python bench/real_nights.py --state /tmp/rn --plain 20 --burn-us 2
    .state/venv/bin/python bench/real_nights.py --state /tmp/rn2 --seed-from /tmp/rn \\
        --plain 0 --burn-us 1
    .state/venv/bin/python bench/real_nights.py --analyse-only --state /tmp/rn

Runs `perfpipe run --suite SUITE` PLAIN times on the embedded default
(infra/inventories/local.yml), then BURN_NIGHTS times with Mosquitto loading the burn
plugin (infra/slowdown: BURN_US of the broker's own CPU on every PUBLISH it takes, before
it delivers it), all in one results store (PERFPIPE_STATE_DIR=STATE), as nights of a
nightly would be. --seed-from starts STATE with a copy of another state's store (its
nights come first: a noise batch of `measure_noise.py`, or this script's plain nights, so
one history is tried with several steps). --pin keeps the broker on the first CPU and
perfpipe's processes on the others (`broker.cpus`) on every night or every other one, for
every stage or, with --cpus-for capacity, for the max-rate searches only (the rated stages
of `--suite nightly` then run as unpinned nights do): a pinned night is of its own
fingerprint, so each kind builds its own history and is reported apart. The runs, in
order, are kept in STATE/nights.json.

Then every run is judged again in the order it ran, with the detector as it is now, on a
copy of the store (STATE/rejudged.db: the verdicts the runs recorded are kept), and it
prints:
- the plain nights past learning: every change verdict (suspected, regression,
  improvement) on a judged metric, beside how many stage-nights it was judged on and how
  many were not judged as their host was off its usual (pace, steal): what a user would have been shown
  on an unchanged broker;
- for the broker's cost, judged across the stages too: on the plain nights past learning,
  the rank correlations of the stages' changes and the robust sigma of each change over
  its sd, per stage and combined (near 1 when the stages are independent, as judging them
  together assumes);
- per stage, the night-to-night spread of the figures the burn moves, the judged tail, the
  driver's CPU, the broker's wake-ups and a search's max_rate over the plain nights (their
  medians and the robust sigma of their logs), beside the MDE of the last one judged;
- the burning nights: per stage, for the broker's cost and e2e p50 (the figures the burn
  moves), each night's verdict, change and the MDE the nightly reported beside it (for
  the cost also its change and MDE across the stages, `tasks.analysis.across`); and the
  change the burn makes to the cost, BURN_US x 10,000 / 1e6 CPU-s per 10K over the plain
  nights' median (loading the plugin adds a cost of its own: --burn-us 0 measures it).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sqlite3
import statistics
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sql import Store  # noqa: E402
from tasks.analysis.host_gates import gated_note  # noqa: E402
from tasks.analysis.noise import noise_sigma  # noqa: E402
from tasks.analysis.policy import Policy, judged_metrics  # noqa: E402
from tasks.catalog.cpus import CPUS_FOR  # noqa: E402
from tasks.catalog.stages import is_probe  # noqa: E402
from tasks.metrics import DRIVER_CPU, METRICS as DEFS  # noqa: E402
from tasks.steps.compare import compare_stored  # noqa: E402
from tasks.views.summary import NOTABLE  # noqa: E402
from tasks.views.tables import across_note, mde_text  # noqa: E402

from measure_noise import run_one  # noqa: E402  (bench/, beside it)
from paired_change import (  # noqa: E402
    PIN,
    local_inventory,
    newest_run,
    pin_problem,
    pinned_nights,
)
from replayed_detector import judged_z  # noqa: E402

# [{"run_id", "variant": "seed" | "plain" | "burn", "burn_us" of a burning night, "pinned",
# "cpus_for" of a pinned night}], in order ("pinned" absent: not pinned; "cpus_for": all)
NIGHTS_FILE = "nights.json"
REJUDGED = "rejudged.db"
# the figures the burn moves: those judged at the driver's CPU (the broker's cost, e2e p50)
STEPPED = tuple(m for m, d in DEFS.items() if d.adjusted_by == DRIVER_CPU)
COST = "broker_cpu_s_per_10k"
# the figures whose night-to-night spread `noise` prints, where a stage has them: the
# stepped ones, the judged tail, the covariate, how often the broker was woken (a pinned
# broker is woken across CPUs) and a search's answer
SPREAD = (*STEPPED, "e2e_latency_p99_no_stall", DRIVER_CPU, "broker_ctx_switches_per_s",
          "max_rate")


def seed(state: Path, source: Path) -> list[dict]:
    """STATE's store begun as a copy of `source`'s: its runs, oldest first, as seed nights."""
    shutil.copy2(source / "results.db", state / "results.db")
    store = Store(f"sqlite:///{state / 'results.db'}")
    try:
        runs = sorted(store.latest_runs(10_000), key=lambda r: r["started_at"])
    finally:
        store.close()
    known = json.loads((source / NIGHTS_FILE).read_text()) \
        if (source / NIGHTS_FILE).exists() else []
    variants = {n["run_id"]: n for n in known if n["run_id"]}
    return [variants.get(r["run_id"], {"run_id": r["run_id"], "variant": "seed"})
            for r in runs]


def night_plan(plain: int, burn_nights: int, pin: str) -> list[tuple[str, bool]]:
    """(variant, pinned) of each night to run: PLAIN plain nights, then BURN_NIGHTS burning
    ones; pinned all (`pin` on), none (off), or every other plain night, the first pinned
    (an odd PLAIN gives the pinned kind one more), and each burning night run pinned then
    not (alternate)."""
    burning = [("burn", True), ("burn", False)] * burn_nights if pin == "alternate" \
        else [("burn", pin == "on")] * burn_nights
    return [("plain", pinned) for pinned in pinned_nights(plain, pin)] + burning


def run_nights(state: Path, suite: str, plan: list[tuple[str, bool]], burn_us: int,
               nights: list[dict], cpus_for: str = "all") -> None:
    inventories = {(variant, pinned): local_inventory(
        state / f"{variant}{'-pinned' if pinned else ''}.yml",
        burn_us if variant == "burn" else None, pinned, cpus_for)
        for variant, pinned in set(plan)}
    inventories["plain", False] = None  # the embedded default, as the seeds' nights ran
    for i, (variant, pinned) in enumerate(plan):
        before = newest_run(state)
        name = f"{i:02d}-{variant}{'-pinned' if pinned else ''}.log"
        cond = run_one(suite, state, state / "logs" / name,
                       inventories[variant, pinned])
        run_id = newest_run(state)
        stored = run_id if run_id != before else None
        nights.append({"run_id": stored, "variant": variant, "pinned": pinned,
                       **({"burn_us": burn_us} if variant == "burn" else {}),
                       **({"cpus_for": cpus_for} if pinned else {})})
        (state / NIGHTS_FILE).write_text(json.dumps(nights, indent=1))
        print(f"night {i + 1}/{len(plan)} {variant}{' pinned' if pinned else ''}: exit "
              f"{cond['exit']} in {cond['seconds']} s, load {cond['loadavg']}"
              + ("" if stored else ", stored no run"), flush=True)


def rejudge(state: Path, nights: list[dict], policy: Policy) -> dict[str, dict[str, dict]]:
    """Every stored night judged again in order with `policy`, on a copy of the store
    without its verdicts and alerts: run id -> stage key -> {"metrics", "validity",
    "verdicts": metric -> row}, a search's probes and holds left out."""
    copy = state / REJUDGED
    shutil.copy2(state / "results.db", copy)
    with closing(sqlite3.connect(copy)) as db:  # the verdicts and alerts the runs recorded
        db.execute("DELETE FROM comparisons")
        db.execute("DELETE FROM alerts")
        db.commit()
    store = Store(f"sqlite:///{copy}")
    judged: dict[str, dict[str, dict]] = {}
    try:
        for night in nights:
            if not night["run_id"]:
                continue
            compare_stored(store, night["run_id"], {}, policy)
            judged[night["run_id"]] = {
                st["stage_key"]: {"metrics": st["metrics"], "validity": st["validity"],
                                  "verdicts": {c["metric"]: c for c in st["comparisons"]}}
                for st in store.stages(night["run_id"])
                if not is_probe(st)}
    finally:
        store.close()
    return judged


def plain_verdicts(nights: list[dict], judged: dict[str, dict[str, dict]]) -> None:
    """The change verdicts on the plain nights past learning, per judged metric."""
    metrics = judged_metrics(Policy())
    seen, off, changes, shown = Counter(), Counter(), {v: Counter() for v in NOTABLE}, []
    for i, night in enumerate(nights):
        if night["variant"] == "burn" or night["run_id"] not in judged:
            continue
        for key, stage in sorted(judged[night["run_id"]].items()):
            for m in metrics:
                row = stage["verdicts"].get(m, {})
                if row.get("verdict") in ("unchanged",) + NOTABLE:
                    seen[m] += 1
                off[m] += gated_note(row.get("detail") or {}) is not None
                if row.get("verdict") in NOTABLE:
                    changes[row["verdict"]][m] += 1
                    shown.append(f"  night {i + 1} {key} {m}: {_said(row)}")
    print("\nplain nights: change verdicts on an unchanged broker past learning "
          "(stage-nights judged), and nights not judged as their host was off its usual "
          "(pace, steal)")
    print(f"{'metric':30} {'judged':>7} " + " ".join(f"{v:>11}" for v in NOTABLE)
          + f" {'off usual':>9}")
    for m in metrics:
        print(f"{m:30} {seen[m]:7d} " + " ".join(f"{changes[v][m]:11d}" for v in NOTABLE)
              + f" {off[m]:9d}")
    print(f"{'every judged metric':30} {sum(seen.values()):7d} "
          + " ".join(f"{sum(changes[v].values()):11d}" for v in NOTABLE)
          + f" {sum(off.values()):9d}")
    print("\n".join(shown))


def across_check(nights: list[dict], judged: dict[str, dict[str, dict]]) -> None:
    """For each metric judged across stages, on the plain nights past learning: are the
    stages' changes independent, as judging them together assumes? Each change in units
    of its sd under no change (z), as the detector judged it: their rank correlations from
    stage to stage, and the robust sigma of the stages' z and of the combination's (near 1
    each when the sds are right and the stages independent; the combination's higher when
    the stages move together)."""
    for m in (m for m, d in DEFS.items() if d.across_stages):
        plain = [judged[n["run_id"]] for n in nights
                 if n["variant"] != "burn" and n["run_id"] in judged]
        rows = [{key: st["verdicts"].get(m, {}).get("detail") or {} for key, st in night.items()}
                for night in plain]
        # nights on which every stage of the suite's first such night was judged together
        kept = [i for i, r in enumerate(rows) if judged_z(list(r.values())) is not None]
        kept = [i for i in kept if sorted(rows[i]) == sorted(rows[kept[0]])]
        rows = [rows[i] for i in kept]
        if len(rows) < 3:
            print(f"\n{m} across stages: {len(rows)} plain nights judged so, too few to check")
            continue
        keys = sorted(rows[0])
        zs = np.array([judged_z([r[k] for k in keys]) for r in rows])
        z, combined = zs[:, :-1], list(zs[:, -1])
        corr = spearmanr(z).correlation if len(keys) > 2 else [[1, spearmanr(z).correlation]]
        pairs = [corr[i][j] for i in range(len(keys)) for j in range(i + 1, len(keys))]
        print(f"\n{m} across {len(keys)} stages, {len(rows)} plain nights past learning: rank "
              f"correlation of the stages' changes {min(pairs):+.2f} to {max(pairs):+.2f}; "
              "robust sigma of z, per stage "
              + " / ".join(f"{noise_sigma(list(col)):.2f}" for col in z.T)
              + f", combined {noise_sigma(combined):.2f}; the combination's largest score "
              f"{max(r[keys[0]]['across']['score'] for r in rows):.2f} (1: a bad night)")
        for name in (m, DEFS[m].adjusted_by):
            if name:  # what the z's no longer carry: the host the stages share on a night
                print(f"  {name} as measured on those nights: "
                      + shared_host([plain[i] for i in kept], keys, name))


def shared_host(nights: list[dict[str, dict]], keys: list[str], metric: str) -> str:
    """How much of a metric's night-to-night swing the stages share, on these nights: the
    Pearson correlations of their logs (each stage's about its median) from stage to
    stage; bench_detector.py --shared-host draws the host's pace at such a correlation."""
    logs = np.array([[math.log(night[k]["metrics"][metric]) for k in keys] for night in nights
                     if all((night[k]["metrics"].get(metric) or 0) > 0 for k in keys)])
    if len(logs) < 3:
        return f"{len(logs)} nights with a value on every stage, too few"
    corr = np.corrcoef((logs - np.median(logs, axis=0)).T)
    pairs = [corr[i][j] for i in range(len(keys)) for j in range(i + 1, len(keys))]
    return (f"correlation of the stages' logs {min(pairs):+.2f} to {max(pairs):+.2f}, "
            f"{statistics.fmean(pairs):+.2f} on average ({len(logs)} nights)")


def _said(row: dict) -> str:
    """A verdict row as a line: the verdict, the change and the MDE reported beside it."""
    detail = row.get("detail") or {}
    change, mde, off = row.get("change_pct"), detail.get("mde_pct"), gated_note(detail)
    across = detail.get("across")
    return (f"{row['verdict']:11} change " + (f"{change:+.1f}%" if change is not None else "-")
            + (f", MDE {mde:.1f}%" if mde is not None else "")
            + (f", not judged: {off}" if off is not None else "")
            + (f"; {across_note(detail, short=True)}, MDE {across['mde_pct']:.1f}% on all"
               if across else ""))


def _median(values: list[float | None]) -> float | None:
    usable = [v for v in values if v]
    return statistics.median(usable) if usable else None


def _last_mde(plain: list[dict[str, dict]], key: str, metric: str) -> str:
    """The MDE of the newest plain night on which `metric` of stage `key` was judged (and
    of a step on every stage, for a metric judged across them), or '-'."""
    for stages in reversed(plain):
        row = stages.get(key, {}).get("verdicts", {}).get(metric) or {}
        if "mde_pct" in (row.get("detail") or {}):
            return mde_text(row["detail"])
    return "-"


def burning_verdicts(nights: list[dict], judged: dict[str, dict[str, dict]]) -> None:
    """Per stage, the stepped figures' verdicts on each burning night, beside the change
    the burn makes."""
    plain = [judged[n["run_id"]] for n in nights
             if n["variant"] != "burn" and n["run_id"] in judged]
    burning = [(n, judged.get(n["run_id"])) for n in nights if n["variant"] == "burn"]
    if not burning:
        return
    print(f"\nburning nights ({len(burning)}): per stage, the change each night, its "
          "verdict and the MDE the nightly reported beside it")
    for key in sorted({k for p in plain for k in p}):
        print(f"\n{key}")
        for m in STEPPED:
            base = _median([p[key]["metrics"].get(m) for p in plain
                            if key in p and p[key]["validity"] == "valid"])
            burn_us = burning[0][0].get("burn_us") or 0
            if base is None:
                print(f"  {m}: no plain night measured it")
                continue
            # the burn adds exactly this to the cost; to e2e p50, at least this
            floor = burn_us * 1e4 / 1e6 if m == COST else burn_us
            mde = _last_mde(plain, key, m)
            print(f"  {m}: plain median {base:.4g}; the burn's {burn_us} us adds "
                  f"{'' if m == COST else 'at least '}{100 * floor / base:+.1f}%; the MDE of the "
                  f"last plain night judged {mde}")
            for i, (night, stages) in enumerate(burning):
                row = ((stages or {}).get(key) or {}).get("verdicts", {}).get(m)
                if row is None:
                    print(f"    night {i + 1}: no verdict (the run or stage is missing)")
                    continue
                print(f"    night {i + 1}: {_said(row)}")


def noise(nights: list[dict], judged: dict[str, dict[str, dict]]) -> None:
    """Per stage, over the valid plain nights: the SPREAD figures' medians and night-to-night
    spread as measured (the robust sigma of their logs), beside the MDE the nightly
    reported on the last plain night it judged each."""
    plain = [judged[n["run_id"]] for n in nights
             if n["variant"] != "burn" and n["run_id"] in judged]
    print(f"\nnoise over the {len(plain)} plain nights, per stage: each figure's median and "
          "robust sigma as measured, the MDE of the last plain night judged, [valid nights]")
    for key in sorted({k for p in plain for k in p}):
        cells = []
        for m in SPREAD:
            logs = [math.log(p[key]["metrics"][m]) for p in plain
                    if key in p and p[key]["validity"] == "valid"
                    and (p[key]["metrics"].get(m) or 0) > 0]
            if not logs and all(p.get(key, {}).get("metrics", {}).get(m) is None for p in plain):
                continue  # a figure this stage does not have (max_rate: a search's)
            spread = (f"median {math.exp(statistics.median(logs)):.4g}, robust sigma "
                      f"{100 * noise_sigma(logs):.1f}%") if len(logs) >= 3 else "too few"
            cells.append(f"{m} {spread}, MDE {_last_mde(plain, key, m)} [{len(logs)}]")
        print(f"  {key}:\n    " + "\n    ".join(cells))


def report(state: Path, policy: Policy) -> None:
    nights = json.loads((state / NIGHTS_FILE).read_text())
    variants = Counter(n["variant"] for n in nights if n["run_id"])
    print(f"nights stored: {dict(variants)}; judged again in order with the detector as it "
          f"is now, pace_gate {policy.pace_gate}, steal_gate {policy.steal_gate:g}, "
          f"across_level {policy.across_level:g} "
          f"({state / REJUDGED})")
    judged = rejudge(state, nights, policy)
    kinds = sorted({bool(n.get("pinned")) for n in nights})
    for pinned in kinds:  # a pinned night is of its own fingerprint, judged on its own history
        kind = [n for n in nights if bool(n.get("pinned")) == pinned]
        if len(kinds) > 1:
            fors = sorted({n.get("cpus_for", "all") for n in kind if pinned})
            label = f"pinned for {'/'.join(fors)}" if pinned else "not pinned"
            print(f"\n=== {label} nights ({len(kind)}; the "
                  "night numbers below count these alone) ===")
        plain_verdicts(kind, judged)
        across_check(kind, judged)
        noise(kind, judged)
        burning_verdicts(kind, judged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, required=True,
                        help="scratch state dir of the runs (PERFPIPE_STATE_DIR)")
    parser.add_argument("--seed-from", type=Path,
                        help="a state dir whose store STATE starts with (its runs come first)")
    parser.add_argument("--plain", type=int, default=20, help="plain nights to run")
    parser.add_argument("--burn-nights", type=int, default=2,
                        help="burning nights to run after them")
    parser.add_argument("--burn-us", type=int, default=2,
                        help="the broker's extra CPU on every message it takes, in us (0: the "
                             "plugin loaded, burning nothing: what loading it costs)")
    parser.add_argument("--suite", default="smoke", help="the suite each night runs")
    parser.add_argument("--pin", choices=PIN, default="off",
                        help="keep the broker on the first CPU and perfpipe's processes on "
                             "the others (broker.cpus) on every night, none, or every other "
                             "plain night (the first pinned) and each burning night once "
                             "pinned and once not; each kind is judged on its own history")
    parser.add_argument("--cpus-for", choices=CPUS_FOR, default="all",
                        help="the stages a pinned night keeps the broker on its CPU for "
                             "(broker.cpus_for): every stage, or a max-rate search's probes "
                             "and holds only (capacity: run --suite nightly)")
    parser.add_argument("--pace-gate", type=float, default=Policy().pace_gate,
                        help="the detector's pace_gate when judging again (latency is not "
                             "judged on a host this far off its usual pace; 10: no gate)")
    parser.add_argument("--steal-gate", type=float, default=Policy().steal_gate,
                        help="the detector's steal_gate when judging again (latency, the "
                             "broker's cost and max_rate are not judged on a host whose "
                             "steal is this many %% of a core above its usual; 1000: no gate)")
    parser.add_argument("--across-level", type=float, default=Policy().across_level,
                        help="the detector's across_level when judging again (the share of a "
                             "metric's false-alarm budget its test across stages spends; 0: "
                             "no such test, the stages' own test spends it all)")
    parser.add_argument("--analyse-only", action="store_true",
                        help="only judge again and print the nights already in STATE")
    args = parser.parse_args(argv)
    if not 0 < args.pace_gate:
        parser.error(f"--pace-gate {args.pace_gate}: give a positive fraction (0.2: 20%; "
                     "10: no gate)")
    if not 0 < args.steal_gate:
        parser.error(f"--steal-gate {args.steal_gate}: give a positive number of % of a core "
                     "(20; 1000: no gate)")
    try:  # the policy's own check of across_level, before any night runs
        policy = Policy(pace_gate=args.pace_gate, steal_gate=args.steal_gate,
                        across_level=args.across_level)
    except ValueError as exc:
        parser.error(f"--across-level: {exc}")
    if not args.analyse_only:
        if (args.state / NIGHTS_FILE).exists() or (args.state / "results.db").exists():
            parser.error(f"--state {args.state}: it holds runs already; give an empty "
                         "folder, or add --analyse-only to read them")
        if min(args.burn_us, args.plain, args.burn_nights) < 0:
            parser.error("--burn-us, --plain and --burn-nights: give 0 or more")
        if pin_problem(args.pin):
            parser.error(pin_problem(args.pin))
        if args.cpus_for != "all" and args.pin == "off":
            parser.error(f"--cpus-for {args.cpus_for}: only for pinned nights; add --pin on or "
                         "--pin alternate")
        if args.seed_from and not (args.seed_from / "results.db").exists():
            parser.error(f"--seed-from {args.seed_from}: no results.db there")
        args.state.mkdir(parents=True, exist_ok=True)
        nights = seed(args.state, args.seed_from) if args.seed_from else []
        (args.state / NIGHTS_FILE).write_text(json.dumps(nights, indent=1))
        run_nights(args.state, args.suite, night_plan(args.plain, args.burn_nights, args.pin),
                   args.burn_us, nights, args.cpus_for)
    if not (args.state / NIGHTS_FILE).exists():
        parser.error(f"--state {args.state}: no {NIGHTS_FILE}, so no nights ran there")
    report(args.state, policy)
    return 0


if __name__ == "__main__":
    sys.exit(main())

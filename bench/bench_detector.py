"""How good is the regression detector? Recall, false alarms and nights to detect, measured
on synthetic histories whose noise is this machine's own (bench/noise_measured.json).

    .state/venv/bin/python bench/bench_detector.py [--series 500] [--seed 1]

Every simulated night is a run of `SUITE` stages on one fingerprint, each with all the
judged metrics (`simulated_nights.py`: this machine's noise, drawn), judged as the compare
step judges them with the store's rules replayed in memory (`replayed_detector.py`). A
step hits one stage of the suite, or, in the rows of a change of the broker
(`--broker-only` prints them alone), every stage; every stage of an A/A suite is a
series. With `--shared-host RHO` a suite's stages share the host's pace, correlated at
RHO, as a night's stages share a host. A metric judged on a covariate has the noise and
bound of its own noise along the covariate's slope.

Scenarios: A/A (no change, 30 nights from an empty history) and steps (20 quiet nights,
then a step of known size from night 21 on, 5 nights watched). A detection is the first
`regression` verdict on the stepped metric; a false alarm is a metric entering
`regression` without a step (one alert). The same figures are printed for a plain
"percentage vs last night" detector (worse than last night by the minimum practical
effect: an alarm) as the ratio to beat. The bounds are `detector_bounds.py`'s. Next to
perfpipe's recall, `recall_bound` prints
what no detector can beat at that noise and false-alarm budget (the Neyman-Pearson test
with the true level and noise law given, its threshold set on simulated A/A series so that
it too raises 1 alarm per 100: `budget_rate`): where a bar is above it, the machine's
noise, not the detector, is what fails it. Beside it, the recall of perfpipe's own
two-night rule were the level and noise known: the difference between that and perfpipe is
what estimating them from the history costs. Where perfpipe falls short, the same rule
with the noise of all the suite's nights pooled (as if known equal) says how much of that
cost is left when the rule has every night the suite gives it, estimated about as well as
they allow: on t3 noise a night is worth at most half a degree of freedom to an unbiased
noise estimate, asymptotically (`fisher_dof_per_night`), and t_scale takes 0.47 at 30
nights. And for those cells, the best test that must learn the noise's scale
(`scale_bound.py`: the best scale-invariant test, the level and noise law still given),
from the stage's own nights and from all the suite's: where even that is under 80% of
the bound, the bar asks for more than those nights tell the test best at using them;
beside it, a candidate rule built on that test with nothing given. What a noise estimate
from n nights is worth (its degrees of freedom, MAD against the detector's t scale) is
printed first. The MDE table sets what the pipeline reports
beside the step the bound catches with 90% probability within two nights. Figures come
from one run; nothing is timed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tasks.analysis.detector import step_pct  # noqa: E402
from tasks.analysis.noise import T_EFFICIENCY, noise_sigma, t_scale  # noqa: E402
from tasks.analysis.policy import Policy, judged_metrics  # noqa: E402
from tasks.analysis.thresholds import MDE_POWER  # noqa: E402
from tasks.metrics import METRICS  # noqa: E402

# bench/, the script's own folder
from detector_bounds import (CHECKED_BUDGET, bound_mde, check_passes,  # noqa: E402
                             fisher_dof_per_night, known_noise_recall, learned_bounds,
                             recall_bound)
from replayed_detector import AA, Replay, across_z_line, naive  # noqa: E402
from simulated_nights import (AA_NIGHTS, MIXED_NOISE, SUITE, T_DOF, TAIL, WARM, Host, Noise,  # noqa: E402
                              load_noise, log_step, step_name)

RUN = Replay()  # this run's detector policy and shared host (main sets it from the options)


def interval(count: int, n: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 95% interval of a rate seen `count` times in `n` (an
    alarm count above `n` is read as `n`)."""
    ci = binomtest(min(count, n), n).proportion_ci(method="exact", confidence_level=0.95)
    return float(ci.low), float(ci.high)


def fmt_pct(x: float | None) -> str:
    return "   -" if x is None else f"{100 * x:5.1f}%"


def measured_rows(noise: Noise, metrics: list[str], n: int, rng: np.random.Generator) -> None:
    """Steps at this machine's measured noise, perfpipe against the naive detector."""
    steps = [("delivered_rate", 0.05), (TAIL, 0.10), ("e2e_latency_p50", 0.10),
             ("pub_ack_latency_p99_no_stall", 0.10), ("delivered_rate", 0.15), (TAIL, 0.15),
             ("e2e_latency_p50", 0.15), ("broker_cpu_s_per_10k", 0.10)]
    print(f"\nsteps at night {WARM + 1} after {WARM} quiet nights; recall@k: confirmed "
          f"regression within k nights; nights to detect among the detected")
    print(f"{'step (size in noise sigmas)':34} {'detector':9} {'recall@1':>8} {'recall@2':>8} "
          f"{'recall@5':>8} {'nights p50/p95':>14} {'alarms before step':>18} "
          f"{'bound @1/@2':>14}")
    for metric, size in steps:
        for name, det in (("perfpipe", RUN.perfpipe), ("naive", naive)):
            r = RUN.run_step(det, noise, metrics, metric, size, n, rng)
            nights = f"{r['median']}/{r['p95']}" if r["median"] else "-"
            sigmas = math.log1p(size) / max(noise.judged(metric), 1e-9)
            label = f"{step_name(metric, size)} ({sigmas:,.1f})" if name == "perfpipe" else ""
            bound = ""
            if name == "perfpipe":
                o1, o2 = recall_bound(noise.judged(metric), log_step(metric, size), rng)
                bound = f"{fmt_pct(o1).strip()}/{fmt_pct(o2).strip()}"
            print(f"{label:34} {name:9} {fmt_pct(r['recall1']):>8} {fmt_pct(r['recall2']):>8} "
                  f"{fmt_pct(r['recall5']):>8} {nights:>14} {r['early']:>18} {bound:>14}")


def broker_rows(noise: Noise, metrics: list[str], n: int, rng: np.random.Generator) -> None:
    """A change of the broker itself, the same on every stage: the metrics judged across
    stages (`tasks.analysis.across`), perfpipe against its stages judged alone; the MDE
    each reported on the night before the step (median over the series), for a step on
    its stage and on all of them."""
    across = [m for m in metrics if METRICS[m].across_stages]
    print(f"\na change of the broker: the step on all {SUITE} stages of the suite at night "
          f"{WARM + 1}; recall of the first stage, perfpipe against its stages judged alone "
          "(across_level 0: their own test spends the whole budget)")
    print(f"{'step (size in noise sigmas)':34} {'detector':12} {'recall@1':>8} {'recall@2':>8} "
          f"{'recall@5':>8} {'alarms before step':>18} {'MDE own / all stages':>20}")
    for metric in across:
        for size in (0.03, 0.05, 0.10):
            for name, det in (("perfpipe", RUN.perfpipe), ("stages alone", RUN.stages_alone)):
                r = RUN.run_step(det, noise, metrics, metric, size, n, rng, everywhere=True)
                sigmas = math.log1p(size) / max(noise.judged(metric), 1e-9)
                label = f"{step_name(metric, size)} ({sigmas:,.1f})" if name == "perfpipe" else ""
                mde = " / ".join("-" if v is None else f"{v:.1f}%" for v in r["mde"].values())
                print(f"{label:34} {name:12} {fmt_pct(r['recall1']):>8} "
                      f"{fmt_pct(r['recall2']):>8} {fmt_pct(r['recall5']):>8} {r['early']:>18} "
                      f"{mde:>20}")


def estimator_rows(rng: np.random.Generator, series: int = 4000) -> None:
    """What a noise estimate from n nights is worth on this noise law (t, 3 d.o.f.): the
    degrees of freedom of a chi-square whose log has the same variance (1 / (2 var), the
    large-sample form, which reads a little low at 8 nights), per night past the first,
    for the MAD and for the detector's `t_scale` (its `T_EFFICIENCY`)."""
    print(f"\nnoise estimates on t{T_DOF} noise, {series} histories each: degrees of freedom "
          f"per night past the first (detector assumes {T_EFFICIENCY} for t_scale); the most "
          f"any unbiased estimate is worth, asymptotically, from the t law's Fisher "
          f"information for its scale ({fisher_dof_per_night(T_DOF):.2f} per night)")
    for n in (8, 20, 30):
        logs = rng.standard_t(T_DOF, (series, n))
        worth = {}
        for name, estimate in (("MAD", lambda x: noise_sigma(list(x))),
                               ("t_scale", lambda x: t_scale(tuple(x), float(T_DOF)))):
            spread = np.var(np.log([estimate(x) for x in logs]))
            worth[name] = 1 / (2 * spread) / (n - 1)
        most = fisher_dof_per_night(T_DOF) * n / (n - 1)
        print(f"  {n:2d} nights: " + ", ".join(f"{k} {v:.2f}" for k, v in worth.items())
              + f", at most {most:.2f}")


def aa_rows(noise: Noise, metrics: list[str], n: int, rng: np.random.Generator) -> AA:
    """A/A histories from empty at the measured noise; the MDE each metric reports."""
    print(f"\nA/A: {n} stage histories of {AA_NIGHTS} nights from empty, in suites of {SUITE} "
          "stages, no change. Alarms: times a metric entered regression, per 100 series. "
          "Learning: change verdicts (suspected, regression, improvement) while a history was "
          f"shorter than {Policy().min_history} nights, all series. Later: suspected and "
          "improvement verdicts after that, per 100 series. MDE: the smallest step caught "
          f"within two nights with {100 * MDE_POWER:.0f}% probability, as the pipeline reports "
          "it (median over the series' last nights) and as the Neyman-Pearson bound implies")
    aa = RUN.run_aa(RUN.perfpipe, noise, metrics, n, rng)
    naive_aa = RUN.run_aa(naive, noise, metrics, n, rng)
    print(f"{'metric':28} {'noise':>7} {'alarms':>7} {'naive':>7} {'learning':>8} {'later':>7} "
          f"{'MDE':>7} {'bound':>7} {'too noisy':>9}")
    for m in metrics:
        sigma = noise.judged(m)
        mde = f"{np.median(aa.mde_pct[m]):.1f}%" if aa.mde_pct[m] else "-"
        print(f"{m:28} {100 * sigma:6.2f}% {100 * aa.alarms[m] / aa.series:7.2f} "
              f"{100 * naive_aa.alarms[m] / naive_aa.series:7.2f} {aa.learning_flags[m]:8d} "
              f"{100 * aa.later_flags[m] / aa.series:7.1f} {mde:>7} "
              f"{step_pct(m, bound_mde(sigma, rng)):6.1f}% "
              f"{100 * aa.too_noisy[m] / aa.series:8.0f}%")
    print(f"{'any metric of the stage':28} {'':7} {100 * aa.stages_alarmed / aa.series:7.2f} "
          f"{100 * naive_aa.stages_alarmed / naive_aa.series:7.2f}   (stages with at least "
          "one alarm, per 100)")
    for m, suites in aa.across_z.items():
        print(across_z_line(m, suites))
    return aa


def mixed_rows(noise: Noise, metrics: list[str], n: int, rng: np.random.Generator) -> AA:
    """A/A where one stage of each suite is twice as noisy as its peers: pooling must not
    lend it their quieter noise."""
    scales = (MIXED_NOISE,) + (1.0,) * (SUITE - 1)
    aa = RUN.run_aa(RUN.perfpipe, noise, metrics, n, rng, scales=scales, watched=0)
    worst = max(metrics, key=lambda m: aa.alarms[m])
    print(f"\nA/A, one stage of each suite twice as noisy as its {SUITE - 1} peers ({aa.series} "
          f"series of that stage): false alarms per 100 series, worst metric {worst} "
          f"{100 * aa.alarms[worst] / aa.series:.2f}, every metric "
          f"{100 * sum(aa.alarms.values()) / aa.series / len(metrics):.2f} on average; "
          + ", ".join(f"{m} {100 * aa.alarms[m] / aa.series:.2f}" for m in metrics))
    return aa


SWEEP_NOISE = (0.01, 0.02, 0.03, 0.05, 0.10, 0.20, 0.30)
SWEEP_STEPS = (0.05, 0.10, 0.15, 0.20)
SWEEP_METRICS = ("delivered_rate", "e2e_latency_p50", TAIL)


def sensitivity(noise: Noise, series: int, rng: np.random.Generator) -> list[dict]:
    """Recall within two nights against the bound, every noise x step x metric, the metric
    simulated alone (each metric has its own false-alarm budget); false alarms per 100 A/A
    series at each noise."""
    print(f"\nsensitivity (synthetic noise, not measured): {series} series per cell; "
          "recall@2 perfpipe / the same rule with the level and noise known / the bound; "
          "the bar: perfpipe at least 80% of the bound where the bound reaches 50%")
    cells = []
    for metric in SWEEP_METRICS:
        print(f"{metric:>16} " + " ".join(f"{step_name(metric, s).split()[1]:>26}"
                                          for s in SWEEP_STEPS) + f" {'A/A alarms':>11}")
        for sd in SWEEP_NOISE:
            swept = Noise({**noise.night, metric: sd}, noise.per_second_cv, noise.per_second_ar)
            row = []
            for size in SWEEP_STEPS:
                seed = int(rng.integers(2 ** 63))  # the same series for every detector
                got = RUN.run_step(RUN.perfpipe, swept, [metric], metric, size, series,
                                   np.random.default_rng(seed))["recall2"]
                best = recall_bound(sd, log_step(metric, size), rng, draws=1_000_000)[1]
                known = known_noise_recall(metric, sd, log_step(metric, size), RUN.policy)
                judged = best >= 0.5
                ok = got >= 0.8 * best if judged else None
                pooled = (RUN.run_step(RUN.all_pooled, swept, [metric], metric, size, series,
                                       np.random.default_rng(seed))["recall2"]
                          if ok is False else None)
                cells.append({"metric": metric, "noise": sd, "step": size, "recall2": got,
                              "known": known, "bound": best, "pass": ok, "pooled": pooled})
                mark = {True: "ok", False: "LOW", None: "  "}[ok]
                row.append(f"{100 * got:5.1f}/{100 * known:5.1f}/{100 * best:5.1f}% {mark:>3}")
            fa = RUN.run_aa(RUN.perfpipe, swept, [metric], series, rng)
            print(f"{100 * sd:15.0f}% " + " ".join(f"{c:>26}" for c in row)
                  + f" {100 * fa.alarms[metric] / fa.series:11.1f}")
    short = [c for c in cells if c["pass"] is False]
    learned = learned_bounds([(c["noise"], log_step(c["metric"], c["step"])) for c in short], rng)
    for c, (own, suite_wide, rule) in zip(short, learned):
        c["learned_own"], c["learned_suite"], c["rule"] = own, suite_wide, rule
    return cells


def learned_rows(short: list[dict]) -> None:
    """The cells short of the bar against the best test that must learn its noise
    (`scale_bound`): where even that is under 80% of the bound, the bar asks for more than
    those nights tell the test best at using them."""
    own = [c for c in short if c["learned_own"] < 0.8 * c["bound"]]
    wide = [c for c in short if c["learned_suite"] < 0.8 * c["bound"]]
    mine = [c for c in short if c["recall2"] >= 0.8 * c["learned_suite"]]
    rule = [c for c in short if c["rule"] >= 0.8 * c["bound"]]
    better = [c for c in short if c["rule"] > c["recall2"]]
    print(f"        the best scale-invariant test, which must learn the noise's scale (the "
          f"level and noise law given; bench/scale_bound.py), reaches 80% of the bound in "
          f"{len(short) - len(own)} of them from the stage's own {WARM} nights, in "
          f"{len(short) - len(wide)} from all {SUITE * WARM} of the suite's; perfpipe, which "
          f"pools, reaches 80% of the second in {len(mine)}. The candidate rule (that test "
          f"with the level estimated and the step a mixture, own nights; not the pipeline's) "
          f"reaches 80% of the bound in {len(rule)} and beats perfpipe in {len(better)}:")
    print(f"        {'cell':34} {'perfpipe':>8} {'pooled':>8} {'rule':>8} {'learned, own':>12} "
          f"{'learned, suite':>14} {'bound':>8}")
    for c in short:
        cell = f"{step_name(c['metric'], c['step'])} at {100 * c['noise']:.0f}%"
        print(f"        {cell:34} "
              f"{fmt_pct(c['recall2']):>8} {fmt_pct(c['pooled']):>8} {fmt_pct(c['rule']):>8} "
              f"{fmt_pct(c['learned_own']):>12} {fmt_pct(c['learned_suite']):>14} "
              f"{fmt_pct(c['bound']):>8}")


def cell_rows(cell: str, noise: Noise, metrics: list[str], n: int,
              rng: np.random.Generator) -> None:
    """One sensitivity cell (`--cell METRIC:NOISE:STEP`) and how often the A/A bar passes a
    detector at each spend."""
    metric, sd, size = cell.split(":")
    swept = Noise({**noise.night, metric: float(sd)}, noise.per_second_cv, noise.per_second_ar)
    got = RUN.run_step(RUN.perfpipe, swept, [metric], metric, float(size), n, rng)["recall2"]
    delta = log_step(metric, float(size))
    bound = recall_bound(float(sd), delta, rng)[1]
    own, suite_wide, rule = learned_bounds([(float(sd), delta)], rng)[0]
    half = recall_bound(float(sd), delta, rng, budget=CHECKED_BUDGET)[1]
    known = known_noise_recall(metric, float(sd), delta, RUN.policy)
    print(f"{step_name(metric, float(size))} at {100 * float(sd):g}% noise, {n} series: "
          f"recall@2 perfpipe {fmt_pct(got).strip()}, noise known {fmt_pct(known).strip()}, "
          f"candidate rule {fmt_pct(rule).strip()}, learned from own / suite nights "
          f"{fmt_pct(own).strip()} / {fmt_pct(suite_wide).strip()}, "
          f"bound {fmt_pct(bound).strip()}; the bound at {100 * CHECKED_BUDGET:g} alarms "
          f"per 100 series {fmt_pct(half).strip()}")
    checked = 2 * len(metrics)
    print("the A/A bar (the worst of the like and mixed suites' rates, each on 2000 series, "
          "at most 1 per 100) passes a detector whose rate is the same on every metric: "
          + ", ".join(f"at {100 * p:.1f} per 100 {100 * check_passes(p, 2000, checked):.0f}"
                      f" times in 100" for p in (CHECKED_BUDGET, 0.006, 0.008, 0.01)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--noise", type=Path, default=REPO / "bench" / "noise_measured.json")
    ap.add_argument("--sweep-series", type=int, default=200)
    ap.add_argument("--aa-series", type=int, default=0,
                    help="A/A histories for the false-alarm rows (default: --series); a rate "
                         "near the 1 per 100 bar needs thousands to tell 0.8 from 1.2")
    ap.add_argument("--skip-measured", action="store_true",
                    help="skip the step rows at the measured noise (the A/A and sweep run)")
    ap.add_argument("--across-level", type=float, default=Policy().across_level,
                    help="the detector's across_level (the share of the broker's cost's "
                         "false-alarm budget its test across the stages spends; 0: no such "
                         "test, each stage's own test spends it all)")
    ap.add_argument("--aa-only", action="store_true",
                    help="only the A/A rows, like and mixed suites (--aa-series each), and "
                         "their bars")
    ap.add_argument("--broker-only", action="store_true",
                    help="only the rows of a change of the broker on every stage (--series "
                         "series each): perfpipe, which also judges the broker's cost across "
                         "the stages, against its stages judged alone, and the MDE of each")
    ap.add_argument("--cell", metavar="METRIC:NOISE:STEP",
                    help="only one sensitivity cell, e.g. delivered_rate:0.015:0.05 (--series "
                         "series): recall within two nights, perfpipe / noise known / the "
                         "candidate rule / the best test learning the noise from the stage's "
                         "own and the suite's nights / bound, and the bound at half the "
                         "budget beside how often the A/A bar passes a detector at each spend")
    ap.add_argument("--pool-prior", type=float, default=Policy().pool_prior,
                    help="the detector's pool_prior (the prior weight on a stage sharing its "
                         "peers' noise against its being twice as noisy, by which their "
                         "nights count): to measure the trade between recall and the mixed "
                         "suite's false alarms")
    ap.add_argument("--pool-level", type=float, default=Policy().pool_level,
                    help="the detector's pool_level (the F test of the power guard)")
    ap.add_argument("--pool-power", type=float, default=Policy().pool_power,
                    help="the detector's pool_power (pool only once an F test at pool_level "
                         "would catch a stage twice as noisy this often; 0: no guard)")
    ap.add_argument("--shared-host", type=float, default=0.0, metavar="RHO",
                    help="draw the host's pace of a suite's stages correlated at RHO, as "
                         "stages run on one host on a night do (real_nights.py prints the "
                         "driver's CPU a message at +0.26 on average over 32 real nights); "
                         "0 (the default): each stage its own pace")
    ap.add_argument("--level", type=float, default=Policy().false_alarm_level,
                    help="the detector's false_alarm_level (two given nights both bad under "
                         "no change)")
    args = ap.parse_args()
    global RUN
    try:  # Host's own check of the correlation
        shared_host = args.shared_host and Host(args.shared_host, np.random.default_rng()).rho
    except ValueError as exc:
        ap.error(f"--shared-host: {exc}")
    try:  # the policy's own checks: across_level under the level, pool_prior a weight
        RUN = Replay(Policy(pool_prior=args.pool_prior, pool_level=args.pool_level,
                            pool_power=args.pool_power,
                            false_alarm_level=args.level, across_level=args.across_level),
                     shared_host)
    except ValueError as exc:  # its message names the setting; these options set them
        ap.error(f"{exc} (--pool-prior, --level, --across-level)")
    noise, doc = load_noise(args.noise)
    metrics = judged_metrics(Policy())
    rng = np.random.default_rng(args.seed)
    n = args.series
    print("the host's pace: " + (f"shared by a suite's stages, correlated at {RUN.shared_host:g}"
                                 if RUN.shared_host else "each stage its own"))
    if args.broker_only:
        broker_rows(noise, metrics, n, rng)
        return 0
    if args.cell:
        cell_rows(args.cell, noise, metrics, n, rng)
        return 0
    print(f"detector bench: {n} series per row, {len(metrics)} judged metrics per stage, "
          f"seed {args.seed}, false_alarm_level {RUN.policy.false_alarm_level:g}, across_level "
          f"{RUN.policy.across_level:g}, pool_prior {RUN.policy.pool_prior:g}, pool_level "
          f"{RUN.policy.pool_level:g}, pool_power {RUN.policy.pool_power:g}, load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"noise: {args.noise.name}: {doc['runs_measured']} runs of suite {doc['suite']} on "
          f"{doc['machine']['cpus']} shared CPUs, {doc['runs_date']}")
    print("night-to-night robust sigma of log values: " + ", ".join(
        f"{m} {100 * noise.night[m]:.2f}%" for m in
        ("delivered_rate", "e2e_latency_p50", "e2e_latency_p99", TAIL,
         "pub_ack_latency_p99_no_stall")))
    print(f"delivered msg/s per second: CV {100 * noise.per_second_cv:.3f}%, "
          f"lag-1 autocorrelation {noise.per_second_ar:+.2f}")
    if args.aa_only:
        aa_bars(aa_rows(noise, metrics, args.aa_series or n, rng),
                mixed_rows(noise, metrics, args.aa_series or n, rng), metrics)
        return 0
    estimator_rows(rng)
    if not args.skip_measured:
        measured_rows(noise, metrics, n, rng)
        broker_rows(noise, metrics, n, rng)
    aa = aa_rows(noise, metrics, args.aa_series or n, rng)
    mixed = mixed_rows(noise, metrics, args.aa_series or n, rng)

    projected = doc["metrics"]["e2e_latency_p99"].get("window_log_mad_sigma_median")
    if projected:
        print("\nlonger measure windows (noise_measured.json window_log_mad_sigma_median: "
              "seconds resampled, a lower bound on the noise): e2e_latency_p99 +10%")
        for window, sigma in projected.items():
            bound = recall_bound(sigma, log_step("e2e_latency_p99", 0.10), rng)[1]
            print(f"  {window:>4} s window: night σ {100 * sigma:5.1f}%, recall@2 bound "
                  f"{fmt_pct(bound)}")

    cells = sensitivity(noise, args.sweep_series, rng)
    judged = [c for c in cells if c["pass"] is not None]
    worst = min(judged, key=lambda c: c["recall2"] / c["bound"])
    print("\nbar:")
    print(f"  {'PASS' if all(c['pass'] for c in judged) else 'FAIL'}  recall@2 >= 80% of the "
          f"bound in all {len(judged)} cells where the bound reaches 50%: worst "
          f"{step_name(worst['metric'], worst['step'])} at {100 * worst['noise']:.0f}% noise, "
          f"{fmt_pct(worst['recall2']).strip()} of {fmt_pct(worst['bound']).strip()} "
          f"({100 * worst['recall2'] / worst['bound']:.0f}%)")
    short = [c for c in judged if not c["pass"]]
    if short:
        within = sum(c["known"] >= 0.8 * c["bound"] for c in short)
        print(f"        of the {len(short)} cells short of it, the rule with the level and "
              f"noise known would reach 80% in {within}: the rest is the rule's own gap "
              "(two bad nights against a likelihood ratio that knows the step)")
        pooled = sum(c["pooled"] >= 0.8 * c["bound"] for c in short)
        print(f"        with the noise estimated from all {SUITE * WARM} nights of the suite "
              f"(every stage pooled, as if their noise were known to be equal) it reaches 80% "
              f"in {pooled}")
        learned_rows(short)
    aa_bars(aa, mixed, metrics)
    return 0


def aa_bars(aa: AA, mixed: AA, metrics: list[str]) -> None:
    """The A/A bars: at most 1 false alarm per 100 series on every metric, like and mixed
    suites; no change verdict while learning."""
    worst_fa = max(max(aa.alarms.values()) / aa.series, max(mixed.alarms.values()) / mixed.series)
    learning = sum(aa.learning_flags.values())
    worst_suite = max((aa, mixed), key=lambda a: max(a.alarms.values()) / a.series)
    count = max(worst_suite.alarms.values())
    low, high = interval(count, worst_suite.series)
    print(f"  {'PASS' if worst_fa <= 0.01 else 'FAIL'}  <= 1 false alarm per 100 A/A series, "
          f"every metric, like and mixed suites: worst {100 * worst_fa:.2f} ({count} of "
          f"{worst_suite.series}, 95% interval of that one rate {100 * low:.2f} to "
          f"{100 * high:.2f}, the worst of {2 * len(metrics)}); every "
          f"metric on average {100 * sum(aa.alarms.values()) / aa.series / len(metrics):.2f} "
          f"like, {100 * sum(mixed.alarms.values()) / mixed.series / len(metrics):.2f} mixed")
    print(f"  {'PASS' if learning == 0 else 'FAIL'}  no change verdict while learning: "
          f"{learning} in {aa.series} A/A series x {len(metrics)} metrics")


if __name__ == "__main__":
    sys.exit(main())

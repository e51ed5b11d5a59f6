"""How good is the regression detector? Recall, false alarms and nights to detect, measured
on synthetic histories whose noise is this machine's own (bench/noise_measured.json).

    .state/venv/bin/python bench/bench_detector.py [--series 500] [--seed 1]

Every simulated night is one stage with all the judged metrics of a QoS 1 stage (so the
multiple-testing correction is the pipeline's), run through `tasks.analysis.detector.compare_stage`
with the store's rules replayed in memory: history newest first, flagged values held out
of the baseline until the next night clears them, the previous verdict handed back.

Noise per metric: night-to-night log noise from a Student t with 3 degrees of freedom
(the measured latency and CPU figures have sd / robust-sigma ratios of 1.2 to 2.4, a normal
has 1), scaled so its robust sigma (1.4826 x MAD) is the measured one (the sd, where the
measured MAD is 0); delivered and
published msg/s are the mean of 10 per-second samples, an AR(1) process with the measured
per-second CV and lag-1 autocorrelation around the night's level.

Scenarios: A/A (no change, 30 nights from an empty history) and steps (20 quiet nights,
then a step of known size from night 21 on, 5 nights watched). A detection is the first
`regression` verdict on the stepped metric; a false alarm is a metric entering
`regression` without a step (one alert). The same figures are printed for a plain
"percentage vs last night" detector (worse than last night by the minimum practical
effect: an alarm) as the ratio to beat. Next to perfpipe's recall, `recall_bound` prints
what no detector can beat at that noise and false-alarm budget (the Neyman-Pearson test
with the true level and noise law given): where a bar is above it, the machine's noise, not
the detector, is what fails it. Figures come from one run; nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import t as student_t

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tasks.analysis.detector import Policy, compare_stage, judged_metrics  # noqa: E402
from tasks.metrics import FLAGGED, METRICS  # noqa: E402

RATES = {"delivered_rate": "delivered_per_s", "published_rate": "published_per_s"}
SECONDS = 10
WARM, WATCH, AA_NIGHTS = 20, 5, 30
T_DOF = 3
T_MAD = float(student_t.ppf(0.75, T_DOF))  # MAD of the standard t


@dataclass(frozen=True)
class Noise:
    night: dict[str, float]  # robust sigma of the log values, night to night
    per_second_cv: float
    per_second_ar: float


def load_noise(path: Path) -> tuple[Noise, dict]:
    doc = json.loads(path.read_text())
    metrics = doc["metrics"]
    night = {}
    for m, d in metrics.items():
        robust, sd = d.get("night_log_mad_sigma_median"), d.get("night_log_sd_median")
        if robust is not None or sd is not None:  # measured, if only as 0 (a rate at its target)
            night[m] = robust or (sd or 0.0) * (1.4826 * T_MAD) / math.sqrt(T_DOF)
    rate = metrics["delivered_rate"]
    return Noise(night, rate["per_second_cv_median"] or 0.0,
                 rate["per_second_lag1_autocorr_median"] or 0.0), doc


class Stage:
    """One simulated stage history: tonight's metrics, with a step on one metric."""

    def __init__(self, noise: Noise, metrics: list[str], rng: np.random.Generator,
                 step_metric: str | None = None, step: float = 0.0, step_night: int = 0) -> None:
        self.noise, self.metrics, self.rng = noise, metrics, rng
        self.step_metric, self.step, self.step_night = step_metric, step, step_night

    def night(self, k: int) -> tuple[dict[str, float], dict[str, list[float]]]:
        values, series = {}, {}
        for m in self.metrics:
            scale = self.noise.night.get(m, 0.0) / (1.4826 * T_MAD)
            level = 1000.0 * math.exp(scale * self.rng.standard_t(T_DOF))
            if m == self.step_metric and k >= self.step_night:
                worse_up = METRICS[m].better == "lower"
                level *= (1 + self.step) if worse_up else (1 - self.step)
            if m in RATES:
                seconds = self._seconds(level)
                series[RATES[m]] = seconds
                level = float(np.mean(seconds))
            values[m] = level
        return values, series

    def _seconds(self, level: float) -> list[float]:
        phi, cv = self.noise.per_second_ar, self.noise.per_second_cv
        e = self.rng.normal(0.0, cv * math.sqrt(1 - phi * phi), SECONDS)
        x = np.empty(SECONDS)
        x[0] = self.rng.normal(0.0, cv)
        for i in range(1, SECONDS):
            x[i] = phi * x[i - 1] + e[i]
        return list(level * (1 + x))


Detector = Callable[[Stage, int], list[dict[str, str]]]


def perfpipe(stage: Stage, nights: int, policy: Policy = Policy()) -> list[dict[str, str]]:
    """Verdicts per night by the pipeline's detector and the store's rules, in memory: a
    flagged value is held out of the baseline; when a night clears a suspicion, every night
    of that suspicion (its alert's span) rejoins the baseline."""
    history: list[dict] = []
    previous: dict[str, dict] = {}
    suspicion: dict[str, list[dict]] = {}  # metric -> the open suspicion's nights
    out = []
    for k in range(nights):
        values, series = stage.night(k)
        verdicts = compare_stage("s", values, series, "valid", history, policy,
                                 previous=previous, run_id=f"n{k}")
        entry = {"run_id": f"n{k}", "metrics": values, "series": series,
                 "held_out": [v.metric for v in verdicts if v.verdict in FLAGGED and v.detail["hold"]]}
        for v in verdicts:
            if v.verdict == "suspected":
                suspicion.setdefault(v.metric, []).append(entry)
            elif v.verdict == "regression":
                suspicion.pop(v.metric, None)
            elif v.verdict in ("unchanged", "improvement"):
                for night in suspicion.pop(v.metric, []):  # cleared
                    night["held_out"] = [m for m in night["held_out"] if m != v.metric]
            if v.verdict not in ("no_baseline", "invalid"):
                previous[v.metric] = {"verdict": v.verdict, "detail": v.detail}
        history.insert(0, entry)
        del history[2 * policy.window:]
        out.append({v.metric: v.verdict for v in verdicts})
    return out


def naive(stage: Stage, nights: int) -> list[dict[str, str]]:
    """Percentage against last night: worse by the minimum practical effect is an alarm."""
    out, last = [], None
    for k in range(nights):
        values, _ = stage.night(k)
        tonight = {}
        for m, v in values.items():
            if last is None:
                tonight[m] = "no_baseline"
                continue
            change = v / last[m] - 1
            worse = -change if METRICS[m].better == "higher" else change
            tonight[m] = "regression" if worse >= Policy().effect(m) else "unchanged"
        last = values
        out.append(tonight)
    return out


def alarms(verdicts: list[dict[str, str]], metric: str, start: int = 0) -> int:
    """Times `metric` enters regression from night `start` on (one alert each)."""
    count, was = 0, False
    for tonight in verdicts[start:]:
        now = tonight.get(metric) == "regression"
        count += now and not was
        was = now
    return count


def run_step(detector: Detector, noise: Noise, metrics: list[str], metric: str, step: float,
             series: int, rng: np.random.Generator) -> dict:
    delays, early = [], 0
    for _ in range(series):
        stage = Stage(noise, metrics, rng, metric, step, WARM)
        verdicts = detector(stage, WARM + WATCH)
        early += alarms(verdicts[:WARM], metric) > 0
        hit = next((k - WARM + 1 for k in range(WARM, WARM + WATCH)
                    if verdicts[k].get(metric) == "regression"), None)
        delays.append(hit)
    found = sorted(d for d in delays if d is not None)
    return {"recall1": sum(d == 1 for d in found) / series,
            "recall2": sum(d <= 2 for d in found) / series,
            "recall5": len(found) / series,
            "median": found[len(found) // 2] if found else None,
            "p95": found[min(len(found) - 1, int(0.95 * len(found)))] if found else None,
            "early": early}


def run_aa(detector: Detector, noise: Noise, metrics: list[str], series: int,
           rng: np.random.Generator) -> tuple[dict[str, int], int]:
    per_metric = {m: 0 for m in metrics}
    stages_alarmed = 0
    for _ in range(series):
        verdicts = detector(Stage(noise, metrics, rng), AA_NIGHTS)
        counts = {m: alarms(verdicts, m) for m in metrics}
        for m, c in counts.items():
            per_metric[m] += c
        stages_alarmed += any(counts.values())
    return per_metric, stages_alarmed


def recall_bound(sigma: float, delta: float, rng: np.random.Generator,
                  draws: int = 2_000_000) -> tuple[float, float]:
    """Upper bounds on recall@1 and recall@2 at this noise, whatever the detector.

    The Neyman-Pearson test for "the level moved by `delta` on the nights judged" against
    "no change", with the true level and the noise law known (no estimation, no
    multiple-testing correction): the sum over the nights of the log-likelihood ratio of
    the scaled t noise, at a nightly false-alarm rate of 2 / (100 x `AA_NIGHTS`), as much as
    the budget of 1 false alarm per 100 series allows when alarms come in pairs. No test at
    that rate has more power, so a recall bar above this column cannot be met here.
    """
    if sigma <= 0:
        return 1.0, 1.0
    scale = sigma / (1.4826 * T_MAD)
    rate = 2 * 0.01 / AA_NIGHTS

    def llr(x: np.ndarray) -> np.ndarray:
        return (student_t.logpdf((x - delta) / scale, T_DOF)
                - student_t.logpdf(x / scale, T_DOF)).sum(axis=1)

    bounds = []
    for nights in (1, 2):
        quiet = scale * rng.standard_t(T_DOF, (draws, nights))
        threshold = np.quantile(llr(quiet), 1 - rate)
        stepped = scale * rng.standard_t(T_DOF, (draws // 4, nights)) + delta
        bounds.append(float((llr(stepped) > threshold).mean()))
    return bounds[0], bounds[1]


def log_step(metric: str, size: float) -> float:
    """The size of a step in the worse direction as a log change (how `Stage` applies it)."""
    return math.log1p(size) if METRICS[metric].better == "lower" else -math.log1p(-size)


def step_name(metric: str, size: float) -> str:
    """"delivered_rate -5%": the metric and its step, signed in the worse direction."""
    return f"{metric} {'-' if METRICS[metric].better == 'higher' else '+'}{100 * size:.0f}%"


def fmt_pct(x: float | None) -> str:
    return "   -" if x is None else f"{100 * x:5.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--noise", type=Path, default=REPO / "bench" / "noise_measured.json")
    ap.add_argument("--sweep-series", type=int, default=200)
    args = ap.parse_args()
    noise, doc = load_noise(args.noise)
    metrics = judged_metrics(Policy())
    rng = np.random.default_rng(args.seed)
    n = args.series
    print(f"detector bench: {n} series per row, {len(metrics)} judged metrics per stage "
          f"(Bonferroni m={len(metrics)}), seed {args.seed}")
    print(f"noise: {args.noise.name}: {doc['runs_measured']} runs of suite {doc['suite']} on "
          f"{doc['machine']['cpus']} shared CPUs, {doc['runs_date']}")
    print("night-to-night robust sigma of log values: " + ", ".join(
        f"{m} {100 * noise.night[m]:.2f}%" for m in
        ("delivered_rate", "e2e_latency_p50", "e2e_latency_p99", "pub_ack_latency_p99")))
    print(f"delivered msg/s per second: CV {100 * noise.per_second_cv:.3f}%, "
          f"lag-1 autocorrelation {noise.per_second_ar:+.2f}")

    steps = [("delivered_rate", 0.05), ("e2e_latency_p99", 0.10), ("e2e_latency_p50", 0.10),
             ("pub_ack_latency_p99", 0.10), ("delivered_rate", 0.15), ("e2e_latency_p99", 0.15),
             ("e2e_latency_p50", 0.15)]
    print(f"\nsteps at night {WARM + 1} after {WARM} quiet nights; recall@k: confirmed "
          f"regression within k nights; nights to detect among the detected")
    print(f"{'step (size in noise sigmas)':34} {'detector':9} {'recall@1':>8} {'recall@2':>8} "
          f"{'recall@5':>8} {'nights p50/p95':>14} {'alarms before step':>18} "
          f"{'bound @1/@2':>14}")
    results, bounds_at = {}, {}
    for metric, size in steps:
        for name, det in (("perfpipe", perfpipe), ("naive", naive)):
            r = run_step(det, noise, metrics, metric, size, n, rng)
            results[(metric, size, name)] = r
            nights = f"{r['median']}/{r['p95']}" if r["median"] else "-"
            sigmas = math.log1p(size) / max(noise.night.get(metric, 0.0), 1e-9)
            label = f"{step_name(metric, size)} ({sigmas:,.1f})" if name == "perfpipe" else ""
            bound = ""
            if name == "perfpipe":
                o1, o2 = recall_bound(noise.night.get(metric, 0.0), log_step(metric, size), rng)
                bounds_at[(metric, size)] = {"recall1": o1, "recall2": o2}
                bound = f"{fmt_pct(o1).strip()}/{fmt_pct(o2).strip()}"
            print(f"{label:34} {name:9} {fmt_pct(r['recall1']):>8} {fmt_pct(r['recall2']):>8} "
                  f"{fmt_pct(r['recall5']):>8} {nights:>14} {r['early']:>18} {bound:>14}")

    print(f"\nA/A: {n} series of {AA_NIGHTS} nights from an empty history, no change; "
          "false alarms per 100 series")
    aa = {name: run_aa(det, noise, metrics, n, rng) for name, det in
          (("perfpipe", perfpipe), ("naive", naive))}
    print(f"{'metric':28} {'perfpipe':>9} {'naive':>9}")
    for m in metrics:
        print(f"{m:28} {100 * aa['perfpipe'][0][m] / n:9.2f} {100 * aa['naive'][0][m] / n:9.2f}")
    print(f"{'any metric of the stage':28} {100 * aa['perfpipe'][1] / n:9.2f} "
          f"{100 * aa['naive'][1] / n:9.2f}   (stages with at least one alarm, per 100)")

    print("\nbar (perfpipe, at this machine's noise; a step of a fraction of a sigma is out of "
          "any detector's reach in two nights):")
    bar = [(f"recall@{k} >= 95%, {step_name(metric, size)}", metric, size, k)
           for metric, size, k in (("delivered_rate", 0.05, 2), ("e2e_latency_p99", 0.10, 2),
                                   ("delivered_rate", 0.15, 1), ("e2e_latency_p99", 0.15, 1))]
    for text, metric, size, k in bar:
        got = results[(metric, size, "perfpipe")][f"recall{k}"]
        best = bounds_at[(metric, size)][f"recall{k}"]
        print(f"  {'PASS' if got >= 0.95 else 'FAIL'}  {text:40} perfpipe {fmt_pct(got)}, "
              f"bound {fmt_pct(best)}")
    worst = max(aa["perfpipe"][0].values()) / n
    print(f"  {'PASS' if worst <= 0.01 else 'FAIL'}  {'<= 1 false alarm per 100 series, every metric':40}"
          f" worst {100 * worst:.2f}")

    projected = doc["metrics"]["e2e_latency_p99"].get("window_log_mad_sigma_median")
    if projected:
        print("\nlonger measure windows (noise_measured.json window_log_mad_sigma_median: "
              "seconds resampled, a lower bound on the noise): e2e_latency_p99 +10%")
        for window, sigma in projected.items():
            bound = recall_bound(sigma, log_step("e2e_latency_p99", 0.10), rng)[1]
            print(f"  {window:>4} s window: night σ {100 * sigma:5.1f}%, recall@2 bound "
                  f"{fmt_pct(bound)}")

    print(f"\nsensitivity (synthetic noise, not measured): e2e_latency_p99 +10% and "
          f"delivered_rate -5% steps, {args.sweep_series} series per row, the other metrics "
          "at their measured noise")
    print(f"{'night σ':>9} {'p99 +10% recall@2':>18} {'bound':>7} {'p99 FA/100':>10} "
          f"{'rate -5% recall@2':>18} {'bound':>7} {'rate FA/100':>11}")
    for sd in (0.005, 0.01, 0.015, 0.02, 0.03, 0.05):
        row = []
        for metric, size in (("e2e_latency_p99", 0.10), ("delivered_rate", 0.05)):
            swept = Noise({**noise.night, metric: sd}, noise.per_second_cv, noise.per_second_ar)
            r = run_step(perfpipe, swept, metrics, metric, size, args.sweep_series, rng)
            fa = run_aa(perfpipe, swept, metrics, args.sweep_series, rng)[0][metric]
            best = recall_bound(sd, log_step(metric, size), rng)[1]
            row += [fmt_pct(r["recall2"]), fmt_pct(best), f"{100 * fa / args.sweep_series:.1f}"]
        print(f"{100 * sd:8.1f}% {row[0]:>18} {row[1]:>7} {row[2]:>10} {row[3]:>18} {row[4]:>7} "
              f"{row[5]:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

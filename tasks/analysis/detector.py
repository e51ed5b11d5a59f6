"""Regression verdicts: pure functions, data in, verdicts out.

Like with like: the caller passes only earlier nights of the same stage key (scenario,
stage, broker) on the same fingerprint. For each judged metric (`tasks.metrics`: a
better-direction and a minimum practical effect) of a valid stage:

- **Baseline.** Rolling: the median of the newest `Policy.window` earlier nights since the
  last accepted change, without the values the store holds out (flagged nights that no
  human accepted or called a false positive and no next night cleared). Release: the
  pinned release run's value, with the noise still measured on the rolling history.
- **Noise.** Changes are log ratios. The noise sigma is 1.4826 x MAD of the baseline
  nights' logs (never below the mean-absolute-deviation estimate: see `noise_sigma`).
  Tonight's change has sd `sigma * sqrt(1 + pi / 2n)` (the median's own error) or
  `sigma * sqrt(2)` (release: one night against one), read against a Student t with the
  MAD's effective degrees of freedom, 0.37 (n - 1).
- **Bad night.** Tonight is bad at level `a` when its change in the worse direction
  (1) reaches `effect_floor` x the minimum practical effect (half of it by default, so a
  change of exactly the minimum effect is caught), (2) has a one-sided t p-value below `a`,
  and (3) where per-second samples exist (msg/s), a one-sided Mann-Whitney test of
  tonight's samples against the baseline nights' samples is below `a` too. Every night's
  `a` is alpha / m: Bonferroni over the m metrics judged in the stage.
- **Lifecycle.** A first bad night is `suspected`. The next comparable night confirms it
  (`regression`, nights of evidence counted) when it is bad too, and clears it otherwise
  (its own verdict stands). Demanding two bad nights in a row, each at alpha / m, is what
  keeps heavy-tailed noise quiet: one wild night is common, two in a row are not. A bad
  night is a `regression` at once when the step is plausibly large (the change plus its
  one-sided 95% margin reaches `large_step`) on a metric whose noise is known from
  `large_history` nights and small (`large_sigmas` sigmas fit in the large step).
  With fewer than `min_history` baseline nights the noise is unknown: only a change of
  `large_step` is flagged, as `suspected`, and it does not hold its value out.
  Improvements: one night, same tests, better direction.
- Invalid stages are never compared. A stage without history says so, and says when a
  changed fingerprint is why.
- For a flagged metric the detail names the run where the level shift began: the E-Divisive
  pass of `tasks.analysis.changepoint` over the recent history, for the report.

`bench/bench_detector.py` measures recall, false alarms and nights to detect of these rules
on histories with this machine's measured noise.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtr, stdtr, stdtrit
from scipy.stats import rankdata

from ..metrics import FLAGGED, METRICS
from .changepoint import change_points

SAMPLE_SERIES = {"delivered_rate": "delivered_per_s", "published_rate": "published_per_s"}
_Z95 = 1.6448536269514722  # one-sided 95% normal quantile
MAD_EFFICIENCY = 0.37  # Gaussian efficiency of the MAD: its sigma is worth 0.37 (n-1) d.o.f.


@dataclass(frozen=True)
class Policy:
    alpha: float = 0.05  # family-wise error of one stage's night (Bonferroni over m)
    confirm_alpha: float | None = None  # the confirming night's level (None: alpha / m)
    min_history: int = 5  # baseline nights before the noise is estimated
    window: int = 30  # newest baseline nights used
    effect_floor: float = 0.5  # never flag a change below this fraction of the min effect
    large_step: float = 0.15  # confirmed at once when plausibly at least this large ...
    large_sigmas: float = 10.0  # ... on a metric whose noise is at most 1/10 of that step
    large_history: int = 10  # ... measured over at least this many nights
    sample_nights: int = 5  # baseline nights whose per-second samples are tested against
    min_effect: dict[str, float] = field(default_factory=dict)  # overrides tasks.metrics

    def effect(self, metric: str) -> float:
        return self.min_effect.get(metric, METRICS[metric].min_effect)


@dataclass(frozen=True)
class Verdict:
    stage_id: str
    metric: str
    verdict: str
    value: float | None
    baseline_value: float | None
    change_pct: float | None
    confidence: float | None
    detail: dict

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Reference:
    """What tonight's metric is compared with, already reduced to numbers."""

    kind: str  # "rolling" | "release"
    centre: float  # log of the baseline value
    sigma: float | None  # night-to-night noise of the logs; None: unknown (short history)
    pred_sd: float | None  # sd of tonight's log change under no change
    dof: float
    nights: int
    samples: list[float]


def judged_metrics(policy: Policy) -> list[str]:
    return [m.name for m in METRICS.values() if m.better != "none" and policy.effect(m.name) > 0]


def noise_sigma(logs: list[float]) -> float:
    """1.4826 x MAD, never below 1.2533 x the mean absolute deviation from the median: on a
    short, heavy-tailed history the MAD alone comes out far too small too often (one time
    in a hundred below half the truth at 20 nights), and two nights judged with the same
    too-small noise confirm each other."""
    centre = statistics.median(logs)
    deviations = [abs(v - centre) for v in logs]
    return max(1.4826 * statistics.median(deviations), 1.2533 * statistics.fmean(deviations))


def _usable(night: dict, metric: str) -> bool:
    value = night["metrics"].get(metric)
    return value is not None and value > 0 and metric not in night.get("held_out", ())


def _samples(nights: list[dict], metric: str, limit: int) -> list[float]:
    name = SAMPLE_SERIES.get(metric)
    if not name:
        return []
    out: list[float] = []
    for night in nights[:limit]:
        out += [x for x in night.get("series", {}).get(name, []) if x is not None]
    return out


def baseline_for(metric: str, history: list[dict], release: dict | None,
                 policy: Policy) -> Reference | None:
    """None when there is nothing to compare with."""
    nights = [h for h in history if _usable(h, metric)][:policy.window]
    logs = [math.log(h["metrics"][metric]) for h in nights]
    n = len(logs)
    sigma = noise_sigma(logs) if n >= policy.min_history else None
    dof = max(1.0, MAD_EFFICIENCY * (n - 1))
    if release is not None:
        value = release["metrics"].get(metric)
        if value is None or value <= 0:
            return None
        pred = None if sigma is None else sigma * math.sqrt(2)
        return Reference("release", math.log(value), sigma, pred, dof, n,
                        _samples([release], metric, 1))
    if not n:
        return None
    pred = None if sigma is None else sigma * math.sqrt(1 + math.pi / (2 * n))
    return Reference("rolling", statistics.median(logs), sigma, pred, dof, n,
                    _samples(nights, metric, policy.sample_nights))


def _p_night(worse: float, base: Reference) -> float | None:
    """One-sided p-value of a change at least `worse` (log, worse direction) under no change."""
    if base.pred_sd is None:
        return None
    if base.pred_sd <= 0:
        return 0.0 if worse > 0 else 1.0
    return float(stdtr(base.dof, -worse / base.pred_sd))


def mann_whitney_p(x: list[float], y: list[float], *, x_lower: bool) -> float:
    """One-sided Mann-Whitney p-value that `x` sits below (x_lower) or above `y`: normal
    approximation with tie and continuity corrections (scipy's asymptotic method)."""
    n1, n2 = len(x), len(y)
    ranks = rankdata(np.concatenate([x, y]))
    u = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    _, ties = np.unique(ranks, return_counts=True)
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - float((ties ** 3 - ties).sum()) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    shift = u - n1 * n2 / 2
    z = (-shift - 0.5) / math.sqrt(var) if x_lower else (shift - 0.5) / math.sqrt(var)
    return float(ndtr(-z))


def _p_samples(tonight: list[float], base: Reference, lower_is_worse: bool) -> float | None:
    if len(tonight) < 3 or len(base.samples) < 3:
        return None
    return mann_whitney_p(tonight, base.samples, x_lower=lower_is_worse)


def _shift(metric: str, history: list[dict], value: float, run_id: str | None) -> dict | None:
    """Where the latest level shift began, over every recent value (held-out ones too)."""
    past = [h for h in reversed(history) if (h["metrics"].get(metric) or 0) > 0]
    labels = [h.get("run_id") for h in past] + [run_id or "tonight"]
    points = change_points([math.log(h["metrics"][metric]) for h in past] + [math.log(value)],
                           min_size=2)
    if not points:
        return None
    last = points[-1]
    return {"run_id": labels[last.index], "nights_ago": len(labels) - 1 - last.index,
            "shift_pct": round(100 * math.expm1(last.after - last.before), 2),
            "p_value": round(last.p_value, 4)}


@dataclass(frozen=True)
class _Evidence:
    """Tonight against the baseline in one direction (worse, or better)."""

    change: float  # log change in this direction (positive: this way)
    p_night: float | None
    p_samples: float | None

    def at(self, level: float, floor: float) -> bool:
        return (self.change >= floor and (self.p_night is None or self.p_night < level)
                and (self.p_samples is None or self.p_samples < level))


def _evidence(change: float, base: Reference, tonight: list[float], toward_lower: bool) -> _Evidence:
    return _Evidence(change, _p_night(change, base), _p_samples(tonight, base, toward_lower))


def _decide(worse: _Evidence, better: _Evidence, base: Reference, floor: float, first: float,
            previous: dict | None, policy: Policy) -> tuple[str, int]:
    """(verdict, nights of evidence) by the lifecycle in the module docstring."""
    confirm = policy.confirm_alpha or first
    if previous and previous["verdict"] in FLAGGED and base.sigma is not None \
            and previous.get("detail", {}).get("noise_pct") is not None \
            and worse.at(confirm, floor):
        return "regression", int(previous.get("detail", {}).get("nights", 1)) + 1
    step = math.log1p(policy.large_step)
    if base.sigma is None:  # noise unknown: only a large change is worth a look
        floor = max(floor, step)
    if worse.at(first, floor):
        large = (base.pred_sd is not None and base.nights >= policy.large_history
                 and policy.large_sigmas * base.pred_sd <= step
                 and worse.change + _Z95 * base.pred_sd >= step)
        return ("regression" if large else "suspected"), 1
    if better.at(first, floor):
        return "improvement", 0
    return "unchanged", 0


def compare_metric(stage_id: str, metric: str, value: float | None, history: list[dict],
                   series: dict, policy: Policy, tests: int, *, previous: dict | None = None,
                   release: dict | None = None, run_id: str | None = None) -> Verdict | None:
    """One metric's verdict. `previous`: the last comparable night's verdict of this stage
    and metric ({"verdict", "detail"}), which a bad night confirms or clears."""
    if value is None:
        return None
    base = baseline_for(metric, history, release, policy)
    kind = f"release:{release.get('label')}" if release else "rolling"
    if base is None:
        return Verdict(stage_id, metric, "no_baseline", value, None, None, None,
                       {"history": 0, "baseline": kind})
    baseline_value = math.exp(base.centre)
    if value <= 0:
        return Verdict(stage_id, metric, "no_baseline", value, baseline_value, None, None,
                       {"history": base.nights, "baseline": kind, "note": "zero: not judged"})
    lower_is_worse = METRICS[metric].better == "higher"
    change = math.log(value) - base.centre
    tonight = [x for x in series.get(SAMPLE_SERIES.get(metric, ""), []) if x is not None]
    worse = _evidence(-change if lower_is_worse else change, base, tonight, lower_is_worse)
    better = _evidence(-worse.change, base, tonight, not lower_is_worse)
    floor = math.log1p(policy.effect_floor * policy.effect(metric))
    first = policy.alpha / max(tests, 1)
    verdict, nights = _decide(worse, better, base, floor, first, previous, policy)
    shown = better if verdict == "improvement" else worse
    detail: dict[str, Any] = {
        "baseline": kind, "history": base.nights, "nights": nights, "tests": tests,
        "noise_pct": None if base.sigma is None else round(100 * base.sigma, 3),
        "floor_pct": round(100 * math.expm1(floor), 2),
        "p_night": shown.p_night, "p_samples": shown.p_samples,
        "level": (policy.confirm_alpha or first) if nights > 1 else first,
    }
    if base.pred_sd is not None:
        band = max(floor, float(stdtrit(base.dof, 1 - first)) * base.pred_sd)
        detail["band_pct"] = round(100 * math.expm1(band), 2)
    if base.sigma is None:
        detail["note"] = (f"history shorter than {policy.min_history} nights: noise unknown, "
                          f"only a change of {100 * policy.large_step:.0f}% or more is flagged")
    # A flagged value stays out of later baselines, unless it was flagged with no noise
    # estimate (not evidence enough: holding it out would starve a young history).
    detail["hold"] = verdict in FLAGGED and base.sigma is not None
    if release is not None:
        detail["baseline_run"] = release.get("run_id")
        if release.get("fingerprint_matches") is False:
            detail["fingerprint"] = "differs from the release baseline's"
    if verdict in FLAGGED:
        detail["change_point"] = _shift(metric, history, value, run_id)
    return Verdict(stage_id, metric, verdict, value, baseline_value,
                   round(100 * (value / baseline_value - 1), 3),
                   None if shown.p_night is None else round(1 - shown.p_night, 4), detail)


def compare_stage(stage_id: str, metrics: dict, series: dict, validity: str,
                  history: list[dict], policy: Policy = Policy(), *,
                  previous: dict[str, dict] | None = None, release: dict | None = None,
                  run_id: str | None = None, new_history: str | None = None) -> list[Verdict]:
    """Verdicts for one stage.

    history: earlier comparable nights, newest first, each {"run_id", "metrics", "series",
    "held_out"}; previous: metric -> the last comparable night's verdict dict; release: the
    pinned release run's stage ({"label", "run_id", "metrics", "series"}) for a release
    run; new_history: why the history is empty (e.g. a changed fingerprint), said in the
    no-baseline verdicts.
    """
    names = [m for m in judged_metrics(policy) if metrics.get(m) is not None]
    if validity != "valid":
        return [Verdict(stage_id, m, "invalid", metrics[m], None, None, None, {}) for m in names]
    out = []
    for m in names:
        v = compare_metric(stage_id, m, metrics[m], history, series, policy, len(names),
                           previous=(previous or {}).get(m), release=release, run_id=run_id)
        if v is not None and v.verdict == "no_baseline" and new_history:
            v.detail["new_history"] = new_history
        if v is not None:
            out.append(v)
    return out

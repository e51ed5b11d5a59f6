"""What no detector can beat at a noise and false-alarm budget, and what the pipeline's own
rule would reach were the noise known: the columns `bench_detector.py` sets perfpipe's
recall against.

- `recall_bound`: the Neyman-Pearson test with the true level and noise law given, its
  threshold set on simulated A/A series so that it raises as many alarms per series as
  perfpipe may (`budget_rate`); `bound_mde`, the step it catches with 90% probability.
- `known_noise_recall`: perfpipe's two-bad-nights rule with the level and noise known.
- `learned_bounds`: the best test that must learn the noise's scale (`scale_bound.py`).
- `check_passes`: how often the A/A bar passes a detector at a given spend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy.stats import binom
from scipy.stats import t as student_t

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: see learning_aa.py

from tasks.analysis.policy import Policy  # noqa: E402
from tasks.analysis.thresholds import MDE_POWER, bad_threshold, t_robust_sigma  # noqa: E402

import scale_bound  # noqa: E402  (bench/, the script's own folder)
from simulated_nights import AA_NIGHTS, SUITE, T_DOF, T_ROBUST, WARM  # noqa: E402


def _llr(x: np.ndarray, delta: float, scale: float) -> np.ndarray:
    """Each night's log-likelihood ratio, step `delta` against none, on the scaled t noise."""
    return student_t.logpdf((x - delta) / scale, T_DOF) - student_t.logpdf(x / scale, T_DOF)


def budget_rate(sigma: float, delta: float, rng: np.random.Generator, series: int = 100_000,
                budget: float = 0.01) -> float:
    """The false-alarm rate per test of the two-night Neyman-Pearson test when its alarms
    are `budget` per A/A series of `AA_NIGHTS` nights, as perfpipe's are counted (a night
    entering the alarm) and on the nights perfpipe judges (after its `min_history`
    learning nights). Measured: the threshold is set on `series` simulated A/A series,
    and the rate read there. The test's statistic is bounded on t noise, so one wild
    night does not fire it twice: it fires about 1.02 times per alarm (4.8e-4 per test
    over 22 nights)."""
    scale = sigma / T_ROBUST
    judged = AA_NIGHTS - Policy().min_history
    each = _llr(scale * rng.standard_t(T_DOF, (series, judged)), delta, scale)
    fires_at = each[:, 1:] + each[:, :-1]
    low, high = float(np.quantile(fires_at, 0.99)), float(fires_at.max())
    for _ in range(40):
        mid = (low + high) / 2
        entered = scale_bound.alarm_entries(fires_at >= mid).mean()
        low, high = (mid, high) if entered > budget else (low, mid)
    return float((fires_at >= high).mean())


_RATES: dict[tuple[float, float], float] = {}  # budget_rate by (step in sigmas, budget)
CHECKED_BUDGET = 0.005  # alarms per A/A series the A/A bar passes 97 times in 100


def recall_bound(sigma: float, delta: float, rng: np.random.Generator,
                 draws: int = 2_000_000, budget: float = 0.01) -> tuple[float, float]:
    """Upper bounds on recall@1 and recall@2 at this noise, whatever the detector.

    The Neyman-Pearson test for "the level moved by `delta` on the nights judged" against
    "no change", with the true level and the noise law known (no estimation, no
    multiple-testing correction): the sum over the nights of the log-likelihood ratio of
    the scaled t noise, at the nightly false-alarm rate that spends the same budget as
    perfpipe's detector, 1 alarm per 100 A/A series on the nights it judges
    (`budget_rate`). No test with that
    budget has more power, so a recall bar above this column cannot be met here.
    `budget`: another number of alarms per A/A series (`CHECKED_BUDGET`: the spend the
    A/A bar lets a detector have, `check_passes`).
    """
    if sigma <= 0:
        return 1.0, 1.0
    if delta == 0:
        return 0.0, 0.0  # no step to find
    scale = sigma / T_ROBUST
    key = (round(delta / sigma, 1), budget)  # the rate depends on the step in sigmas only
    if key not in _RATES:
        _RATES[key] = budget_rate(sigma, delta, rng, budget=budget)
    rate = _RATES[key]
    bounds = []
    for nights in (1, 2):
        quiet = _llr(scale * rng.standard_t(T_DOF, (draws, nights)), delta, scale).sum(axis=1)
        threshold = np.quantile(quiet, 1 - rate)
        stepped = _llr(scale * rng.standard_t(T_DOF, (draws // 4, nights)) + delta, delta, scale)
        bounds.append(float((stepped.sum(axis=1) > threshold).mean()))
    return bounds[0], bounds[1]


def known_noise_recall(metric: str, sigma: float, delta: float, policy: Policy) -> float:
    """Recall within two nights of perfpipe's two-bad-nights rule at a stage's own level
    for `metric` (`Policy.level`), were the level and the noise law known (nothing
    estimated from the history): what the rule loses to the bound, apart from what
    estimating costs."""
    if sigma <= 0:
        return 1.0
    threshold = bad_threshold(policy.level(metric), 1e6, policy.tail_dof)
    bad = float(student_t.sf((threshold - delta / sigma) * t_robust_sigma(policy.tail_dof),
                             policy.tail_dof))
    return bad * bad


def learned_bounds(cells: list[tuple[float, float]], rng: np.random.Generator,
                   series: int = 100_000, budget: float = 0.01, with_rule: bool = True
                   ) -> list[tuple[float, float, float | None]]:
    """Per (noise sigma, log step): recall within two nights of the best test that must
    learn the noise's scale (`scale_bound`), from the stage's own `WARM` nights and from
    all the suite's `SUITE` x `WARM` nights (as if known to share the noise), at the same
    budget as the bound (or `budget` alarms per A/A series) and with the level and noise
    law given; and of the candidate rule that is given nothing (`scale_bound.rule_recall`,
    own nights; None without `with_rule`, which saves its simulation and draws last, so the
    other two come out the same). With 1 alarm per 100 series, 100,000 A/A series set each
    threshold on about 1,000 alarms: at 40,000 two runs of one cell came out 2 points apart."""
    keys = [delta / (sigma / T_ROBUST) for sigma, delta in cells]
    steps = sorted(set(keys))
    common = {"history": WARM, "nights": AA_NIGHTS, "first": Policy().min_history,
              "tail": float(T_DOF), "rng": rng, "series": series, "budget": budget}
    own = scale_bound.recall(steps, stages=1, **common)
    suite_wide = scale_bound.recall(steps, stages=SUITE, **common)
    rule = scale_bound.rule_recall(steps, **common) if with_rule else {}
    return [(own[k], suite_wide[k], rule.get(k)) for k in keys]


def check_passes(rate: float, series: int, rates: int) -> float:
    """How often the A/A bar passes a detector whose false-alarm rate is `rate` on every
    metric: the worst of `rates` rates, each measured on `series` series, at most 1 per
    100. A detector that spends the bound's whole budget fails it almost surely, so one
    that passes spends about half: part of the gap to the bound is that."""
    return float(binom.cdf(series // 100, series, rate) ** rates)


def bound_mde(sigma: float, rng: np.random.Generator, power: float = MDE_POWER) -> float:
    """The smallest log step the Neyman-Pearson test catches within two nights with
    `power` probability at this noise: bisection on `recall_bound`."""
    if sigma <= 0:
        return 0.0
    low, high = 0.0, 20 * sigma
    for _ in range(14):
        mid = (low + high) / 2
        if recall_bound(sigma, mid, rng, draws=400_000)[1] >= power:
            high = mid
        else:
            low = mid
    return high


def fisher_dof_per_night(tail: float) -> float:
    """The most a night can add, asymptotically, to an unbiased noise estimate on t noise
    with `tail` d.o.f., in the chi-square d.o.f. the detector counts: the Fisher
    information for a scale is 2 tail / (tail + 3) per night (2 on normal noise, where a
    night is 1 d.o.f.), so 1/2 on t3; an efficient estimator's log has variance
    1 / (n x that) = 1 / (2 d.o.f.)."""
    return tail / (tail + 3)

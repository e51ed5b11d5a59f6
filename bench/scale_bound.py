"""The recall bound when the noise must be learned from the nights at hand.

`detector_bounds.recall_bound` is the Neyman-Pearson test that is given the noise's scale.
A detector is not: it learns the scale from the history. This module measures what that
learning costs the test best placed to pay it: the most powerful *scale-invariant* test
(its decision the same when every night's change is multiplied by one factor), given
everything else (the noise law, the step, the baseline's level exactly).

- **The statistic.** By Wijsman's representation, the likelihood ratio of the maximal
  invariant is the ratio of the two likelihoods, each integrated over the scale factor c
  with weight c^(N-1) dc (N values in all), evaluated on a grid of log c. The history's
  nights enter both likelihoods alike; the judged pair enters the alternative shifted by
  the step.
- **The budget.** As for the known-noise bound: one threshold for every judged pair, set
  on simulated A/A series of `nights` nights from empty so that the test enters an alarm
  on `budget` of them, judged from `first` nights of history on (a learned scale errs
  alike on neighbouring nights, so its alarms come in runs, and a run counts once).
  Recall is counted as the known-noise bound counts it: on the two stepped nights.
- **What it bounds, and what not.** The scale factors form an amenable group, so by the
  Hunt-Stein theorem a test that holds its false-alarm rate at every noise scale cannot
  beat an invariant one at every scale for the same step in noise sigmas: it can beat it
  at one noise level only by losing at another. This is the best invariant test with one
  threshold for every night, not a theorem about every detector: the learned statistic's
  law changes with the history's length, and a rule could spend its budget unevenly over
  the nights. Read a cell where even this falls short of the bar as one where the bar
  asks for more than those nights tell the test best at using them; the level known
  makes it generous to the bound (a detector must estimate it too).
- **Which nights.** `stages` histories share the noise, the first one judged: 1 is a
  stage on its own nights; the suite's size is every stage's nights pooled as if known
  to share the noise, which a real suite cannot know (the mixed suite), so that column
  is generous as well. It is the ceiling of a detector that pools, as perfpipe does.

`rule_recall` is the same idea made into a rule a detector could run: the level
estimated by the history's median, the scale's grid centred on the history's own spread,
the step a mixture, the stage's own nights only. Exactly location- and scale-invariant,
so one threshold holds its budget at every noise. A candidate measured here, not what the
pipeline runs (`tasks.analysis.detector`): built into the pipeline at the false-alarm
spend the bench's A/A check allows (about 0.6 per 100, where this threshold spends 1), it
came out about 2 points above the pipeline's rule and over the mixed suite's bar
(`git show b436376`, reverted; bench/README.md).

The noise is Student t with `tail` d.o.f.; `steps` are in the t's scale units
(log step / (robust sigma / the t's robust sigma)), the unit `recall_bound` keys by.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import logsumexp

from tasks.analysis.thresholds import t_robust_sigma

LOG_C = np.linspace(-3.0, 3.0, 241)  # the scale factor's log, about the true scale
CHUNK = 2000  # series per array pass (up to ~2 GB of temporaries for a suite of 4)


def _logpdf(z: np.ndarray, tail: float) -> np.ndarray:
    """The Student t log density, up to its constant (the same count of values on both
    sides of the ratio, so it cancels)."""
    return -(tail + 1) / 2 * np.log1p(z * z / tail)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp)) over the last axis (the grid, or the steps)."""
    return logsumexp(x, axis=-1)


def _statistics(z: np.ndarray, steps: list[float], first: int, tail: float) -> np.ndarray:
    """The invariant log-likelihood ratio of every judged night pair, per step:
    z (series, stages, nights) in the t's scale units, the first stage judged; the pair
    ending on night t has every stage's nights before t - 1 as history. Returns
    (steps, series, pairs) for the pairs ending on nights first + 1 .. nights - 1."""
    assert first >= 1, "a judged pair needs a history"
    series, stages, nights = z.shape
    scaled = z[..., None] * np.exp(LOG_C)  # (series, stages, nights, grid)
    history = np.cumsum(_logpdf(scaled, tail).sum(axis=1), axis=1)  # through night t
    own = scaled[:, 0]
    null = _logpdf(own, tail)
    ends = np.arange(first + 1, nights)
    before = history[:, ends - 2]  # nights before the pair
    count = stages * (ends - 1) + 2  # N, values in the likelihood
    weight = count[:, None] * LOG_C  # c^(N-1) dc = c^N d(log c)
    h0 = _logsumexp(before + null[:, ends - 1] + null[:, ends] + weight)
    out = np.empty((len(steps), series, len(ends)))
    for i, k in enumerate(steps):
        alt = _logpdf(own - k, tail)
        out[i] = _logsumexp(before + alt[:, ends - 1] + alt[:, ends] + weight) - h0
    return out


def alarm_entries(fired: np.ndarray) -> np.ndarray:
    """Alarms entered per series (a pair that fires after one that did not)."""
    return fired[..., 0] + (fired[..., 1:] & ~fired[..., :-1]).sum(axis=-1)


def entries_at(quiet: np.ndarray, threshold: float) -> float:
    """Alarms entered per A/A series (rows of pairs) at `threshold`."""
    return float(alarm_entries(quiet >= threshold).mean())


def threshold_for(entries: Callable[[float], float], low: float, high: float,
                  budget: float) -> float:
    """The least threshold in [low, high] (bisection, 40 rounds) at which `entries`, the
    alarms entered per A/A series as a falling function of the threshold, are at most
    `budget`."""
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if entries(mid) > budget else (low, mid)
    return high


def _threshold(quiet: np.ndarray, budget: float) -> float:
    """The statistic's threshold at which A/A series (rows of pairs) enter an alarm
    `budget` of the time."""
    low, high = float(np.quantile(quiet.max(axis=1), 1 - 2 * budget)), float(quiet.max())
    return threshold_for(lambda t: entries_at(quiet, t), low, high, budget)


def recall(steps: list[float], *, stages: int, history: int, nights: int, first: int,
           tail: float, rng: np.random.Generator, series: int = 40_000,
           budget: float = 0.01) -> dict[float, float]:
    """step -> recall on two stepped nights after `history` quiet ones of the best
    scale-invariant test, at the threshold where A/A series of `nights` nights enter an
    alarm `budget` of the time (judged from `first` nights on)."""
    steps = list(steps)
    if not steps:
        return {}
    aa = []
    for start in range(0, series, CHUNK):
        z = rng.standard_t(tail, (min(CHUNK, series - start), stages, nights))
        aa.append(_statistics(z, steps, first, tail))
    quiet = np.concatenate(aa, axis=1)  # (steps, series, pairs)
    found = {k: _threshold(quiet[i], budget) for i, k in enumerate(steps)}
    hits = dict.fromkeys(steps, 0)
    for start in range(0, series, CHUNK):
        z = rng.standard_t(tail, (min(CHUNK, series - start), stages, history + 2))
        for k in steps:
            shifted = z.copy()
            shifted[:, 0, history:] += k
            stat = _statistics(shifted, [k], history, tail)[0, :, -1]
            hits[k] += int((stat >= found[k]).sum())
    return {k: hits[k] / series for k in steps}


# The candidate rule: the same statistic with nothing given.
RULE_STEPS = np.geomspace(1.5, 30.0, 9)  # its alternative: a step of any of these, in noise scales
RULE_LOG_C = np.linspace(-3.0, 3.0 + np.log(30.0), 377)  # about the history's own scale


def _rule_pair(history: np.ndarray, pair: np.ndarray, tail: float) -> np.ndarray:
    """The candidate rule's evidence for one judged pair per series: history (series, n)
    and the pair (series, 2), both centred on the history's median; the log of the
    likelihood ratio with the step a mixture over `RULE_STEPS` (the worse direction), both
    likelihoods integrated over the scale. Values are put in units of the history's own
    spread first (its robust sigma over the t law's), so the grid needs no knowledge of the
    scale and the statistic is exactly invariant; the grid reaches far enough up for the
    largest step to fit tonight's values."""
    spread = 1.4826 * np.median(np.abs(history), axis=1, keepdims=True) / t_robust_sigma(tail)
    spread = np.where(spread > 0, spread, 1.0)
    scale = np.exp(RULE_LOG_C)
    weight = (history.shape[1] + 2) * RULE_LOG_C
    base = _logpdf((history / spread)[..., None] * scale, tail).sum(axis=1) + weight
    tonight = (pair / spread)[..., None] * scale  # (series, 2, grid)
    h0 = _logsumexp(base + _logpdf(tonight, tail).sum(axis=1))
    alts = np.stack([_logsumexp(base + _logpdf(tonight - k, tail).sum(axis=1))
                     for k in RULE_STEPS])
    return _logsumexp(alts.T) - np.log(len(RULE_STEPS)) - h0


def _rule_series(z: np.ndarray, first: int, tail: float) -> np.ndarray:
    """The rule's evidence on every judged pair of each series z (series, nights): the
    pair ending on night t against the nights before t - 1, all centred on their median."""
    out = []
    for end in range(first + 1, z.shape[1]):
        history = z[:, :end - 1]
        centre = np.median(history, axis=1, keepdims=True)
        out.append(_rule_pair(history - centre, z[:, end - 1:end + 1] - centre, tail))
    return np.stack(out, axis=1)


def rule_recall(steps: list[float], *, history: int, nights: int, first: int, tail: float,
                rng: np.random.Generator, series: int = 40_000,
                budget: float = 0.01) -> dict[float, float]:
    """step -> recall within two nights of the candidate rule (`_rule_pair`, the stage's
    own nights only, so a noisier stage borrows nothing), counted as the bench counts
    perfpipe's: an alarm on the pair ending on the first stepped night (its history one
    night shorter) or on the second. One threshold, set as the bound's."""
    steps = list(steps)
    if not steps:
        return {}
    quiet = np.concatenate([_rule_series(rng.standard_t(tail, (min(CHUNK, series - s), nights)),
                                         first, tail) for s in range(0, series, CHUNK)])
    threshold = _threshold(quiet, budget)
    hits = dict.fromkeys(steps, 0)
    for start in range(0, series, CHUNK):
        z = rng.standard_t(tail, (min(CHUNK, series - start), history + 2))
        for k in steps:
            shifted = z.copy()
            shifted[:, history:] += k
            found = _rule_series(shifted, history - 1, tail) >= threshold
            hits[k] += int(found.any(axis=1).sum())
    return {k: hits[k] / series for k in steps}

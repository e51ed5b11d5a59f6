"""The recall bound when the noise must be learned from the nights at hand.

`bench_detector.recall_bound` is the Neyman-Pearson test that is given the noise's scale.
A detector is not: it learns the scale from the history. This module gives the most a
test can catch when it, too, must learn it, and is given everything else (the noise law,
the step, the baseline's level exactly): the most powerful *scale-invariant* test, one
whose decision stays the same when every night's change is multiplied by one factor.

- **The statistic.** By Wijsman's representation, the likelihood ratio of the maximal
  invariant is the ratio of the two likelihoods, each integrated over the scale factor c
  with weight c^(N-1) dc (N values in all), which is evaluated on a grid of log c. The
  history's nights enter both likelihoods alike; tonight's two nights enter the
  alternative shifted by the step.
- **Why it bounds.** The scale factors form an amenable group, so by the Hunt-Stein
  theorem no test that keeps its false-alarm rate at every noise scale has a higher
  recall at every scale for the same step in noise sigmas. A detector that beats this
  bound in a cell does so only by doing worse at another noise level for the same step
  in sigmas, or by breaking its false-alarm budget at some noise level.
- **The budget.** As for the known-noise bound: one threshold, set on simulated A/A
  series of `nights` nights from empty so that the test enters an alarm on `budget` of
  them, judged from `first` nights of history on (a learned scale errs alike on
  neighbouring nights, so its alarms come in runs, and runs count once).
- **Which nights.** `stages` histories share the noise, the first one judged: 1 is a
  stage on its own nights; the suite's size is every stage's nights pooled as if known
  to share the noise, which a real suite cannot know (the mixed suite), so that column
  is generous.

`rule_recall` is the same idea made a rule a detector could run, given nothing: the
level estimated by the history's median, the step a mixture, the stage's own nights only.
It is a candidate measured here, not what the pipeline runs (`tasks.analysis.detector`).

The noise is Student t with `tail` d.o.f.; `steps` are in the t's scale units
(log step / (robust sigma / the t's robust sigma)), the unit `recall_bound` keys by.
"""

from __future__ import annotations

import numpy as np

LOG_C = np.linspace(-3.0, 3.0, 241)  # the scale factor's log, about the true scale
CHUNK = 2000  # series per array pass (about 0.5 GB at 30 nights)


def _logpdf(z: np.ndarray, tail: float) -> np.ndarray:
    """The Student t log density, up to its constant (the same count of values on both
    sides of the ratio, so it cancels)."""
    return -(tail + 1) / 2 * np.log1p(z * z / tail)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))[..., 0]


def _statistics(z: np.ndarray, steps: list[float], first: int, tail: float) -> np.ndarray:
    """The invariant log-likelihood ratio of every judged night pair, per step:
    z (series, stages, nights) in the t's scale units, the first stage judged; the pair
    ending on night t has every stage's nights before t - 1 as history. Returns
    (steps, series, pairs) for the pairs ending on nights first + 1 .. nights - 1."""
    series, stages, nights = z.shape
    scaled = z[..., None] * np.exp(LOG_C)  # (series, stages, nights, grid)
    history = np.cumsum(_logpdf(scaled, tail).sum(axis=1), axis=1)  # through night t
    own = scaled[:, 0]
    null = _logpdf(own, tail)
    ends = np.arange(first + 1, nights)
    before = history[:, ends - 2]  # nights before the pair (first >= 1)
    count = stages * (ends - 1) + 2  # N, values in the likelihood
    weight = count[:, None] * LOG_C  # c^(N-1) dc = c^N d(log c)
    h0 = _logsumexp(before + null[:, ends - 1] + null[:, ends] + weight)
    out = np.empty((len(steps), series, len(ends)))
    for i, k in enumerate(steps):
        alt = _logpdf(own - k, tail)
        out[i] = _logsumexp(before + alt[:, ends - 1] + alt[:, ends] + weight) - h0
    return out


def _alarms(fired: np.ndarray) -> np.ndarray:
    """Alarms entered per series (a pair that fires after one that did not)."""
    return fired[..., 0] + (fired[..., 1:] & ~fired[..., :-1]).sum(axis=-1)


def _threshold(quiet: np.ndarray, budget: float) -> float:
    """The statistic's threshold at which A/A series (rows of pairs) enter an alarm
    `budget` of the time (bisection)."""
    low, high = float(np.quantile(quiet.max(axis=1), 1 - 2 * budget)), float(quiet.max())
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if _alarms(quiet >= mid).mean() > budget else (low, mid)
    return high


def recall(steps: list[float], *, stages: int, history: int, nights: int, first: int,
           tail: float, rng: np.random.Generator, series: int = 40_000,
           budget: float = 0.01) -> dict[float, float]:
    """step -> recall within two nights of the best scale-invariant test: two stepped
    nights after `history` quiet ones, at the threshold where A/A series of `nights`
    nights enter an alarm `budget` of the time (judged from `first` nights on)."""
    steps = list(steps)
    aa = []
    for start in range(0, series, CHUNK):
        z = rng.standard_t(tail, (min(CHUNK, series - start), stages, nights))
        aa.append(_statistics(z, steps, first, tail))
    quiet = np.concatenate(aa, axis=1)  # (steps, series, pairs)
    found = {k: _threshold(quiet[i], budget) for i, k in enumerate(steps)}
    hits = {k: 0 for k in steps}
    for start in range(0, series, CHUNK):
        z = rng.standard_t(tail, (min(CHUNK, series - start), stages, history + 2))
        for i, k in enumerate(steps):
            shifted = z.copy()
            shifted[:, 0, history:] += k
            stat = _statistics(shifted, [k], history, tail)[0, :, -1]
            hits[k] += int((stat >= found[k]).sum())
    return {k: hits[k] / series for k in steps}


# The candidate rule: what a detector could do with the same idea and nothing given.
RULE_STEPS = np.geomspace(1.5, 30.0, 9)  # its alternative: a step of any of these, in noise scales


def _rule_pair(history: np.ndarray, pair: np.ndarray, tail: float) -> np.ndarray:
    """The candidate rule's evidence for one judged pair per series: history (series, n)
    and the pair (series, 2), both centred on the history's median; the log of the
    likelihood ratio with the step a mixture over `RULE_STEPS` (the worse direction), both
    likelihoods integrated over the scale as above."""
    scale = np.exp(LOG_C)
    weight = (history.shape[1] + 2) * LOG_C
    base = _logpdf(history[..., None] * scale, tail).sum(axis=1) + weight  # (series, grid)
    tonight = pair[..., None] * scale  # (series, 2, grid)
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
    """step -> recall within two nights of a candidate rule that is given nothing: the
    invariant likelihood ratio over the stage's own nights only (no peers, so a noisier
    stage borrows nothing), the level estimated by the history's median, the step a mixture
    (`RULE_STEPS`). Location- and scale-invariant, so its A/A law is the same at every
    noise: one threshold, set as the bound's, holds its budget everywhere."""
    quiet = np.concatenate([_rule_series(rng.standard_t(tail, (min(CHUNK, series - s), nights)),
                                         first, tail) for s in range(0, series, CHUNK)])
    threshold = _threshold(quiet, budget)
    hits = dict.fromkeys(steps, 0)
    for start in range(0, series, CHUNK):
        z = rng.standard_t(tail, (min(CHUNK, series - start), history + 2))
        for k in steps:
            shifted = z.copy()
            shifted[:, history:] += k
            hits[k] += int((_rule_series(shifted, history, tail)[:, -1] >= threshold).sum())
    return {k: hits[k] / series for k in steps}

"""The evidence that tonight's nights moved: an invariant likelihood ratio, pure numpy.

A history's noise is never known, only learned from its nights, and a threshold that
allows for the learning (`Policy.false_alarm_level`'s old rule: two bad nights against a
sigma's error) spends much of the budget on that allowance. This statistic needs none: it
is the likelihood ratio of the judged nights having stepped against not, both likelihoods
integrated over the noise's scale (Wijsman's representation of the scale-invariant test,
weight c^N d log c for N values), so its law under no change is the same at every noise
and one threshold holds the false-alarm budget at every noise.

- **Values** are the logs of a metric's nights, signed so that up is worse (the caller
  negates a higher-is-better metric, and negates again to look for an improvement).
- **Level and scale**: the history's median, and its robust sigma over the t law's; then
  the statistic depends on the values only through their ratios to that spread (exactly
  location- and scale-invariant: moving every night alike, or stretching it and any
  shared nights alike, changes nothing).
- **Noise law**: Student t with `TAIL` d.o.f. (the machine's nights are heavy-tailed:
  `bench/measure_noise.py`).
- **The step** is not known: a mixture over `STEPS` noise scales (weights beside them).

Other histories that share the noise (peers the caller found in line) may lend their
nights to the scale, not to the level (`shared`).

`bench/rule_table.py` sets the thresholds (`PAIR`, `SINGLE`) on simulated A/A
histories of a stage's own nights and measures the power table (`MDE_STEPS`) this module
holds; the thresholds are constants, not fitted to any machine, because the statistic's
law does not depend on the noise.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import stdtrit

TAIL = 3.0  # the nights' noise law: Student t with this many d.o.f.
# The alternative: a step of any of these sizes, in noise scales. Nine tenths of the weight
# on 1.5 to 30 (what a regression detector is for), a tenth spread up to 10^4 so that a
# larger step still tells more (with the steps to 30 alone, two nights at 200 noise scales
# told less than two at 40); beyond `BEYOND` the evidence is decided outright.
STEPS = np.geomspace(1.5, 1e4, 25)
_MAIN = STEPS <= 30.0
_LOG_WEIGHTS = np.log(np.where(_MAIN, 0.9 / _MAIN.sum(), 0.1 / (~_MAIN).sum()))
BEYOND = STEPS[-1] / 10  # judged values this many scales up are a step beyond doubt
LOG_C = np.arange(-3.0, 3.0 + np.log(30.0), 0.05)  # the scale's grid, about the history's own

# Thresholds of the log likelihood ratio, set by `bench/rule_table.py --series 50000
# --mde-series 4000` (seed 1, 560 s; its docstring says how): a judged pair (last night and
# tonight) enters an alarm on 0.6 of 100 A/A histories of 30 nights judged from 8 on; one
# night alone is beyond `SINGLE` on 1 judged night in 100.
PAIR = 5.508
SINGLE = 2.537
# The smallest step (in noise scales) the pair catches within two nights 9 times in 10, by
# the number of baseline nights (8 to 30): `bench/rule_table.py`.
MDE_NIGHTS = tuple(range(8, 31))
MDE_STEPS = (9.30, 9.02, 8.71, 8.48, 8.19, 8.14, 8.05, 7.85, 7.77, 7.68, 7.60, 7.64, 7.44, 7.57,
             7.41, 7.46, 7.32, 7.26, 7.20, 7.19, 7.12, 7.19, 7.14)


@lru_cache(maxsize=16)
def t_robust_sigma(tail: float) -> float:
    """The robust sigma (1.4826 x MAD) of a Student t with `tail` d.o.f., in its own scale."""
    return 1.4826 * float(stdtrit(tail, 0.75))


def t_logpdf(z: np.ndarray, tail: float) -> np.ndarray:
    """The Student t log density up to its constant (it cancels: both sides have as many
    values)."""
    return -(tail + 1) / 2 * np.log1p(z * z / tail)


def _lse(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis (scipy's is ten times slower on small arrays)."""
    top = x.max(axis=-1)
    return top + np.log(np.exp(x - top[..., None]).sum(axis=-1))


def spread(history: np.ndarray, tail: float = TAIL) -> np.ndarray:
    """The history's scale in the t law's units: its robust sigma about its median over the
    t's (..., 1)."""
    return _spread(history - np.median(history, axis=-1, keepdims=True), tail)


def _spread(deviations: np.ndarray, tail: float) -> np.ndarray:
    mad = np.median(np.abs(deviations), axis=-1, keepdims=True)
    return 1.4826 * mad / t_robust_sigma(tail)


def evidence(history: np.ndarray, judged: np.ndarray, tail: float = TAIL, *,
             shared: np.ndarray | None = None) -> np.ndarray:
    """The log likelihood ratio that the `judged` values (..., m) stepped up against the
    `history` (..., n): the step a mixture over `STEPS`, both likelihoods integrated over
    the scale on `LOG_C`. `shared` (..., s): other histories' nights, each already
    centred on its own median, that share the noise's scale but not the level (peers
    pooled).

    Two ends the integral cannot judge are decided outright:
    - a history with no spread of its own (most nights equal: its MAD is 0) tells nothing
      of the scale: +inf when every judged value is above its level, else -inf, and the
      caller's effect floor decides (as a noise estimate of 0 always did);
    - judged values all at least `BEYOND` scales above the level are +inf: past the
      mixture's steps both likelihoods are equally bad and the ratio would fall back
      towards 0 (a night at 10^5 scales would tell less than one at 10)."""
    history, judged = np.asarray(history, float), np.asarray(judged, float)
    centre = np.median(history, axis=-1, keepdims=True)
    deviations, tonight = history - centre, judged - centre
    own = _spread(deviations, tail)
    if shared is not None and np.shape(shared)[-1]:
        shared = np.broadcast_to(np.asarray(shared, float),
                                 deviations.shape[:-1] + np.shape(shared)[-1:])
        deviations = np.concatenate([deviations, shared], axis=-1)
    flat = own <= 0
    pooled = _spread(deviations, tail)
    unit = np.where(flat, 1.0, np.where(pooled > 0, pooled, own))
    grid = np.exp(LOG_C)
    weight = (deviations.shape[-1] + judged.shape[-1]) * LOG_C
    base = t_logpdf((deviations / unit)[..., None] * grid, tail).sum(axis=-2) + weight
    scaled = (tonight / unit)[..., None] * grid  # (..., m, grid)
    null = _lse(base + t_logpdf(scaled, tail).sum(axis=-2))
    shifted = scaled[..., None, :, :] - STEPS[:, None, None]  # (..., steps, m, grid)
    alts = _lse(base[..., None, :] + t_logpdf(shifted, tail).sum(axis=-2))
    stat = _lse(alts + _LOG_WEIGHTS) - null
    beyond = np.all(tonight / unit >= BEYOND, axis=-1)
    stat = np.where(beyond, np.inf, stat)
    above = np.all(tonight > 0, axis=-1)
    return np.where(flat[..., 0], np.where(above, np.inf, -np.inf), stat)


def mde_steps(nights: int) -> float:
    """The step (in noise scales) the pair catches within two nights 9 times in 10 with
    `nights` baseline nights (the table's ends beyond it)."""
    i = min(max(nights, MDE_NIGHTS[0]), MDE_NIGHTS[-1]) - MDE_NIGHTS[0]
    return MDE_STEPS[i]

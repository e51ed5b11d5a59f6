"""What a change over its sd means under no change: pure.

The nights' noise is a Student t with `Policy.tail_dof` degrees of freedom at the robust
sigma (`t_robust_sigma`: that of the standard t), the sigma an estimate worth some
degrees of freedom (`tasks.analysis.noise`). From that law: the single night's tail
(`null_sf`, `null_quantile`), the two-night bad-night threshold that allows for a sigma
estimated too small (`bad_threshold`), a change's `score` against it and its
`confidence`, and the minimum detectable effect (`minimum_detectable`, caught within two
nights `MDE_POWER` of the time). `tasks.analysis.detector` and `tasks.analysis.across`
judge with them; `tasks.analysis.noise` measures in `t_robust_sigma`'s units."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.special import stdtr, stdtrit
from scipy.stats import chi2

from .policy import Policy

MDE_POWER = 0.9  # the minimum detectable effect is caught within two nights this often


@lru_cache(maxsize=512)
def _scale_ratios(dof: float) -> np.ndarray:
    """Quantiles of (estimated sigma / true sigma) for a sigma worth `dof` degrees of
    freedom: sqrt(chi2 / dof) at 64 evenly spaced probabilities."""
    probabilities = (np.arange(64) + 0.5) / 64
    return np.sqrt(chi2.ppf(probabilities, dof) / dof)


@lru_cache(maxsize=16)
def t_robust_sigma(tail: float) -> float:
    """The robust sigma (1.4826 x MAD) of a Student t with `tail` d.o.f., in its own scale."""
    return 1.4826 * float(stdtrit(tail, 0.75))


def _sf_by_scale(u: float, dof: float, tail: float) -> np.ndarray:
    """P(U >= u) under no change at each quantile of the estimated sigma's scale ratio
    (`_scale_ratios`): the nights' noise a Student t with `tail` d.o.f. at the robust
    sigma, the sigma estimated with `dof` d.o.f."""
    return stdtr(tail, -u * t_robust_sigma(tail) * _scale_ratios(round(dof, 1)))


def null_sf(u: float, dof: float, tail: float) -> float:
    """P(U >= u) under no change, where U is tonight's change over its sd as estimated."""
    return float(np.mean(_sf_by_scale(u, dof, tail)))


@lru_cache(maxsize=4096)
def null_quantile(level: float, dof: float, tail: float) -> float:
    """The u that a change over its sd exceeds with probability `level` under no change."""
    return _solve(lambda u: null_sf(u, dof, tail), level)


@lru_cache(maxsize=4096)
def bad_threshold(level: float, dof: float, tail: float) -> float:
    """The u above which a night is bad: two nights judged against the same estimated
    sigma are both bad with probability `level` under no change. Their sigma is shared,
    so a sigma estimated too small makes both bad at once: the threshold allows for it
    (with few degrees of freedom it sits well above the single night's quantile)."""
    return _solve(lambda u: float(np.mean(_sf_by_scale(u, dof, tail) ** 2)), level)


def _solve(decreasing, level: float) -> float:
    """The u where a decreasing function of u crosses `level` (bisection)."""
    low, high = -1e3, 1e3
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (mid, high) if decreasing(mid) > level else (low, mid)
    return high


def score(change: float, sd: float, dof: float, level: float, policy: Policy) -> float:
    """A log change (positive: the direction tested) with sd `sd` under no change, its
    sigma worth `dof`, in units of the bad-night threshold at `level`: 1 or more is a bad
    night (`bad_threshold`)."""
    if sd <= 0:
        return 0.0 if change == 0 else math.copysign(1e3, change)
    return change / sd / bad_threshold(level, round(dof, 1), policy.tail_dof)


def confidence(change: float, sd: float, dof: float, policy: Policy) -> float:
    """1 - the one-sided p-value of a log change in its own direction under no change: its
    sd `sd`, the sigma worth `dof`."""
    if sd <= 0:
        return 1.0 if change else 0.5
    return round(1 - null_sf(abs(change) / sd, dof, policy.tail_dof), 4)


def minimum_detectable(sd: float, dof: float, level: float, floor: float,
                       policy: Policy) -> float:
    """The smallest log step caught within two nights with `MDE_POWER` probability: two bad
    nights in a row at `level`, each night bad with probability sqrt(MDE_POWER) when its
    change is the step plus `sd` times the noise law of `null_sf`."""
    dof, tail = round(dof, 1), policy.tail_dof
    step = bad_threshold(level, dof, tail) + null_quantile(1 - math.sqrt(MDE_POWER), dof, tail)
    return max(floor, sd * step)

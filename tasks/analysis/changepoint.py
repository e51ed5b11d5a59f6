"""Retrospective change points in a metric's history: E-Divisive (Matteson & James, 2014)
with the energy statistic (alpha = 1), on numpy. Pure and deterministic.

For a series x_1..x_n and a split tau, the energy divergence of the two sides is
    E = 2/(t*u) sum|x_i - y_j| - 1/C(t,2) sum_{i<k}|x_i - x_k| - 1/C(u,2) sum_{j<l}|y_j - y_l|
(t = tau, u = n - tau) and the split statistic is Q = t*u/n * E. The best split is kept when
a permutation test (a fixed seed, so the same history always gives the same answer) says
no shuffled series reaches its Q often; then each side is searched again. Used by the
comparison to name the run where a level shift began, for the report; the nightly verdict
itself does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SEED = 20140101


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first position of the new level
    p_value: float
    before: float  # median of the segment before
    after: float  # median of the segment after


def _split_stats(x: np.ndarray, min_size: int) -> np.ndarray:
    """Q for every split of every row of `x` (rows: series of equal length); shape
    (rows, splits), split k puts min_size + k values on the left."""
    rows, n = x.shape
    d = np.abs(x[:, :, None] - x[:, None, :])
    s = np.zeros((rows, n + 1, n + 1))
    s[:, 1:, 1:] = d.cumsum(1).cumsum(2)
    tau = np.arange(min_size, n - min_size + 1)
    u = n - tau
    corner, edge, total = s[:, tau, tau], s[:, tau, n], s[:, n, n][:, None]
    left = corner / 2.0  # sum over pairs i < k of the left block
    right = (total - 2 * edge + corner) / 2.0
    between = edge - corner
    energy = 2 * between / (tau * u) - left / (tau * (tau - 1) / 2) - right / (u * (u - 1) / 2)
    return tau * u / n * energy


def _significant_split(x: np.ndarray, min_size: int, alpha: float, permutations: int,
                       rng: np.random.Generator) -> tuple[int, float] | None:
    """(size of the left side, p-value) of the best split, when significant."""
    if len(x) < 2 * min_size:
        return None
    q = _split_stats(x[None, :], min_size)[0]
    best = int(np.argmax(q))
    shuffled = rng.permuted(np.broadcast_to(x, (permutations, len(x))), axis=1)
    reached = int((_split_stats(shuffled, min_size).max(axis=1) >= q[best]).sum())
    p_value = (reached + 1) / (permutations + 1)
    return (min_size + best, p_value) if p_value < alpha else None


def change_points(values: list[float], *, min_size: int = 3, alpha: float = 0.05,
                  permutations: int = 199) -> list[ChangePoint]:
    """Significant level shifts of `values` (oldest first), by bisection, in index order."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(_SEED)
    found: list[tuple[int, float]] = []
    segments = [(0, len(x))]
    while segments:
        lo, hi = segments.pop()
        split = _significant_split(x[lo:hi], min_size, alpha, permutations, rng)
        if split is None:
            continue
        tau, p_value = split
        found.append((lo + tau, p_value))
        segments += [(lo, lo + tau), (lo + tau, hi)]
    found.sort()
    bounds = [0, *(i for i, _ in found), len(x)]
    return [ChangePoint(i, p, float(np.median(x[bounds[k]:i])), float(np.median(x[i:bounds[k + 2]])))
            for k, (i, p) in enumerate(found)]

"""A metric's night-to-night noise: pure.

One history's noise is the Student t scale of its nights' logs (`t_scale`, in robust-sigma
units, `noise_sigma`) with the degrees of freedom it is worth; the run's other stages on
a fingerprint lend theirs (`pooled_noise`, `peer_noise`), pooled with a stage's own by how
likely it is that the stage shares their noise (`peer_weight`, `pooled_with_peers`). The
rules, and what they cost and buy in the bench, are `tasks.analysis.detector`'s ("Noise")."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

from scipy.special import expit
from scipy.stats import f as f_dist

from ..metrics import METRICS
from .nights import baseline_logs, judged_logs
from .policy import Policy, judged_metrics
from .thresholds import t_robust_sigma

T_EFFICIENCY = 0.49  # a t_scale sigma from n nights is worth 0.49 (n-1) d.o.f. on t3 noise
T_SCALE_CAP = 1.5  # t_scale never exceeds this x the MAD's sigma (wild nights)
PEER_NIGHTS = 3  # a peer's nights before its noise counts for the doubt floor
LENT = 0.05  # peers lending less of their nights are not named (`pooled_with_peers`)


@dataclass(frozen=True)
class Noise:
    """A noise estimate of one metric: sigma of the nights' logs and what it is worth."""

    sigma: float
    dof: float  # effective degrees of freedom
    stages: int = 1  # histories it was estimated from
    peers_weight: float = 0.0  # the share of the peers' d.o.f. it counts (`peer_weight`)


def noise_sigma(logs: list[float]) -> float:
    """1.4826 x MAD: the robust sigma, as `bench/measure_noise.py` measures the machine's
    noise; the unit and the cap of the detector's own estimate, `t_scale`."""
    centre = statistics.median(logs)
    return 1.4826 * statistics.median(abs(v - centre) for v in logs)


def noise_of(logs: list[float], policy: Policy, dof_lost: int = 0) -> Noise:
    """The noise of one history's logs (at least one) and its degrees of freedom, less
    `dof_lost` (a slope fitted to them: 1)."""
    return Noise(t_scale(tuple(logs), policy.tail_dof),
                 max(1.0, T_EFFICIENCY * (len(logs) - 1 - dof_lost)))


@lru_cache(maxsize=8192)
def t_scale(logs: tuple[float, ...], tail: float) -> float:
    """The nights' noise as the Student t (`tail` d.o.f.) maximum-likelihood scale of their
    logs about their median, in robust-sigma units (x the t's own robust sigma, so it
    estimates what `noise_sigma` does on that law). On t3 noise it is worth about 0.49
    (n - 1) degrees of freedom against the MAD's 0.30, and every threshold that allows for
    the estimate is that much narrower (`bench/bench_detector.py` prints both).

    The t likelihood gives way when more than 1 night in `tail` + 1 is wild (the MAD holds
    to half): two nights at +110% in 8 made it 4 times the MAD. So it is capped at
    `T_SCALE_CAP` x the MAD's sigma, which t3 noise alone almost never reaches (the d.o.f.
    above are measured with the cap). Solved by Newton's method on the likelihood
    equation in the squared scale, from the MAD's. 0 where the MAD is 0, as before: most
    nights equal, the change is judged against the effect floor alone."""
    mad_sigma = noise_sigma(list(logs))
    if mad_sigma <= 0:
        return 0.0
    centre = statistics.median(logs)
    squares = [(v - centre) ** 2 for v in logs]
    q = (mad_sigma / t_robust_sigma(tail)) ** 2  # the squared scale
    for _ in range(100):
        # mean((tail + 1) r^2 / (tail q + r^2)) = 1: decreasing and convex in q
        terms = [(tail + 1) * r2 / (tail * q + r2) for r2 in squares]
        excess = sum(terms) / len(terms) - 1
        slope = -sum(t * tail / (tail * q + r2) for t, r2 in zip(terms, squares)) / len(terms)
        step = excess / slope
        q = q - step if q - step > 0 else q / 2
        if abs(step) <= 1e-10 * q or abs(excess) < 1e-12:
            break
    return min(math.sqrt(q) * t_robust_sigma(tail), T_SCALE_CAP * mad_sigma)


@dataclass(frozen=True)
class Peers:
    """A metric's noise over the run's other stages on this stage's fingerprint."""

    judged: Noise | None  # over those past learning: pooled with this stage's own
    doubt: Noise | None  # over all with `PEER_NIGHTS` or more, learning or not: the floor
    # over those whose nights were moved along their covariate (`judged_logs`): pooled
    # with a stage's own when its nights were too (like with like)
    adjusted: Noise | None = None


def _pool(noises: list[Noise]) -> Noise | None:
    """Variances weighted by their degrees of freedom."""
    if not noises:
        return None
    dof = sum(n.dof for n in noises)
    return Noise(math.sqrt(sum(n.dof * n.sigma ** 2 for n in noises) / dof), dof, len(noises))


def peer_noise(histories: list[list[dict]], metric: str, policy: Policy) -> Peers | None:
    """The noise of `metric` pooled over other stages' histories. Only histories past
    learning are pooled with a stage's own: their values as they are (`Peers.judged`), or
    moved along their covariate where the metric has one and they have its nights
    (`Peers.adjusted`), for a stage judged the same way; every history with a few nights
    bounds from below what a learning stage calls beyond doubt (`Peers.doubt`, on the
    values as they are, as a learning stage is judged): five nights that swing little by
    chance must not vouch for themselves alone."""
    noises = [(len(logs), noise_of(logs, policy)) for h in histories
              if len(logs := baseline_logs(metric, h, policy)) >= min(PEER_NIGHTS, policy.min_history)]
    if not noises:
        return None
    adjusted = []
    for history in histories if METRICS[metric].adjusted_by else ():
        logs, fitted = judged_logs(metric, history, policy, adjust=True)
        if fitted is not None:
            adjusted.append(noise_of(logs, policy, dof_lost=1))
    # a sigma of 0 (two of three nights alike) or not finite would lower the floor unseen
    return Peers(_pool([noise for n, noise in noises if n >= policy.min_history]),
                 _pool([noise for n, noise in noises if n >= PEER_NIGHTS
                        and math.isfinite(noise.sigma) and noise.sigma > 0]),
                 _pool(adjusted))


def pooled_noise(histories: list[list[dict]], policy: Policy) -> dict[str, Peers]:
    """metric -> its noise over `histories` (the run's other stages on this fingerprint),
    for every judged metric any of them has `PEER_NIGHTS` nights of."""
    return {m: peers for m in judged_metrics(policy)
            if (peers := peer_noise(histories, m, policy)) is not None}


@lru_cache(maxsize=4096)
def pool_test_power(own_dof: float, peers_dof: float, level: float, guard: float) -> float:
    """How often the F test that keeps a noisier stage apart catches one `guard` times as
    noisy as its peers (in sigma), at these degrees of freedom."""
    critical = float(f_dist.isf(level, own_dof, peers_dof))
    return float(f_dist.sf(critical / guard ** 2, own_dof, peers_dof))


def peer_weight(own_dof: float, peers_dof: float, ratio: float, prior: float,
                guard: float) -> float:
    """The share of its peers' degrees of freedom a stage's noise counts: the posterior
    weight of "it shares their noise" against "it is `guard` times as noisy" (in sigma),
    `prior` on the first, from the F ratio of its variance over theirs (`ratio`) at these
    degrees of freedom (0.60 at a ratio of 1, 0.25 at 1.5 and 0.002 at 4 with 20 nights
    beside 3 peers with as many, at the default prior of 0.1)."""
    if prior >= 1:
        return 1.0  # known to share it (the bench's "every peer trusted")
    if prior <= 0 or not 0 < ratio < math.inf:
        return 0.0  # a ratio of 0 or none: no noise of its own to compare, judged alone
    # in logs: at a ratio far from both the densities underflow, their ratio does not
    shares = math.log(prior) + float(f_dist.logpdf(ratio, own_dof, peers_dof))
    noisier = (math.log1p(-prior) + float(f_dist.logpdf(ratio / guard ** 2, own_dof, peers_dof))
               - 2 * math.log(guard))
    return float(expit(shares - noisier))


def pooled_with_peers(own: Noise, peers: Noise | None, policy: Policy) -> Noise:
    """This stage's noise with its peers', their degrees of freedom weighted by how likely
    it is that it shares their noise (`peer_weight`): most of them when the two are in line,
    next to none when it is the noisier one (theirs would make its noise look quieter).
    Under a weight of `LENT` it is said to be judged alone (`Noise.stages` 1)."""
    if peers is None or own.sigma <= 0 or peers.sigma <= 0:
        return own
    power = pool_test_power(own.dof, peers.dof, policy.pool_level, policy.pool_guard)
    if power < policy.pool_power:
        return own  # too few nights of its own to tell whether it is the noisier one
    weight = peer_weight(own.dof, peers.dof, (own.sigma / peers.sigma) ** 2,
                         policy.pool_prior, policy.pool_guard)
    both = _pool([own, Noise(peers.sigma, weight * peers.dof)])
    return Noise(both.sigma, both.dof, peers.stages + 1 if weight >= LENT else 1, weight)

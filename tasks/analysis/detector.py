"""Regression verdicts: pure functions, data in, verdicts out.

Like with like: the caller passes only earlier nights of the same stage key (scenario,
stage, broker) on the same fingerprint. For each judged metric (`tasks.metrics`: a
better-direction and a minimum practical effect) of a valid stage:

- **Baseline.** Rolling: the median of the newest `Policy.window` earlier nights since the
  last accepted change, without the values the store holds out (flagged nights that no
  human accepted or called a false positive and no next night cleared). Release: the
  pinned release run's value, with the noise still measured on the rolling history.
- **Noise.** Changes are log ratios. A history's noise sigma is the Student t maximum-
  likelihood scale of its nights' logs (`t_scale`, in the units of the robust sigma,
  1.4826 x MAD, that `bench/measure_noise.py` measures), worth 0.49 (n - 1) degrees of
  freedom on t3 noise against the MAD's 0.30 (`bench/bench_detector.py` measures both).
  Twenty nights still pin a sigma down only to about +-23%, and that costs a detector
  much of its power. So the noise is pooled over the
  other stages of the run that share this stage's fingerprint and are past learning
  (`pooled_noise`), weighted by their degrees of freedom, with this stage's own, unless
  this stage is noisier than they are (a one-sided F test at `Policy.pool_level`): a stage
  never borrows a quieter neighbour's noise. Nor before its own nights can show it: with
  8 nights that test misses a stage twice as noisy as its 3 peers 1 time in 5, and each
  miss lends it a sigma about 0.55 of its own; so a stage pools only once the test would
  catch that 9 times in 10 (`pool_power`, `pool_guard`: 14 nights beside 3 peers with as
  many, 13 beside peers with 30). In the bench's mixed suite (one stage of 4 twice as
  noisy, 2000 series, at the level of 4e-4 then in use) that took the false alarms from
  0.80 to 0.60 per 100 series, averaged over the 11 metrics (bench/README.md, the run of
  2026-11-26); recall at 20 nights is the same, and a new stage's nights 8 to 13 see less
  (their MDE is larger, and says so).
  Tonight's change has sd
  `sigma * sqrt(1 + pi / 2n)` (the median's own error) or `sigma * sqrt(2)` (release: one
  night against one).
- **Covariate.** A metric that declares one (`MetricDef.adjusted_by`: the broker's CPU per
  message and e2e p50, on the driver's CPU where they share a host) is judged at tonight's
  value of it when tonight (and a release baseline) has one and `min_history` of its
  baseline nights have it: those nights are fitted on it (log on log, `tasks.analysis.covariate`),
  baseline and noise are taken from the nights moved along the slope (a degree of freedom
  fewer), the baseline is moved to tonight's covariate (the baseline value the verdict
  shows), and the slope's own error adds to tonight's sd. Peers pool their noise the same
  way (`Peers.adjusted`); a learning stage and its doubt floor use the values as they are.
- **Host pace.** A metric gated by the host's pace (`MetricDef.gated_by`: the latency
  metrics, on `host_pace_us`) is not judged on a night whose host ran more than
  `Policy.pace_gate` off its usual pace (the median of the newest `window` nights', once
  `min_history` have one), or against a release whose night did: `no_baseline`, with the
  reason; and such nights stay out of its baseline, noise and change point (`off_pace`: a
  stage whose nights at the usual pace are fewer than `min_history` is learning again).
  On this machine's real nights (bench/README.md, real_nights.py) every false change
  verdict of 20 unchanged nights fell on such a night: the host 27% to 62% slower, e2e
  p50 up 18% to 37%, more than the driver's CPU it is judged at explains (along a slope
  fitted on usual nights, where the driver's own noise flattens it); on 20 nights after,
  the gate took the change verdicts from 11 (1 regression) to 5 suspected.
- **Bad nights.** The nights' noise is taken to be a Student t with `Policy.tail_dof`
  degrees of freedom (heavy tails: the sd of the machine's latency and CPU figures is 1.2
  to 2.4 times their robust sigma), and the sigma an estimate with the d.o.f. above. A night
  is bad when its change reaches the threshold at which two given nights judged against
  the same estimated sigma are both bad with probability `Policy.level` under no
  change (`bad_threshold`; a shared sigma that came out too small makes both bad at once,
  so with few d.o.f. the threshold sits well above a single night's quantile), and at
  least the effect floor (`effect_floor` x the minimum practical effect). Detail `score`
  is the change over that threshold: 1 or more is bad.
- **Verdicts.** A first bad night is `suspected` (its value is held out of later baselines
  until a night clears it); a bad night after a flagged one is a `regression` (nights of
  evidence counted); any other night clears the suspicion. Two bad nights in a row is the
  two-night test: on heavy-tailed noise it comes close to the Neyman-Pearson likelihood
  ratio that knows the step (one wild night is common, two in a row are not; a sum of the
  two nights' changes does far worse). The bench prints both, and the rule with the level
  and noise known, so what estimating them costs is visible apart from the rule's own gap. A bad night is a `regression` at once when the step is
  plausibly large (the change minus its one-sided 95% margin still reaches `large_step`)
  on a metric whose noise is known from `large_history` nights, and the night alone is
  beyond what no change gives with probability `large_level` (a small part of the pair's
  budget: on t3 noise a 10-sigma night comes once in 1,400, so a fixed number of sigmas
  would not do; the threshold is 27 sigmas of tonight's change with the noise known, more
  with fewer nights to know it). An `improvement` needs the same evidence in the better
  direction: two nights in a row.
- **Learning.** Until the stage has `min_history` baseline nights of its own, the verdict
  is `learning` ("learning: N of M nights"). Only what is beyond doubt is flagged then: a
  change of at least `large_step` that is also `doubt_spread` times the widest deviation
  the history has shown (with at least `doubt_nights` nights to show it) and beyond the
  two-night threshold at `doubt_level` with the noise of the stage's peers (the run's
  other stages on this fingerprint with at least `PEER_NIGHTS` nights, learning or not),
  two nights in a row, is a `regression`. One such night is still `learning`, its detail
  says so. A stage without peers has the swing alone: five nights that swing little by
  chance say nothing of the noise, and no threshold from them would either
  (`_beyond_doubt`).
- **What it can see.** Each verdict carries the metric's minimum detectable effect
  (`mde_pct`): the smallest step these rules catch within two nights with 90% probability
  at the noise in use. Above `too_noisy` x the minimum practical effect the detail says
  the metric is too noisy to guard, and why.
- Invalid stages are never compared. A stage without history says so, and says when a
  changed fingerprint is why.
- For a flagged metric the detail names the run where the level shift began: the E-Divisive
  pass of `tasks.analysis.changepoint` over the recent history (judged at a covariate:
  its nights moved along the slope), for the report.

Each judged metric has its own false-alarm budget: at most one false alarm per 100 series
of 30 nights (`false_alarm_level` x 22 judged nights, 0.66, checked by the bench); a stage
with m judged metrics has up to m times that. A figure of the broker itself
(`MetricDef.across_stages`: its cost) is also judged across the run's stages on its
fingerprint (`tasks.analysis.across`, after this module's verdicts, with the stage's
change, sd and d.o.f. in detail `evidence`): a regression is two bad nights in a row of
one test, the stage's own or the one across stages (`prior_nights`), so the first spends
`Policy.level` (`false_alarm_level` less `across_level`) and the second `across_level`;
in the better direction, not judged across stages, the own test keeps the whole level.
The level keeps a third of the budget in
hand for a stage noisier than its peers that pooling cannot tell apart: the bench's mixed
suite (one stage of 4 twice as noisy) had its worst metric at 1.15 false alarms per 100
series at 4e-4, 0.85 and 1.00 at 3e-4 on two sets of draws, each over 2000 series.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.special import stdtr, stdtrit
from scipy.stats import chi2
from scipy.stats import f as f_dist

from ..metrics import FLAGGED, METRICS
from .changepoint import change_points
from .covariate import Fit, fit, log_of

_Z95 = 1.6448536269514722  # one-sided 95% normal quantile
T_EFFICIENCY = 0.49  # a t_scale sigma from n nights is worth 0.49 (n-1) d.o.f. on t3 noise
T_SCALE_CAP = 1.5  # t_scale never exceeds this x the MAD's sigma (wild nights)
MDE_POWER = 0.9  # the minimum detectable effect is caught within two nights this often
PEER_NIGHTS = 3  # a peer's nights before its noise counts for the doubt floor


@dataclass(frozen=True)
class Policy:
    false_alarm_level: float = 3e-4  # two given nights both bad under no change: this unlikely
    tail_dof: float = 3.0  # the nights' noise law: Student t with this many d.o.f.
    min_history: int = 8  # own baseline nights before judging: learning before
    window: int = 30  # newest baseline nights used
    pool_level: float = 0.25  # one-sided F test: this stage no noisier than its peers
    pool_power: float = 0.9  # ... pooled only once that test sees a stage `pool_guard`
    pool_guard: float = 2.0  # ... times as noisy as its peers (in sigma) this often
    effect_floor: float = 0.3  # never flag a change below this fraction of the min effect
    large_step: float = 0.15  # confirmed at once when plausibly at least this large ...
    large_level: float = 4e-5  # ... and one night alone this unlikely under no change
    large_history: int = 10  # ... measured over at least this many nights
    doubt_spread: float = 5.0  # learning: flagged beyond this x the history's widest swing
    doubt_nights: int = 5  # ... shown by at least this many nights
    doubt_level: float = 4e-5  # ... and two nights beyond the peers' noise this unlikely
    too_noisy: float = 3.0  # warn when the MDE is above this x the minimum effect
    pace_gate: float = 0.2  # a gated metric is not judged on a host this much off its pace
    across_level: float = 1e-4  # a metric judged across stages too: that test's share of
    # false_alarm_level (its own nights' test has the rest: `tasks.analysis.across`)
    min_effect: dict[str, float] = field(default_factory=dict)  # overrides tasks.metrics

    def effect(self, metric: str) -> float:
        return self.min_effect.get(metric, METRICS[metric].min_effect)

    def __post_init__(self) -> None:
        if not 0 <= self.across_level < self.false_alarm_level:
            raise ValueError(f"Policy.across_level {self.across_level:g}: give 0 or more, "
                             f"under false_alarm_level {self.false_alarm_level:g}")

    def floor(self, metric: str) -> float:
        """The log change below which `metric` is never flagged: `effect_floor` x its
        minimum effect."""
        return math.log1p(self.effect_floor * self.effect(metric))

    def level(self, metric: str, *, worse: bool = True) -> float:
        """The false-alarm level of a stage's own two-night test of `metric` in the worse
        direction (`worse`) or the better one: the whole `false_alarm_level`, less
        `across_level` where the metric is also judged across stages (only in the worse
        direction)."""
        across = self.across_level if worse and METRICS[metric].across_stages else 0.0
        return self.false_alarm_level - across

    def too_noisy_above(self, metric: str) -> float:
        """The log MDE above which `metric` is too noisy to guard: `too_noisy` x its
        minimum effect."""
        return math.log1p(self.too_noisy * self.effect(metric))

    @property
    def history_nights(self) -> int:
        """How many earlier nights a stage is judged on (held-out ones and the change
        point's search included): twice the baseline window."""
        return 2 * self.window


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
class Noise:
    """A noise estimate of one metric: sigma of the nights' logs and what it is worth."""

    sigma: float
    dof: float  # effective degrees of freedom
    stages: int = 1  # histories it was estimated from


@dataclass(frozen=True)
class Reference:
    """What tonight's metric is compared with, already reduced to numbers."""

    kind: str  # "rolling" | "release"
    centre: float  # log of the baseline value
    noise: Noise
    pred_sd: float  # sd of tonight's log change under no change
    nights: int  # own baseline nights
    spread: float  # the widest deviation of a baseline night from the baseline median
    spread_before: float  # the same without the newest night
    doubt_floor: float  # while learning: the two-night threshold with the peers' noise
    fit: Fit | None = None  # the nights on their covariate, when judged at tonight's value


def judged_metrics(policy: Policy) -> list[str]:
    return [m.name for m in METRICS.values() if m.better != "none" and policy.effect(m.name) > 0]


def noise_sigma(logs: list[float]) -> float:
    """1.4826 x MAD: the robust sigma, as `bench/measure_noise.py` measures the machine's
    noise; the unit and the cap of the detector's own estimate, `t_scale`."""
    centre = statistics.median(logs)
    return 1.4826 * statistics.median(abs(v - centre) for v in logs)


def _usable(metric: str, history: list[dict], policy: Policy) -> list[dict]:
    """The baseline nights of `metric`, newest first: a usable value, not held out, and
    for a metric gated by the host's pace (`MetricDef.gated_by`), on a host at its usual
    pace (`off_pace`)."""
    recorded = [night for night in history if (night["metrics"].get(metric) or 0) > 0
                and metric not in night.get("held_out", ())]
    return _at_usual_pace(metric, recorded, history, policy)[:policy.window]


def _at_usual_pace(metric: str, nights: list[dict], history: list[dict],
                   policy: Policy) -> list[dict]:
    """`nights` but those whose host ran off the usual pace of `history`, for a metric
    gated by the host's pace (`MetricDef.gated_by`); all of them for another."""
    gate = METRICS[metric].gated_by
    usual = usual_pace(history, gate, policy) if gate else None
    if usual is None:
        return nights
    return [night for night in nights
            if off_pace(night["metrics"].get(gate), usual, policy) is None]


def usual_pace(history: list[dict], gate: str, policy: Policy) -> float | None:
    """The median log host pace (`gate`) over the newest `window` nights, of those that
    recorded one, if at least `min_history` did (held-out and off-pace nights count: the
    usual pace is the host's, whatever a metric did)."""
    paces = [x for night in history[:policy.window]
             if (x := log_of(night["metrics"].get(gate))) is not None]
    return statistics.median(paces) if len(paces) >= policy.min_history else None


def off_pace(pace: float | None, usual: float | None, policy: Policy) -> float | None:
    """How far (log) a night's host pace is from the usual one, when it is more than
    `pace_gate` off it: a pace that much higher (a slower host) or lower (a faster one).
    None when it is not, or either is unknown."""
    tonight = log_of(pace)
    if tonight is None or usual is None:
        return None
    off = tonight - usual
    beyond = off > math.log1p(policy.pace_gate) or off < math.log1p(-min(policy.pace_gate, 0.99))
    return off if beyond else None


def _logs(metric: str, history: list[dict], policy: Policy) -> list[float]:
    """The baseline nights' logs, newest first."""
    return [math.log(night["metrics"][metric]) for night in _usable(metric, history, policy)]


def _judged_logs(metric: str, history: list[dict], policy: Policy,
                 adjust: bool) -> tuple[list[float], Fit | None]:
    """The nights' logs the metric is judged on. With `adjust`, for a metric with a
    covariate (`MetricDef.adjusted_by`) of which at least `min_history` of these nights
    have a value: those nights, each moved along the fitted slope to their median covariate
    (`tasks.analysis.covariate`), and the fit. Else the nights' logs as they are."""
    by = METRICS[metric].adjusted_by
    if adjust and by:
        pairs = [(math.log(night["metrics"][metric]), x)
                 for night in _usable(metric, history, policy)
                 if (x := log_of(night["metrics"].get(by))) is not None]
        if len(pairs) >= policy.min_history:
            fitted = fit(pairs)
            return [fitted.adjust(y, x) for y, x in pairs], fitted
    return _logs(metric, history, policy), None


def _noise_of(logs: list[float], policy: Policy, dof_lost: int = 0) -> Noise:
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
    # over those whose nights were moved along their covariate (`_judged_logs`): pooled
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
    noises = [(len(logs), _noise_of(logs, policy)) for h in histories
              if len(logs := _logs(metric, h, policy)) >= min(PEER_NIGHTS, policy.min_history)]
    if not noises:
        return None
    adjusted = []
    for history in histories if METRICS[metric].adjusted_by else ():
        logs, fitted = _judged_logs(metric, history, policy, adjust=True)
        if fitted is not None:
            adjusted.append(_noise_of(logs, policy, dof_lost=1))
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


def _pooled(own: Noise, peers: Noise | None, policy: Policy) -> Noise:
    """This stage's noise with its peers', when the two are in line (else its own)."""
    if peers is None or own.sigma <= 0 or peers.sigma <= 0:
        return own
    power = pool_test_power(own.dof, peers.dof, policy.pool_level, policy.pool_guard)
    if power < policy.pool_power:
        return own  # too few nights of its own to tell whether it is the noisier one
    ratio = (own.sigma / peers.sigma) ** 2
    if float(f_dist.sf(ratio, own.dof, peers.dof)) < policy.pool_level:
        return own  # noisier than its peers: theirs would make its noise look quieter
    both = _pool([own, peers])
    return Noise(both.sigma, both.dof, peers.stages + 1)


def baseline_for(metric: str, history: list[dict], release: dict | None, policy: Policy,
                 peers: Peers | None = None, covariate: float | None = None) -> Reference | None:
    """None when there is nothing to compare with. `covariate`: tonight's value of the
    metric's covariate (`MetricDef.adjusted_by`). With one, `min_history` nights that have
    it and, against a release, the release night having it too, the baseline is what the
    nights say the metric is at tonight's covariate; else the values as they are."""
    by = METRICS[metric].adjusted_by
    at = log_of(covariate) if by else None
    anchor = None  # the release night's log covariate
    if release is not None and at is not None:
        anchor = log_of(release["metrics"].get(by))
    logs, fitted = _judged_logs(metric, history, policy,
                                adjust=at is not None and (release is None or anchor is not None))
    n = len(logs)
    if release is not None:
        value = release["metrics"].get(metric)
        if value is None or value <= 0:
            return None
        centre = math.log(value) if fitted is None else fitted.adjust(math.log(value), anchor)
    elif n:
        centre = statistics.median(logs)
    else:
        return None
    own = _noise_of(logs, policy, int(fitted is not None)) if n else Noise(0.0, 1.0)
    learning = n < policy.min_history
    pool = (peers.judged if fitted is None else peers.adjusted) if peers else None
    noise = own if learning else _pooled(own, pool, policy)
    factor = _pred_factor(n, release is not None)
    pred_sd = noise.sigma * factor
    mid = statistics.median(logs) if n else centre
    spread = max((abs(v - mid) for v in logs), default=0.0)
    spread_before = max((abs(v - mid) for v in logs[1:]), default=0.0)
    if fitted is not None:  # to tonight's covariate, with the slope's error over the way
        centre += fitted.rise(at)
        away = at - (fitted.mean_x if anchor is None else anchor)
        pred_sd = noise.sigma * math.sqrt(factor ** 2 + fitted.slope_error(away))
    peers_noise = peers.doubt if learning and peers else None
    doubt_floor = 0.0 if peers_noise is None else factor * peers_noise.sigma * bad_threshold(
        policy.doubt_level, round(peers_noise.dof, 1), policy.tail_dof)
    return Reference("release" if release is not None else "rolling", centre, noise,
                     pred_sd, n, spread, spread_before, doubt_floor, fitted)


def _pred_factor(n: int, release: bool) -> float:
    """The sd of tonight's log change over the nights' sigma: against a release's single
    night sqrt(2), against the median of n nights sqrt(1 + pi / 2n)."""
    return math.sqrt(2) if release else math.sqrt(1 + math.pi / (2 * n))


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


def _shift(metric: str, history: list[dict], value: float, run_id: str | None,
           fitted: Fit | None, covariate: float | None, policy: Policy) -> dict | None:
    """Where the latest level shift began, over every recent value (held-out ones too, not
    those of a night its host ran off its pace, for a metric gated by it); when the metric
    is judged at its covariate (`fitted`), over the nights that have it, each moved along
    the slope as the judged ones are (a shift of the host's pace alone is no shift of the
    metric)."""
    by = METRICS[metric].adjusted_by
    recorded = [h for h in reversed(history) if (h["metrics"].get(metric) or 0) > 0
                and (fitted is None or log_of(h["metrics"].get(by)) is not None)]
    past = _at_usual_pace(metric, recorded, history, policy)
    labels = [h.get("run_id") for h in past] + [run_id or "tonight"]
    logs = [math.log(h["metrics"][metric]) for h in past] + [math.log(value)]
    if fitted is not None:
        xs = [log_of(h["metrics"][by]) for h in past] + [log_of(covariate)]
        logs = [fitted.adjust(y, x) for y, x in zip(logs, xs)]
    points = change_points(logs, min_size=2)
    if not points:
        return None
    last = points[-1]
    return {"run_id": labels[last.index], "nights_ago": len(labels) - 1 - last.index,
            "shift_pct": round(100 * math.expm1(last.after - last.before), 2),
            "p_value": round(last.p_value, 4)}


def _decide(change: float, tonight: float, base: Reference, floor: float,
            previous: dict | None, policy: Policy) -> tuple[str, int]:
    """(verdict, nights of evidence) by the rules in the module docstring. `change` and
    `tonight` (its score) are in the worse direction."""
    before = previous or {}
    prior = prior_nights(before)
    if base.nights < policy.min_history:
        return _learning(change, base, prior, before, policy)
    if tonight >= 1 and change >= floor:
        if prior:
            return "regression", prior + 1
        step = math.log1p(policy.large_step)
        single = null_quantile(policy.large_level, round(base.noise.dof, 1), policy.tail_dof)
        large = (base.nights >= policy.large_history
                 and change >= single * base.pred_sd
                 and change - _Z95 * base.pred_sd >= step)
        return ("regression" if large else "suspected"), 1
    last = before.get("detail", {}).get("score")
    if (-tonight >= 1 and -change >= floor and last is not None
            and before.get("verdict") in ("unchanged", "improvement") and -last >= 1):
        return "improvement", 0
    return "unchanged", 0


def prior_nights(previous: dict | None, *, across: bool = False) -> int:
    """The nights of evidence a flagged previous verdict holds for a test: the stage's own
    (`across` False: a verdict the stages together flagged holds none for it), or the one
    across the run's stages (True: a flagged night on which they were bad for this stage,
    detail `across.bad`; `tasks.analysis.across`). Two bad nights in a row of one test, not
    one of each, make a regression: so each test spends its own level."""
    before = previous or {}
    if before.get("verdict") not in FLAGGED:
        return 0
    detail = before.get("detail") or {}
    together = detail.get("across") or {}
    held = together.get("bad") if across else not together.get("flagged")
    return int(detail.get("nights") or 0) if held else 0


def _beyond_doubt(change: float, base: Reference, previous: dict, policy: Policy) -> bool:
    """A learning night's change is beyond doubt: at least `large_step` and `doubt_spread`
    times the widest swing of the history, with `doubt_nights` nights to show it, and at
    least the two-night threshold with the noise of the stage's peers (`doubt_floor`, at
    `doubt_level`: at the judged nights' level, 2 of the bench's 2000 x 12 A/A series
    still passed while learning, both PUBACK p99 at 12% noise).
    After a night that was, the spread leaves that night out (it would widen it).

    Five nights of t3 noise sometimes swing little by chance, and then tell nothing of the
    metric's noise: the peers' nights, on this fingerprint, do. Their own noise is no
    better guard: a sigma from 5 nights is worth 2 d.o.f., and the threshold with it (14
    times the change's sd) missed a +520% step at 9% noise 1 time in 4."""
    once = bool(previous.get("detail", {}).get("doubt_once"))
    spread = base.spread_before if once else base.spread
    return (base.nights >= policy.doubt_nights and change >= math.log1p(policy.large_step)
            and change >= policy.doubt_spread * spread and change >= base.doubt_floor)


def _learning(change: float, base: Reference, prior: int, previous: dict,
              policy: Policy) -> tuple[str, int]:
    """Too few nights to know the noise: only a change beyond doubt two nights in a row is
    flagged (a `regression`); one such night is still `learning` (detail `doubt_once`)."""
    again = prior or previous.get("detail", {}).get("doubt_once")
    if again and _beyond_doubt(change, base, previous, policy):
        return "regression", max(prior, 1) + 1
    return "learning", 0


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


def _too_noisy(metric: str, mde: float, base: Reference, policy: Policy) -> str | None:
    effect = policy.effect(metric)
    if mde <= policy.too_noisy_above(metric):
        return None
    return (f"too noisy to guard: night-to-night noise {100 * base.noise.sigma:.1f}% over "
            f"{base.nights} nights, so the smallest step caught within two nights is "
            f"{100 * math.expm1(mde):.0f}%, above {policy.too_noisy:g}x the "
            f"{100 * effect:.0f}% that matters")


def _off_pace_verdict(stage_id: str, metric: str, value: float, history: list[dict],
                      release: dict | None, kind: str, pace: float | None,
                      policy: Policy) -> Verdict | None:
    """`no_baseline`, saying why, for a metric gated by the host's pace when tonight's host
    (or the release night's, against a release) ran off the usual pace of `history`."""
    gate = METRICS[metric].gated_by
    usual = usual_pace(history, gate, policy) if gate else None
    for night, its_pace in (("tonight", pace),
                            ("on the release night",
                             (release or {}).get("metrics", {}).get(gate))):
        off = off_pace(its_pace, usual, policy)
        if off is not None:
            median = its_pace / math.exp(off)
            return Verdict(stage_id, metric, "no_baseline", value, None, None, None, {
                "history": len(_usable(metric, history, policy)), "baseline": kind,
                "off_pace_pct": round(100 * math.expm1(off), 1), "note": (
                    f"not judged: {night} the host ran {abs(math.expm1(off)):.0%} "
                    f"{'slower' if off > 0 else 'faster'} than on its usual nights "
                    f"({gate} {its_pace:.4g} against their median {median:.4g})")})
    return None


def _combinable(metric: str, base: Reference, release: dict | None) -> bool:
    """Tonight's change may be judged across stages: the metric is a figure of the broker
    judged at its covariate (as measured the host's pace moves every stage at once, which
    the covariate takes out) against a baseline of this fingerprint."""
    return (METRICS[metric].across_stages and base.fit is not None
            and (release or {}).get("fingerprint_matches") is not False)


def compare_metric(stage_id: str, metric: str, value: float | None, history: list[dict],
                   policy: Policy, *, previous: dict | None = None,
                   release: dict | None = None, run_id: str | None = None,
                   peers: Peers | None = None, covariate: float | None = None,
                   pace: float | None = None) -> Verdict | None:
    """One metric's verdict. `previous`: the last comparable night's verdict of this stage
    and metric ({"verdict", "detail"}), which tonight confirms or clears; `peers`: the
    metric's noise pooled over the run's other stages on this fingerprint; `covariate`:
    tonight's value of the metric's covariate (`MetricDef.adjusted_by`), if it has one;
    `pace`: tonight's value of the host pace it is gated by (`MetricDef.gated_by`)."""
    if value is None:
        return None
    kind = f"release:{release.get('label')}" if release else "rolling"
    off_pace_verdict = _off_pace_verdict(stage_id, metric, value, history, release, kind,
                                         pace, policy)
    if off_pace_verdict is not None:
        return off_pace_verdict
    base = baseline_for(metric, history, release, policy, peers, covariate)
    if base is None:
        return Verdict(stage_id, metric, "no_baseline", value, None, None, None,
                       {"history": 0, "baseline": kind})
    baseline_value = math.exp(base.centre)
    if value <= 0:
        return Verdict(stage_id, metric, "no_baseline", value, baseline_value, None, None,
                       {"history": base.nights, "baseline": kind, "note": "zero: not judged"})
    change = math.log(value) - base.centre
    worse = -change if METRICS[metric].better == "higher" else change
    level = policy.level(metric)
    tonight = score(worse, base.pred_sd, base.noise.dof,
                    policy.level(metric, worse=worse >= 0), policy)
    floor = policy.floor(metric)
    verdict, nights = _decide(worse, tonight, base, floor, previous, policy)
    learning = base.nights < policy.min_history
    detail: dict[str, Any] = {
        "baseline": kind, "history": base.nights, "nights": nights,
        "noise_pct": round(100 * base.noise.sigma, 3), "noise_stages": base.noise.stages,
        "floor_pct": round(100 * math.expm1(floor), 2),
    }
    if base.fit is not None:
        detail["adjusted"] = {"by": METRICS[metric].adjusted_by,
                              "slope": round(base.fit.slope, 3)}
    if learning:
        detail["note"] = f"learning: {base.nights} of {policy.min_history} nights"
        detail["doubt_once"] = (verdict == "learning"
                                 and _beyond_doubt(worse, base, previous or {}, policy))
        if detail["doubt_once"]:
            detail["note"] += "; tonight's change is beyond doubt: a second such night is a regression"
    else:
        detail["score"] = round(tonight, 3)
        if _combinable(metric, base, release):  # what `tasks.analysis.across` combines
            detail["evidence"] = {"change": round(worse, 6), "sd": round(base.pred_sd, 6),
                                  "dof": round(base.noise.dof, 1)}
        mde = minimum_detectable(base.pred_sd, base.noise.dof, level, floor, policy)
        detail["mde_pct"] = round(100 * math.expm1(mde), 2)
        warning = _too_noisy(metric, mde, base, policy)
        if warning:
            detail["too_noisy"] = warning
    detail["hold"] = verdict in FLAGGED
    if release is not None:
        detail["baseline_run"] = release.get("run_id")
        if release.get("fingerprint_matches") is False:
            detail["fingerprint"] = "differs from the release baseline's"
    if verdict in FLAGGED:
        detail["change_point"] = _shift(metric, history, value, run_id, base.fit, covariate,
                                        policy)
    return Verdict(stage_id, metric, verdict, value, baseline_value,
                   round(100 * (value / baseline_value - 1), 3),
                   None if learning else confidence(worse, base.pred_sd, base.noise.dof, policy),
                   detail)


def compare_stage(stage_id: str, metrics: dict, validity: str, history: list[dict],
                  policy: Policy = Policy(), *, previous: dict[str, dict] | None = None,
                  release: dict | None = None, run_id: str | None = None,
                  new_history: str | None = None,
                  peers: dict[str, Peers] | None = None) -> list[Verdict]:
    """Verdicts for one stage.

    history: earlier comparable nights, newest first, each {"run_id", "metrics",
    "held_out"}; previous: metric -> the last comparable night's verdict dict; release: the
    pinned release run's stage ({"label", "run_id", "metrics"}) for a release run;
    new_history: why the history is empty (e.g. a changed fingerprint), said in the
    no-baseline verdicts; peers: metric -> its noise pooled over the run's other stages on
    this fingerprint (`peer_noise`).
    """
    names = [m for m in judged_metrics(policy) if metrics.get(m) is not None]
    if validity != "valid":
        return [Verdict(stage_id, m, "invalid", metrics[m], None, None, None, {}) for m in names]
    out = []
    for m in names:
        by, gate = METRICS[m].adjusted_by, METRICS[m].gated_by
        v = compare_metric(stage_id, m, metrics[m], history, policy,
                           previous=(previous or {}).get(m), release=release, run_id=run_id,
                           peers=(peers or {}).get(m), covariate=metrics.get(by) if by else None,
                           pace=metrics.get(gate) if gate else None)
        if v is not None and v.verdict == "no_baseline" and new_history:
            v.detail["new_history"] = new_history
        if v is not None:
            out.append(v)
    return out

"""Regression verdicts: pure functions, data in, verdicts out.

The rules are told here whole; this module decides the verdicts (`compare_stage`,
`compare_metric`) with its parts beside it: `policy` (the settings), `nights` (which
earlier nights a metric is judged on: held out, the host's gates, the covariate), `noise`
(their noise, pooled over the run's stages by how likely they share it) and `thresholds`
(what a change over its sd means under no change); `across` judges the broker's own
figures across the run's stages after this module.

Like with like: the caller passes only earlier nights of the same stage key (scenario,
stage, broker) on the same fingerprint. For each judged metric (`tasks.metrics`: a
better-direction and a minimum practical effect) of a valid stage:

- **Baseline.** Rolling: the median of the newest `Policy.window` earlier nights since the
  last accepted change, without the values the store holds out (flagged nights that no
  human accepted or called a false positive and no next night cleared). Release: the
  pinned release run's value, with the noise still measured on the rolling history.
- **Noise.** Changes are log ratios. A history's noise sigma is the Student t maximum-
  likelihood scale of its nights' logs (`noise.t_scale`, in the units of the robust sigma,
  1.4826 x MAD, that `bench/measure_noise.py` measures), worth 0.49 (n - 1) degrees of
  freedom on t3 noise against the MAD's 0.30 (`bench/bench_detector.py` measures both).
  Twenty nights still pin a sigma down only to about +-23%, and that costs a detector
  much of its power. So the noise is pooled over the
  other stages of the run that share this stage's fingerprint and are past learning
  (`noise.pooled_noise`), weighted by their degrees of freedom, with this stage's own; the
  peers' degrees of freedom count by how likely it is that this stage shares their noise
  rather than being `Policy.pool_guard` times as noisy (`noise.peer_weight`: the two
  hypotheses' F densities at the ratio of its variance over theirs, `Policy.pool_prior` on
  sharing), so a stage much noisier than its peers borrows next to nothing of their quieter
  noise. An F test at 0.25 that pooled or not (until 2026-12-03) kept 1 like stage in 4 on
  its own 20 nights; at the prior of 0.1 the weight takes the bench's cells at 80% of the
  bound from 19 to 21 of 31 (the same draws, 200 series a cell: two cells within their
  draws of the line), and the mixed suite's false alarms from 0.46 to 0.50 per 100 on
  average over three sets of draws, its worst metric from 0.77 to 0.90 (a prior of 0.2
  caught 1 to 7 points more than the F test in the short cells, 1.2 to 3.5 more than 0.1,
  and took the mixed suite's worst to the bar; bench/README.md, "Peers' nights by weight"
  and the full bench after it). Nor does a stage pool before its own
  nights can show it is noisier: with 8 nights an F test at `pool_level` misses a stage
  twice as noisy as its 3 peers 1 time in 5, and each miss lends it a sigma about 0.55 of
  its own; so a stage pools only once the test would catch that 9 times in 10
  (`pool_power`, `pool_guard`: 14 nights beside 3 peers with as many, 13 beside peers
  with 30). In the bench's mixed suite (one stage of 4 twice as
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
  way (`noise.Peers.adjusted`); a learning stage and its doubt floor use the values as they are.
- **Host pace, host steal.** A metric gated by figures of its host (`MetricDef.gated_by`,
  `tasks.analysis.host_gates`: the latency metrics by `host_pace_us` and
  `host_steal_pct`, the broker's CPU a message and `max_rate` by the steal) is not judged
  on a night whose host ran more than `Policy.pace_gate` off its usual pace (the median
  of the newest `window` nights', once `min_history` have one), or whose hypervisor took
  more than `Policy.steal_gate` points of a core above its usual steal (their median,
  once a night has one), or against a release whose night did (with too few nights for a
  usual, each of the two nights against the other): `no_baseline`, with the reason; and
  such nights stay out of its baseline, noise and change point (`nights.at_usual`: a
  stage whose usual nights are fewer than `min_history` is learning again). Two nights
  of the slowdown test whose host lost 47% and 58% of a core (0-15% on the other nights)
  cost the broker 2.4x its CPU a message. On this machine's real nights (bench/README.md,
  real_nights.py) every false change verdict of 20 unchanged nights fell on a night off
  the usual pace: the host 27% to 62% slower, e2e p50 up 18% to 37%, more than the
  driver's CPU it is judged at explains (along a slope fitted on usual nights, where the
  driver's own noise flattens it); on 20 nights after, the pace gate took the change
  verdicts from 11 (1 regression) to 5 suspected.
- **Bad nights.** The nights' noise is taken to be a Student t with `Policy.tail_dof`
  degrees of freedom (heavy tails: the sd of the machine's latency and CPU figures is 1.2
  to 2.4 times their robust sigma), and the sigma an estimate with the d.o.f. above. A night
  is bad when its change reaches the threshold at which two given nights judged against
  the same estimated sigma are both bad with probability `Policy.level` under no
  change (`thresholds.bad_threshold`; a shared sigma that came out too small makes both bad at once,
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
  other stages on this fingerprint with at least `noise.PEER_NIGHTS` nights, learning or not),
  two nights in a row, is a `regression`, and stays one while the change lasts. One such
  night is still `learning`, its detail says so. A stage without peers has the swing
  alone: five nights that swing little by chance say nothing of the noise, and no
  threshold from them would either (`_beyond_doubt`).
- **What it can see.** Each verdict past learning carries the metric's minimum detectable
  effect (`mde_pct`): the smallest step these rules catch within two nights with 90%
  probability at the noise in use. Above `too_noisy` x the minimum practical effect the
  detail says the metric is too noisy to guard, and why.
- **What stopped a capacity.** A `max_rate` whose broker and host had CPU to spare at the
  rate that held says so, whatever its verdict (`cpu_to_spare`, `tasks.analysis.capacity`):
  the limit was something else that night.
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
from dataclasses import asdict, dataclass
from typing import Any

from ..metrics import FLAGGED, METRICS, against_release
from .capacity import cpu_to_spare
from .changepoint import change_points
from .covariate import Fit, log_of
from .host_gates import GATES, USUAL_NIGHTS
from .nights import at_usual, judged_logs, usable_nights
from .noise import Noise, Peers, noise_of, pooled_with_peers
from .policy import Policy, judged_metrics
from .thresholds import (
    bad_threshold,
    confidence,
    minimum_detectable,
    null_quantile,
    score,
)

_Z95 = 1.6448536269514722  # one-sided 95% normal quantile


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
    noise: Noise
    pred_sd: float  # sd of tonight's log change under no change
    nights: int  # own baseline nights
    spread: float  # the widest deviation of a baseline night from the baseline median
    spread_before: float  # the same without the newest night
    doubt_floor: float  # while learning: the two-night threshold with the peers' noise
    fit: Fit | None = None  # the nights on their covariate, when judged at tonight's value


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
    logs, fitted = judged_logs(metric, history, policy,
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
    own = noise_of(logs, policy, int(fitted is not None)) if n else Noise(0.0, 1.0)
    learning = n < policy.min_history
    pool = (peers.judged if fitted is None else peers.adjusted) if peers else None
    noise = own if learning else pooled_with_peers(own, pool, policy)
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


def _shift(metric: str, history: list[dict], value: float, run_id: str | None,
           fitted: Fit | None, covariate: float | None, policy: Policy) -> dict | None:
    """Where the latest level shift began, over every recent value (held-out ones too, not
    those of a night its host was off its usual, for a metric gated by it); when the metric
    is judged at its covariate (`fitted`), over the nights that have it, each moved along
    the slope as the judged ones are (a shift of the host's pace alone is no shift of the
    metric)."""
    by = METRICS[metric].adjusted_by
    recorded = [h for h in reversed(history) if (h["metrics"].get(metric) or 0) > 0
                and (fitted is None or log_of(h["metrics"].get(by)) is not None)]
    past = at_usual(metric, recorded, history, policy)
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

    Five nights of t3 noise sometimes swing little by chance, and then tell nothing of the
    metric's noise: the peers' nights, on this fingerprint, do. Their own noise is no
    better guard: a sigma from 5 nights is worth 2 d.o.f., and the threshold with it (14
    times the change's sd) missed a +520% step at 9% noise 1 time in 4.
    After a night that was, and after the regression that confirmed it (whose nights the
    store holds out, so the newest baseline night is still that first one), the spread
    leaves that night out: it would widen the spread by the step itself, and a step that
    lasts would read `learning` the night after it was confirmed, closing its alert."""
    before = previous.get("detail", {}).get("doubt_once") or previous.get("verdict") in FLAGGED
    spread = base.spread_before if before else base.spread
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


def step_pct(metric: str, step: float) -> float:
    """A log step in the metric's worse direction as the % its value moves: a rise of a
    lower-is-better metric (latency, cost), a drop of a higher-is-better one (a rate), so
    an MDE or a floor reads as the change a person would see (a log step of 0.2 is a
    22.1% rise, an 18.1% drop)."""
    return 100 * (math.expm1(step) if METRICS[metric].better == "lower" else -math.expm1(-step))


def _too_noisy(metric: str, mde: float, base: Reference, policy: Policy) -> str | None:
    effect = policy.effect(metric)
    if mde <= policy.too_noisy_above(metric):
        return None
    peers = (f" (pooled with {base.noise.stages - 1} other stages', their nights weighted "
             f"{base.noise.peers_weight:.2f})" if base.noise.stages > 1 else "")
    return (f"too noisy to guard: night-to-night noise {100 * base.noise.sigma:.1f}% over "
            f"{base.nights} nights{peers}, so the smallest step caught within two nights is "
            f"{step_pct(metric, mde):.0f}%, above {policy.too_noisy:g}x the "
            f"{100 * effect:.0f}% that matters")


def _gated_verdict(stage_id: str, metric: str, value: float, history: list[dict],
                   release: dict | None, kind: str, host: dict[str, float | None],
                   policy: Policy) -> Verdict | None:
    """`no_baseline`, saying why, for a metric gated by figures of its host
    (`MetricDef.gated_by`) when tonight's host (or the release night's, against a release)
    was far off its usual by one of them (`tasks.analysis.host_gates`); against a release
    with too few nights for a usual, far off the other night compared."""
    for figure in METRICS[metric].gated_by:
        gate = GATES[figure]
        usual = gate.usual(history, policy)
        tonight = host.get(figure)
        pinned = (release or {}).get("metrics", {}).get(figure)
        against = USUAL_NIGHTS if usual is not None else "on the night it is compared with"
        for night, its_value, other in (("tonight", tonight, pinned),
                                        ("on the release night", pinned, tonight)):
            base = usual if usual is not None or release is None else gate.scale(other)
            off = gate.off(its_value, base, policy)
            if off is not None:
                return Verdict(stage_id, metric, "no_baseline", value, None, None, None, {
                    "history": len(usable_nights(metric, history, policy)), "baseline": kind,
                    **gate.gated(night, its_value, off, against)})
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
                   host: dict[str, float | None] | None = None) -> Verdict | None:
    """One metric's verdict. `previous`: the last comparable night's verdict of this stage
    and metric ({"verdict", "detail"}), which tonight confirms or clears; `peers`: the
    metric's noise pooled over the run's other stages on this fingerprint; `covariate`:
    tonight's value of the metric's covariate (`MetricDef.adjusted_by`), if it has one;
    `host`: tonight's values of the host's figures it is gated by (`MetricDef.gated_by`)."""
    if value is None:
        return None
    kind = against_release(release.get("label")) if release else "rolling"
    gated = _gated_verdict(stage_id, metric, value, history, release, kind, host or {}, policy)
    if gated is not None:
        return gated
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
        "noise_peers_weight": round(base.noise.peers_weight, 2),
        "floor_pct": round(step_pct(metric, floor), 2),
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
        detail["mde_pct"] = round(step_pct(metric, mde), 2)
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
    this fingerprint (`noise.pooled_noise`).
    """
    names = [m for m in judged_metrics(policy) if metrics.get(m) is not None]
    if validity != "valid":
        return [Verdict(stage_id, m, "invalid", metrics[m], None, None, None, {}) for m in names]
    out = []
    for m in names:
        by = METRICS[m].adjusted_by
        v = compare_metric(stage_id, m, metrics[m], history, policy,
                           previous=(previous or {}).get(m), release=release, run_id=run_id,
                           peers=(peers or {}).get(m), covariate=metrics.get(by) if by else None,
                           host={gate: metrics.get(gate) for gate in METRICS[m].gated_by})
        if v is not None and v.verdict == "no_baseline" and new_history:
            v.detail["new_history"] = new_history
        if v is not None and m == "max_rate" and (spare := cpu_to_spare(metrics)):
            v.detail["cpu_to_spare"] = spare  # what the limit was not, said beside the verdict
        if v is not None:
            out.append(v)
    return out

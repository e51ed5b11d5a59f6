"""A figure of the broker itself judged across the run's stages: pure.

A broker that spends more CPU a message does so on every stage it serves, and a stage
alone sees such a change only through its own nights' noise. On this machine's real
nights of the smoke suite the broker's cost, at the driver's CPU, moved independently
from stage to stage (bench/README.md, real_nights.py: rank correlations of the stages'
changes as judged, -0.14 to +0.03 over 32 nights past learning). So for a metric that
declares `MetricDef.across_stages`, the stages of a run that share a known fingerprint
(the same broker on the same hosts) and were judged at their covariate against a
baseline of that fingerprint (the detector's detail `evidence`: the host's pace, common
to every stage, taken out) are also judged together:

- **Tonight's change across them** is the inverse-variance weighted mean of each stage's
  change against its own baseline (the change in the worse direction, its sd under no
  change and the d.o.f. of its sigma, as `tasks.analysis.detector` judged it), with sd
  1 / sqrt(sum 1 / sd^2). It is a change of the broker only when it is broad: with 3
  stages or more, the stages but the one whose change is most beyond its sd must have
  risen too (their own combination beyond its sd at one-sided 95%), so one stage's own
  regression is not spread over its siblings.
  (Cochran's Q was tried instead and dropped: the real changes of the burn plugin differ
  from stage to stage, and the stages' sds run about 1.2x small on real nights, so Q at
  0.01 refused a broker made 4.7% costlier on every stage; bench/README.md.)
- **A bad night across the stages** is one whose change reaches the two-night threshold
  at `Policy.across_level` and at least the effect floor; for a stage, also its own change
  reaches the floor (`across.bad` in its detail). The threshold takes the smallest d.o.f.
  of the stages' sigmas and the nights' t law: a weighted mean of several nights' t3
  noise has lighter tails than one night's, so this errs towards silence.
- **Verdicts.** A stage's `unchanged` night that was bad across the stages is
  `suspected`; a second such night in a row a `regression`, also over an own `suspected`
  (`detector.prior_nights`: two bad nights of one test, not one of each, so this test
  spends `across_level` and the stage's own the rest; detail `across.flagged` says the
  stages decided), its confidence is theirs (the test that set it) and its change point
  the first of the nights they flagged (`nights_ago`, their change). Its value is held
  out of later baselines like any flagged one. Every other verdict is left as judged: an
  own `regression` is evidence enough, an `improvement` moved the other way. Only the
  worse direction is tested across stages (so a stage's own test keeps the whole level in
  the better one: `Policy.level`).
- **What it can see.** Every combined stage's detail `across` carries the combination's
  change, sd, stages and MDE (`mde_pct`: the smallest step on every stage caught within
  two nights with 90% probability), beside the stage's own MDE. A stage whose own MDE is
  too noisy to guard while the stages' is not says so in its warning: a change of the
  broker on every stage is still guarded, one stage's own is not.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..metrics import METRICS, flagged_across
from .detector import Verdict, prior_nights, step_pct
from .policy import Policy
from .thresholds import confidence, minimum_detectable, score

MIN_STAGES = 2  # stages judged together: one alone is its own test
BROAD_STAGES = 3  # from this many, the others must rise too without the largest stage ...
BROAD_Z = 1.6448536269514722  # ... beyond their sd at one-sided 95%


@dataclass(frozen=True)
class Combined:
    """Tonight's change of one metric across the stages of one fingerprint."""

    metric: str
    change: float  # log, in the worse direction
    sd: float  # its sd under no change
    dof: float  # what its sigma is worth (the smallest of the stages')
    stages: int
    score: float  # the change over the bad-night threshold: 1 or more is bad
    mde: float  # log: the smallest step on every stage caught within two nights
    floor: float  # log: the effect floor a bad night must also reach
    # the others rose too without the stage that moved most: not one stage's change
    # spread over all
    broad: bool = True

    @property
    def bad(self) -> bool:
        return self.broad and self.score >= 1 and self.change >= self.floor

    def bad_for(self, evidence: dict) -> bool:
        """A bad night across the stages for a stage whose own change reached the floor."""
        return self.bad and evidence["change"] >= self.floor

    def detail(self, *, bad: bool, flagged: bool = False) -> dict:
        """What a stage's verdict carries of it: `bad`, for this stage; `flagged`, the
        stages together set its verdict."""
        return {"stages": self.stages,
                "change_pct": round(step_pct(self.metric, self.change), 2),
                "sd_pct": round(100 * self.sd, 3), "score": round(self.score, 3),
                "mde_pct": round(step_pct(self.metric, self.mde), 2), "broad": self.broad,
                "bad": bad, "flagged": flagged}


def usable(evidence: list[dict]) -> list[dict]:
    return [e for e in evidence if e["sd"] > 0]


def _weighted(metric: str, kept: list[dict], policy: Policy) -> Combined:
    weights = [1 / e["sd"] ** 2 for e in kept]
    change = sum(w * e["change"] for w, e in zip(weights, kept)) / sum(weights)
    sd, dof = 1 / math.sqrt(sum(weights)), min(e["dof"] for e in kept)
    floor = policy.floor(metric)
    return Combined(metric, change, sd, dof, len(kept),
                    score(change, sd, dof, policy.across_level, policy),
                    minimum_detectable(sd, dof, policy.across_level, floor, policy), floor)


def combine(metric: str, evidence: list[dict], policy: Policy) -> Combined | None:
    """The stages' changes of `metric` pooled ({"change", "sd", "dof"} each, the change in
    the worse direction), or None with fewer than `MIN_STAGES` that have an sd. With
    `BROAD_STAGES` or more, it is `broad` when the stages but the one whose change is
    most beyond its sd rose too, together beyond their sd at one-sided 95%."""
    kept = usable(evidence)
    if len(kept) < MIN_STAGES:
        return None
    pooled = _weighted(metric, kept, policy)
    if len(kept) < BROAD_STAGES or not pooled.bad:
        return pooled
    most = max(kept, key=lambda e: e["change"] / e["sd"])
    rest = _weighted(metric, [e for e in kept if e is not most], policy)
    return replace(pooled, broad=rest.change >= BROAD_Z * rest.sd)


def _seen_together(verdict: Verdict, combined: Combined, policy: Policy) -> dict:
    """A too-noisy warning that says what the stages together still see, when their MDE
    is within the limit (a step of the broker on every stage is guarded; one stage's own
    step is not)."""
    warning = verdict.detail.get("too_noisy")
    if not warning or combined.mde > policy.too_noisy_above(verdict.metric):
        return {}
    return {"too_noisy": f"{warning}; a step on all {combined.stages} stages at once is "
                         f"caught from {step_pct(verdict.metric, combined.mde):.1f}%"}


def _began(previous: dict | None, prior: int, run_id: str | None) -> str | None:
    """The run of the first of the nights the stages flagged: tonight's (`run_id`) on the
    first; after that, where the previous flagged night said it began, or that night."""
    before = previous or {}
    if not prior:
        return run_id
    detail = before.get("detail") or {}
    if flagged_across(detail) and (detail.get("change_point") or {}).get("run_id"):
        return detail["change_point"]["run_id"]
    return before.get("run_id")


def _revised(verdict: Verdict, combined: Combined, previous: dict | None,
             policy: Policy, run_id: str | None) -> Verdict:
    """A combined stage's verdict with what the stages together say of it. A verdict they
    flag takes their confidence (theirs is the test that set it) and a change point: the
    first of the nights they flagged."""
    bad = combined.bad_for(verdict.detail["evidence"])
    prior = prior_nights(previous, across=True) if bad else 0
    flag = bad and (verdict.verdict == "unchanged"
                    or (verdict.verdict == "suspected" and prior > 0))
    seen = _seen_together(verdict, combined, policy)
    if not flag:
        return replace(verdict, detail={**verdict.detail, **seen,
                                        "across": combined.detail(bad=bad)})
    across = combined.detail(bad=True, flagged=True)
    began = {"run_id": _began(previous, prior, run_id), "nights_ago": prior,
             "shift_pct": across["change_pct"]}
    detail = {**verdict.detail, **seen, "nights": prior + 1, "hold": True, "across": across,
              "change_point": began}
    return replace(verdict, verdict="regression" if prior else "suspected", detail=detail,
                   confidence=confidence(combined.change, combined.sd, combined.dof, policy))


def combinable(verdicts: list[list[Verdict]], fingerprints: list[str | None]
               ) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(fingerprint, metric) -> the (stage, verdict) positions judged together: verdicts of
    a metric judged across stages that carry the detector's `evidence` with an sd, on a
    known fingerprint shared by `MIN_STAGES` or more of them."""
    groups: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for i, (stage, fp) in enumerate(zip(verdicts, fingerprints)):
        for j, v in enumerate(stage):
            if (fp is not None and METRICS[v.metric].across_stages
                    and (v.detail.get("evidence") or {}).get("sd", 0) > 0):
                groups[(fp, v.metric)].append((i, j))
    return {k: members for k, members in groups.items() if len(members) >= MIN_STAGES}


def judge_across(verdicts: list[list[Verdict]],
                 groups: dict[tuple[str, str], list[tuple[int, int]]],
                 previous: list[dict[str, dict]], policy: Policy,
                 run_id: str | None) -> list[list[Verdict]]:
    """Each stage's verdicts (as `compare_stage` gave them) with every metric that is judged
    across stages judged so in each of `groups` (`combinable`); `previous`: per stage,
    metric -> its last comparable verdict ({"run_id", "verdict", "detail"}); `run_id`:
    tonight's run."""
    out = [list(stage) for stage in verdicts]
    for (_, metric), members in groups.items():
        combined = combine(metric, [verdicts[i][j].detail["evidence"] for i, j in members],
                           policy)
        if combined is None:  # cannot be: combinable keeps MIN_STAGES with an sd
            continue
        for i, j in members:
            out[i][j] = _revised(verdicts[i][j], combined, previous[i].get(metric), policy,
                                 run_id)
    return out


def _alone(verdicts: list[list[Verdict]], groups: dict[tuple[str, str], list[tuple[int, int]]]
           ) -> dict[int, set[str]]:
    """stage -> the metrics judged across stages that it judged past learning (the verdict
    has a `score`) but in none of `groups` (`combinable`): no evidence (not judged at its
    covariate, a release of another fingerprint), no known fingerprint, or none other on
    it with evidence."""
    together = {(i, verdicts[i][j].metric) for members in groups.values()
                for i, j in members}
    out: dict[int, set[str]] = defaultdict(set)
    for i, stage in enumerate(verdicts):
        for v in stage:
            if (METRICS[v.metric].across_stages and "score" in v.detail
                    and (i, v.metric) not in together):
                out[i].add(v.metric)
    return out


def judge_stages(judge: Callable[[int, Policy], list[Verdict]],
                 fingerprints: list[str | None], previous: list[dict[str, dict]],
                 policy: Policy, run_id: str | None = None) -> list[list[Verdict]]:
    """Every stage's verdicts, `judge(i, policy)` giving stage i's own (`compare_stage`),
    then across the stages (`judge_across`; `run_id`: tonight's run). A stage's own test
    of a metric judged across stages spends `Policy.level`, the rest is the test across
    them; where tonight no other stage can be judged with it (a stage alone on its
    fingerprint or on none known, a cost not judged at its covariate, its partners still
    learning, a release of another fingerprint), the metric is judged again with the whole
    level (`across_level` 0), so no level is set aside for a test that cannot run."""
    verdicts = [judge(i, policy) for i in range(len(fingerprints))]
    if policy.across_level <= 0:
        return verdicts
    groups = combinable(verdicts, fingerprints)  # the same after the metrics judged again:
    whole = replace(policy, across_level=0.0)  # their evidence is the same nights'
    for i, metrics in _alone(verdicts, groups).items():
        again = {v.metric: v for v in judge(i, whole) if v.metric in metrics}
        verdicts[i] = [again.get(v.metric, v) for v in verdicts[i]]
    return judge_across(verdicts, groups, previous, policy, run_id)

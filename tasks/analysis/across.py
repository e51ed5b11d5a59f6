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
  stages decided). Its value is held out of later baselines like any flagged one. Every
  other verdict is left as judged: an own `regression` is evidence enough, an
  `improvement` moved the other way. Only the worse direction is tested across stages.
- **What it can see.** Every combined stage's detail `across` carries the combination's
  change, sd, stages and MDE (`mde_pct`: the smallest step on every stage caught within
  two nights with 90% probability), beside the stage's own MDE.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from ..metrics import METRICS
from .detector import Policy, Verdict, minimum_detectable, prior_nights, score

MIN_STAGES = 2  # stages judged together: one alone is its own test
BROAD_STAGES = 3  # from this many, the others must rise too without the largest stage ...
BROAD_Z = 1.6448536269514722  # ... beyond their sd at one-sided 95%


@dataclass(frozen=True)
class Combined:
    """Tonight's change of one metric across the stages of one fingerprint."""

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
        return {"stages": self.stages, "change_pct": round(100 * math.expm1(self.change), 2),
                "sd_pct": round(100 * self.sd, 3), "score": round(self.score, 3),
                "mde_pct": round(100 * math.expm1(self.mde), 2), "broad": self.broad,
                "bad": bad, "flagged": flagged}


def usable(evidence: list[dict]) -> list[dict]:
    return [e for e in evidence if e["sd"] > 0]


def _pooled(metric: str, kept: list[dict], policy: Policy) -> Combined:
    weights = [1 / e["sd"] ** 2 for e in kept]
    change = sum(w * e["change"] for w, e in zip(weights, kept)) / sum(weights)
    sd, dof = 1 / math.sqrt(sum(weights)), min(e["dof"] for e in kept)
    floor = policy.floor(metric)
    return Combined(change, sd, dof, len(kept),
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
    pooled = _pooled(metric, kept, policy)
    if len(kept) < BROAD_STAGES or not pooled.bad:
        return pooled
    most = max(kept, key=lambda e: e["change"] / e["sd"])
    rest = _pooled(metric, [e for e in kept if e is not most], policy)
    return replace(pooled, broad=rest.change >= BROAD_Z * rest.sd)


def _revised(verdict: Verdict, combined: Combined, previous: dict | None) -> Verdict:
    """A combined stage's verdict with what the stages together say of it."""
    bad = combined.bad_for(verdict.detail["evidence"])
    prior = prior_nights(previous, across=True) if bad else 0
    flag = bad and (verdict.verdict == "unchanged"
                    or (verdict.verdict == "suspected" and prior > 0))
    if not flag:
        return replace(verdict, detail={**verdict.detail, "across": combined.detail(bad=bad)})
    detail = {**verdict.detail, "nights": prior + 1, "hold": True,
              "across": combined.detail(bad=True, flagged=True)}
    return replace(verdict, verdict="regression" if prior else "suspected", detail=detail)


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


def judge_across(verdicts: list[list[Verdict]], fingerprints: list[str | None],
                 previous: list[dict[str, dict]], policy: Policy) -> list[list[Verdict]]:
    """Each stage's verdicts (as `compare_stage` gave them, in the order of `fingerprints`,
    the stages' fingerprint hashes) with every metric that is judged across stages judged
    so on each fingerprint; `previous`: per stage, metric -> its last comparable verdict.
    With `Policy.across_level` 0 there is no such test: the verdicts are returned as given."""
    if policy.across_level <= 0:
        return verdicts
    out = [list(stage) for stage in verdicts]
    for (_, metric), members in combinable(verdicts, fingerprints).items():
        combined = combine(metric, [verdicts[i][j].detail["evidence"] for i, j in members],
                           policy)
        if combined is None:
            continue
        for i, j in members:
            out[i][j] = _revised(verdicts[i][j], combined, previous[i].get(metric))
    return out


def shares_a_fingerprint(stages: list[dict]) -> set[str]:
    """The fingerprints on which `MIN_STAGES` or more of a run's valid stages ran: only
    there can a metric be judged across stages (elsewhere a stage's own test keeps the
    whole budget)."""
    count = Counter(s["fingerprint_hash"] for s in stages
                    if s.get("validity") == "valid" and s.get("fingerprint_hash") is not None)
    return {fp for fp, n in count.items() if n >= MIN_STAGES}

"""The detector's policy: its false-alarm levels, effect floors, learning and pooling rules
(`Policy`), and which metrics it judges. Pure; what each setting does is told in
`tasks.analysis.detector`'s docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..metrics import METRICS


@dataclass(frozen=True)
class Policy:
    false_alarm_level: float = 3e-4  # two given nights both bad under no change: this unlikely
    tail_dof: float = 3.0  # the nights' noise law: Student t with this many d.o.f.
    min_history: int = 8  # own baseline nights before judging: learning before
    window: int = 30  # newest baseline nights used
    pool_prior: float = 0.1  # a stage shares its peers' noise, against `pool_guard` x it
    pool_guard: float = 2.0  # ... times as noisy as its peers (in sigma), prior weights
    pool_level: float = 0.25  # pooled only once a one-sided F test at this level
    pool_power: float = 0.9  # ... would see a stage `pool_guard` x as noisy this often
    effect_floor: float = 0.3  # never flag a change below this fraction of the min effect
    large_step: float = 0.15  # confirmed at once when plausibly at least this large ...
    large_level: float = 4e-5  # ... and one night alone this unlikely under no change
    large_history: int = 10  # ... measured over at least this many nights
    doubt_spread: float = 5.0  # learning: flagged beyond this x the history's widest swing
    doubt_nights: int = 5  # ... shown by at least this many nights
    doubt_level: float = 4e-5  # ... and two nights beyond the peers' noise this unlikely
    too_noisy: float = 3.0  # warn when the MDE is above this x the minimum effect
    pace_gate: float = 0.2  # a pace-gated metric is not judged on a host this much off its pace
    steal_gate: float = 20.0  # a steal-gated one, on a host whose steal is this many % of a
    # core above its usual (`tasks.analysis.host_gates`)
    across_level: float = 1e-4  # a metric judged across stages too: that test's share of
    # false_alarm_level (its own nights' test has the rest: `tasks.analysis.across`)
    min_effect: dict[str, float] = field(default_factory=dict)  # overrides tasks.metrics

    def effect(self, metric: str) -> float:
        return self.min_effect.get(metric, METRICS[metric].min_effect)

    def __post_init__(self) -> None:
        if not 0 <= self.pool_prior <= 1:
            raise ValueError(f"Policy.pool_prior {self.pool_prior:g}: give a weight from 0 "
                             f"(never pool) to 1 (always)")
        if not self.pool_guard > 1:
            raise ValueError(f"Policy.pool_guard {self.pool_guard:g}: give how many times as "
                             f"noisy as its peers (in sigma) a stage must be kept apart, "
                             f"above 1")
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


def judged_metrics(policy: Policy) -> list[str]:
    return [m.name for m in METRICS.values() if m.better != "none" and policy.effect(m.name) > 0]

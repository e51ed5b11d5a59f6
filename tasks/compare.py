"""Regression verdicts: pure functions, data in, verdicts out.

For each judged metric of a valid stage, tonight's value is compared with the history of
the same stage on the same fingerprint:
- the baseline is the median of the history, the noise band 3 robust standard deviations
  (1.4826 x MAD) of the log values, never narrower than the metric's minimum practical
  effect (`tasks.metrics`: 5% for throughput, 10% for latency averages/p50/p99);
- where per-second samples exist (throughput), a Mann-Whitney U test of tonight's samples
  against the baseline runs' samples must also be significant after a Bonferroni
  correction over the metrics judged in the stage.
A worse value beyond the band is `suspected` while the history is shorter than
`Policy.min_history` (its noise is not known yet) and `regression` after that.
Invalid stages are never compared; a stage without history says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from scipy.stats import mannwhitneyu

from .metrics import METRICS

VERDICTS = ("regression", "suspected", "improvement", "unchanged", "no_baseline", "invalid")
SAMPLE_SERIES = {"delivered_rate": "delivered_per_s", "published_rate": "published_per_s"}


@dataclass(frozen=True)
class Policy:
    noise_k: float = 3.0
    alpha: float = 0.05
    min_history: int = 3
    min_effect: dict[str, float] = field(default_factory=dict)  # overrides tasks.metrics

    def effect(self, metric: str) -> float:
        return self.min_effect.get(metric, METRICS[metric].min_effect)


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


def judged_metrics(policy: Policy) -> list[str]:
    return [m.name for m in METRICS.values() if m.better != "none" and policy.effect(m.name) > 0]


def _mad_sigma(values: list[float]) -> float:
    if len(values) < 3:
        return 0.0
    centre = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - centre) for v in values)


def _p_value(metric: str, log_change: float, noise: float, series: dict,
             history: list[dict]) -> float | None:
    name = SAMPLE_SERIES.get(metric)
    tonight = series.get(name, []) if name else []
    before = [x for h in history for x in h.get("series", {}).get(name, [])] if name else []
    if len(tonight) >= 3 and len(before) >= 3:
        return float(mannwhitneyu(tonight, before, alternative="two-sided").pvalue)
    if noise > 0:
        return math.erfc(abs(log_change) / noise / math.sqrt(2))
    return None  # too little history for a test: the effect-size rule decides alone


def compare_metric(stage_id: str, metric: str, value: float | None, history: list[dict],
                   series: dict, policy: Policy, tests: int) -> Verdict | None:
    if value is None:
        return None
    past = [h["metrics"][metric] for h in history if h["metrics"].get(metric) is not None]
    if not past:
        return Verdict(stage_id, metric, "no_baseline", value, None, None, None,
                       {"history": 0})
    baseline = statistics.median(past)
    if baseline <= 0 or value <= 0:
        same = value == baseline
        return Verdict(stage_id, metric, "unchanged" if same else "no_baseline", value, baseline,
                       None, None, {"history": len(past), "note": "zero values: not judged"})
    log_change = math.log(value / baseline)
    noise = _mad_sigma([math.log(v) for v in past if v > 0])
    threshold = max(math.log1p(policy.effect(metric)), policy.noise_k * noise)
    p_value = _p_value(metric, log_change, noise, series, history)
    significant = p_value is None or p_value < policy.alpha / max(tests, 1)
    worse = log_change < 0 if METRICS[metric].better == "higher" else log_change > 0
    if abs(log_change) < threshold or not significant:
        verdict = "unchanged"
    else:
        confirmed = len(past) >= policy.min_history
        verdict = ("regression" if confirmed else "suspected") if worse else "improvement"
    detail = {"history": len(past), "threshold_pct": round(100 * math.expm1(threshold), 2),
              "noise_pct": round(100 * noise, 2), "p_value": p_value, "tests": tests}
    return Verdict(stage_id, metric, verdict, value, baseline,
                   round(100 * (value / baseline - 1), 3),
                   None if p_value is None else round(1 - p_value, 4), detail)


def compare_stage(stage_id: str, metrics: dict, series: dict, validity: str,
                  history: list[dict], policy: Policy = Policy()) -> list[Verdict]:
    """Verdicts for one stage; `history` is newest first, each {"metrics", "series"}."""
    names = [m for m in judged_metrics(policy) if metrics.get(m) is not None]
    if validity != "valid":
        return [Verdict(stage_id, m, "invalid", metrics[m], None, None, None, {}) for m in names]
    verdicts = (compare_metric(stage_id, m, metrics[m], history, series, policy, len(names))
                for m in names)
    return [v for v in verdicts if v is not None]

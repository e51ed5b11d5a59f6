"""Which of a stage's earlier nights a metric is judged on: pure.

Its usable baseline nights (a value, not held out, for a metric gated by the host's pace
on a host at its usual pace: `usable_nights`, `usual_pace`, `off_pace`) and their logs, as
they are or moved along the metric's covariate (`judged_logs`, `tasks.analysis.covariate`).
The rules are `tasks.analysis.detector`'s ("Covariate", "Host pace")."""

from __future__ import annotations

import math
import statistics

from ..metrics import METRICS
from .covariate import Fit, fit, log_of
from .policy import Policy


def usable_nights(metric: str, history: list[dict], policy: Policy) -> list[dict]:
    """The baseline nights of `metric`, newest first: a usable value, not held out, and
    for a metric gated by the host's pace (`MetricDef.gated_by`), on a host at its usual
    pace (`off_pace`)."""
    recorded = [night for night in history if (night["metrics"].get(metric) or 0) > 0
                and metric not in night.get("held_out", ())]
    return at_usual_pace(metric, recorded, history, policy)[:policy.window]


def at_usual_pace(metric: str, nights: list[dict], history: list[dict],
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


def baseline_logs(metric: str, history: list[dict], policy: Policy) -> list[float]:
    """The baseline nights' logs, newest first."""
    return [math.log(night["metrics"][metric]) for night in usable_nights(metric, history, policy)]


def judged_logs(metric: str, history: list[dict], policy: Policy,
                adjust: bool) -> tuple[list[float], Fit | None]:
    """The nights' logs the metric is judged on. With `adjust`, for a metric with a
    covariate (`MetricDef.adjusted_by`) of which at least `min_history` of these nights
    have a value: those nights, each moved along the fitted slope to their median covariate
    (`tasks.analysis.covariate`), and the fit. Else the nights' logs as they are."""
    by = METRICS[metric].adjusted_by
    if adjust and by:
        pairs = [(math.log(night["metrics"][metric]), x)
                 for night in usable_nights(metric, history, policy)
                 if (x := log_of(night["metrics"].get(by))) is not None]
        if len(pairs) >= policy.min_history:
            fitted = fit(pairs)
            return [fitted.adjust(y, x) for y, x in pairs], fitted
    return baseline_logs(metric, history, policy), None

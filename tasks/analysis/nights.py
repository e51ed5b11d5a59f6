"""Which of a stage's earlier nights a metric is judged on: pure.

Its usable baseline nights (a value, not held out, for a metric gated by figures of its
host, on a night the host was its usual self: `usable_nights`, `at_usual`,
`tasks.analysis.host_gates`) and their logs, as they are or moved along the metric's
covariate (`judged_logs`, `tasks.analysis.covariate`). The rules are
`tasks.analysis.detector`'s ("Covariate", "Host pace, host steal")."""

from __future__ import annotations

import math

from ..metrics import METRICS
from .covariate import Fit, fit, log_of
from .host_gates import GATES
from .policy import Policy


def usable_nights(metric: str, history: list[dict], policy: Policy) -> list[dict]:
    """The baseline nights of `metric`, newest first: a usable value, not held out, and
    for a metric gated by figures of its host (`MetricDef.gated_by`), on a night the host
    was its usual self (`at_usual`)."""
    recorded = [night for night in history if (night["metrics"].get(metric) or 0) > 0
                and metric not in night.get("held_out", ())]
    return at_usual(metric, recorded, history, policy)[:policy.window]


def at_usual(metric: str, nights: list[dict], history: list[dict],
             policy: Policy) -> list[dict]:
    """`nights` but those whose host was off its usual (in `history`) by a figure that
    gates the metric (`MetricDef.gated_by`, `tasks.analysis.host_gates`)."""
    for figure in METRICS[metric].gated_by:
        gate = GATES[figure]
        usual = gate.usual(history, policy)
        if usual is not None:
            nights = [night for night in nights
                      if gate.off(night["metrics"].get(figure), usual, policy) is None]
    return nights


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

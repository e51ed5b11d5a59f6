"""The detector on synthetic histories: pure, no store."""

import math
import random

import pytest

from tasks.analysis.changepoint import change_points
from tasks.analysis.detector import (
    Policy,
    compare_stage,
    judged_metrics,
    mann_whitney_p,
)

RATE = "delivered_rate"
P99 = "e2e_latency_p99"


def nights(values, metric=RATE, series=None, held_out=()):
    """History entries, newest first, from values given oldest first."""
    return [{"run_id": f"n{i}", "metrics": {metric: v},
             "series": {"delivered_per_s": series or []},
             "held_out": list(held_out)} for i, v in reversed(list(enumerate(values, 1)))]


def steady(n=12, level=1000.0, cv=0.005, seed=1):
    rng = random.Random(seed)
    return [level * math.exp(rng.gauss(0, cv)) for _ in range(n)]


def verdict(metrics, history, metric=RATE, **kw):
    vs = compare_stage("s", metrics, kw.pop("series", {}), "valid", history, **kw)
    return next(v for v in vs if v.metric == metric)


def test_first_run_has_no_baseline():
    assert verdict({RATE: 1000.0}, []).verdict == "no_baseline"


def test_a_changed_fingerprint_says_why_the_history_is_empty():
    v = verdict({RATE: 1000.0}, [], new_history="fingerprint changed (a -> b)")
    assert v.verdict == "no_baseline" and "fingerprint changed" in v.detail["new_history"]


def test_invalid_stage_is_never_compared():
    vs = compare_stage("s", {RATE: 500.0}, {}, "invalid", nights([1000.0] * 10))
    assert {v.verdict for v in vs} == {"invalid"}


def test_a_wobble_below_the_practical_effect_is_unchanged():
    assert verdict({RATE: 985.0}, nights([1000, 1002, 998, 1001, 999])).verdict == "unchanged"


def test_a_20pct_drop_is_confirmed_on_the_first_night():
    v = verdict({RATE: 800.0}, nights(steady()))
    assert (v.verdict, v.detail["nights"]) == ("regression", 1)
    assert v.change_pct == pytest.approx(-20.0, abs=1.0) and v.confidence > 0.99


def test_a_6pct_drop_is_suspected_then_confirmed_by_the_next_night():
    history = nights(steady())
    first = verdict({RATE: 940.0}, history, run_id="tonight")
    assert (first.verdict, first.detail["nights"]) == ("suspected", 1)
    assert first.change_pct == pytest.approx(-6.0, abs=1.0)
    # the suspected night is held out of the baseline by the store; the next night confirms
    held = [{**nights([940.0])[0], "run_id": "tonight", "held_out": [RATE]}] + history
    second = verdict({RATE: 938.0}, held, previous={RATE: first.to_dict()})
    assert (second.verdict, second.detail["nights"]) == ("regression", 2)
    assert second.baseline_value == pytest.approx(first.baseline_value)


def test_a_suspicion_the_next_night_does_not_repeat_is_cleared():
    history = nights(steady())
    first = verdict({RATE: 940.0}, history)
    again = verdict({RATE: 1001.0}, history, previous={RATE: first.to_dict()})
    assert (first.verdict, again.verdict) == ("suspected", "unchanged")


def test_latency_going_down_is_an_improvement_and_up_a_regression():
    history = nights(steady(level=1000.0, cv=0.005), metric=P99)
    assert verdict({P99: 700.0}, history, P99).verdict == "improvement"
    assert verdict({P99: 1300.0}, history, P99).verdict == "regression"
    # below half the 10% practical effect: never flagged, however quiet the history
    assert verdict({P99: 1045.0}, history, P99).verdict == "unchanged"


def test_a_noisy_history_widens_the_band():
    noisy = nights([1000, 1200, 850, 1150, 900, 1100, 950, 1050, 1180, 870])
    v = verdict({RATE: 880.0}, noisy)
    assert v.verdict == "unchanged" and v.detail["band_pct"] > 12


def test_a_short_history_only_suspects():
    v = verdict({RATE: 700.0}, nights([1000.0]))
    assert v.verdict == "suspected" and "noise unknown" in v.detail["note"]
    again = verdict({RATE: 700.0}, nights([1000.0, 990.0]), previous={RATE: v.to_dict()})
    assert again.verdict == "suspected"  # never confirmed while the noise is unknown


def test_held_out_values_never_feed_the_baseline():
    history = nights([800.0] * 5, held_out=[RATE]) + nights(steady())
    v = verdict({RATE: 800.0}, history)
    assert v.baseline_value == pytest.approx(1000.0, rel=0.01) and v.verdict == "regression"
    assert v.detail["history"] == 12


def test_per_second_samples_must_differ_significantly():
    same = [1000.0, 1003.0, 997.0, 1001.0, 999.0] * 4
    v = verdict({RATE: 1000.0}, nights([1000] * 4, series=same), series={"delivered_per_s": same},
                policy=Policy(min_effect={RATE: 0.0001}))
    assert v.verdict == "unchanged"
    # a lower night whose seconds overlap the baseline's is not significant either
    wide = [900.0, 1100.0] * 10
    v = verdict({RATE: 940.0}, nights(steady(), series=wide),
                series={"delivered_per_s": [905.0, 1095.0] * 5})
    assert v.verdict == "unchanged" and v.detail["p_samples"] > 0.01


def test_many_metrics_at_once_tighten_the_first_night_level():
    metrics = {m: 1000.0 for m in judged_metrics(Policy())}
    vs = compare_stage("s", metrics, {}, "valid",
                       [{"run_id": "a", "metrics": metrics, "series": {}}] * 5)
    assert {v.detail["tests"] for v in vs} == {len(metrics)}
    assert all(v.detail["level"] == pytest.approx(0.05 / len(metrics)) for v in vs)


def test_aa_noise_stays_quiet_over_many_nights():
    """100 stages x 30 nights, every judged metric with 2% heavy-tailed night-to-night noise,
    through the lifecycle (flagged values held out, never released): at most one false
    alarm per 100 metric series, the bench's bar."""
    rng = random.Random(7)
    names = judged_metrics(Policy())
    alarms = 0
    for _ in range(100):
        history, previous = [], {}
        for night in range(30):
            values = {m: 1000.0 * math.exp(0.02 * rng.gauss(0, 1) / max(0.3, rng.random()))
                      for m in names}  # a normal divided by a uniform: a heavy tail
            vs = compare_stage("s", values, {}, "valid", history, run_id=f"n{night}",
                               previous=previous)
            alarms += sum(v.verdict == "regression" for v in vs)
            previous.update({v.metric: v.to_dict() for v in vs if v.verdict != "no_baseline"})
            history.insert(0, {"run_id": f"n{night}", "metrics": values, "series": {},
                               "held_out": [v.metric for v in vs if v.detail.get("hold")]})
    assert alarms <= len(names)  # 100 stages: len(names) x 100 metric series


def test_a_release_run_is_compared_with_the_pinned_release():
    history = nights(steady(cv=0.005))
    release = {"label": "9.4.5", "run_id": "rel", "metrics": {RATE: 1200.0}, "series": {}}
    v = verdict({RATE: 1000.0}, history, release=release)
    assert v.baseline_value == pytest.approx(1200.0)
    assert v.detail["baseline"] == "release:9.4.5" and v.detail["baseline_run"] == "rel"
    assert v.verdict == "regression"  # -17%: plausibly large, confirmed at once
    assert verdict({RATE: 1000.0}, history).verdict == "unchanged"  # the rolling view


def test_change_points_name_the_start_of_a_level_shift():
    rng = random.Random(3)
    values = [rng.gauss(0, 0.01) for _ in range(15)] + [rng.gauss(-0.08, 0.01) for _ in range(5)]
    points = change_points(values)
    assert [p.index for p in points] == [15]
    assert points[0].after - points[0].before == pytest.approx(-0.08, abs=0.02)
    assert change_points([rng.gauss(0, 0.01) for _ in range(25)]) == []


def test_a_confirmed_regression_names_where_it_began():
    history = [{**e, "held_out": [RATE]} for e in nights([900.0, 902.0, 899.0])]
    for i, e in enumerate(history):
        e["run_id"] = f"bad{3 - i}"
    history += nights(steady(15))
    v = verdict({RATE: 901.0}, history, run_id="tonight",
                previous={RATE: {"verdict": "regression", "detail": {"nights": 3, "noise_pct": 0.5}}})
    assert (v.verdict, v.detail["nights"]) == ("regression", 4)
    assert v.detail["change_point"]["run_id"] == "bad1"
    assert v.detail["change_point"]["shift_pct"] == pytest.approx(-10, abs=1.5)


def test_mann_whitney_matches_scipy():
    from scipy.stats import mannwhitneyu

    rng = random.Random(5)
    x = [round(rng.gauss(0, 1), 1) for _ in range(10)]
    y = [round(rng.gauss(0.4, 1), 1) for _ in range(40)]
    for lower, alt in ((True, "less"), (False, "greater")):
        assert mann_whitney_p(x, y, x_lower=lower) == pytest.approx(
            mannwhitneyu(x, y, alternative=alt, method="asymptotic").pvalue)

import pytest

from tasks.compare import Policy, compare_stage


def history(values, metric="delivered_rate", series=None):
    return [{"metrics": {metric: v}, "series": {"delivered_per_s": series or []}} for v in values]


def verdict_of(verdicts, metric="delivered_rate"):
    return next(v for v in verdicts if v.metric == metric)


def test_first_run_has_no_baseline():
    verdicts = compare_stage("s", {"delivered_rate": 1000.0}, {}, "valid", [])
    assert verdict_of(verdicts).verdict == "no_baseline"


def test_invalid_stage_is_never_compared():
    verdicts = compare_stage("s", {"delivered_rate": 500.0}, {}, "invalid", history([1000.0] * 5))
    assert {v.verdict for v in verdicts} == {"invalid"}


def test_a_small_wobble_inside_the_minimum_effect_is_unchanged():
    verdicts = compare_stage("s", {"delivered_rate": 985.0}, {}, "valid",
                             history([1000, 1002, 998, 1001, 999]))
    assert verdict_of(verdicts).verdict == "unchanged"


def test_a_real_throughput_drop_is_a_regression_with_direction_and_size():
    verdicts = compare_stage("s", {"delivered_rate": 900.0}, {}, "valid",
                             history([1000, 1002, 998, 1001, 999]))
    v = verdict_of(verdicts)
    assert v.verdict == "regression"
    assert v.change_pct == pytest.approx(-10.0, abs=0.1)
    assert v.baseline_value == 1000


def test_latency_going_down_is_an_improvement():
    verdicts = compare_stage("s", {"e2e_latency_p99": 500.0}, {}, "valid",
                             history([1000, 1010, 990], metric="e2e_latency_p99"))
    assert verdict_of(verdicts, "e2e_latency_p99").verdict == "improvement"


def test_a_noisy_history_widens_the_band():
    noisy = [1000, 1200, 850, 1150, 900, 1100, 950]
    verdicts = compare_stage("s", {"delivered_rate": 900.0}, {}, "valid", history(noisy))
    assert verdict_of(verdicts).verdict == "unchanged"


def test_short_history_only_suspects():
    verdicts = compare_stage("s", {"delivered_rate": 800.0}, {}, "valid", history([1000]))
    assert verdict_of(verdicts).verdict == "suspected"


def test_per_second_samples_must_differ_significantly():
    same = [1000.0, 1003.0, 997.0, 1001.0, 999.0] * 4
    verdicts = compare_stage("s", {"delivered_rate": 1000.0}, {"delivered_per_s": same}, "valid",
                             history([1000] * 4, series=same),
                             Policy(min_effect={"delivered_rate": 0.0001}))
    assert verdict_of(verdicts).verdict == "unchanged"

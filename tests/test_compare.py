"""The detector on synthetic histories: pure, no store."""

import math
import random
import statistics

import pytest

from tasks.analysis.changepoint import change_points
from tasks.analysis.detector import baseline_for, compare_stage
from tasks.analysis.noise import (
    Noise,
    noise_sigma,
    peer_noise,
    peer_weight,
    pooled_noise,
    pooled_with_peers,
    t_scale,
)
from tasks.analysis.policy import Policy, judged_metrics
from tasks.metrics import FLAGGED
from tasks.steps.load_metrics import cpu_at_capacity
from tasks.views.tables import verdict_note

RATE = "delivered_rate"
P99 = "e2e_latency_p99_no_stall"  # the judged tail


def nights(values, metric=RATE, held_out=()):
    """History entries, newest first, from values given oldest first."""
    return [{"run_id": f"n{i}", "metrics": {metric: v}, "held_out": list(held_out)}
            for i, v in reversed(list(enumerate(values, 1)))]


def steady(n=12, level=1000.0, cv=0.005, seed=1):
    rng = random.Random(seed)
    return [level * math.exp(rng.gauss(0, cv)) for _ in range(n)]


def verdict(metrics, history, metric=RATE, **kw):
    vs = compare_stage("s", metrics, "valid", history, **kw)
    return next(v for v in vs if v.metric == metric)


def test_first_run_has_no_baseline():
    assert verdict({RATE: 1000.0}, []).verdict == "no_baseline"


def test_a_changed_fingerprint_says_why_the_history_is_empty():
    v = verdict({RATE: 1000.0}, [], new_history="fingerprint changed (a -> b)")
    assert v.verdict == "no_baseline" and "fingerprint changed" in v.detail["new_history"]


def test_invalid_stage_is_never_compared():
    vs = compare_stage("s", {RATE: 500.0}, "invalid", nights([1000.0] * 10))
    assert {v.verdict for v in vs} == {"invalid"}


def test_a_wobble_below_the_practical_effect_is_unchanged():
    quiet = nights([1000, 1002, 998, 1001, 999, 1000, 1002, 998, 1001])
    assert verdict({RATE: 990.0}, quiet).verdict == "unchanged"  # floor: 0.3 x 5%


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


def test_one_wild_night_is_confirmed_at_once_only_beyond_what_heavy_tails_give():
    """16 sigmas in one night comes once in about 5,500 nights of t3 noise: suspected, not
    a regression at once (a fixed 10 sigmas confirmed it, at 7e-4 a night: 1.5 false
    alarms per 100 series of a metric whose noise sat at a tenth of the 15% step)."""
    history = nights(steady(20, cv=0.0125, seed=3))
    v = verdict({RATE: 840.0}, history)  # -16%
    assert v.verdict == "suspected" and -v.change_pct >= 15
    assert 14 <= math.log(1000 / 840) / (v.detail["noise_pct"] / 100) <= 18
    quiet = nights(steady(20, cv=0.002, seed=3))
    assert verdict({RATE: 840.0}, quiet).verdict == "regression"  # 80 sigmas: at once


def test_a_suspicion_the_next_night_does_not_repeat_is_cleared():
    history = nights(steady())
    first = verdict({RATE: 940.0}, history)
    again = verdict({RATE: 1001.0}, history, previous={RATE: first.to_dict()})
    assert (first.verdict, again.verdict) == ("suspected", "unchanged")


def test_latency_going_down_twice_is_an_improvement_and_up_a_regression():
    history = nights(steady(level=1000.0, cv=0.005), metric=P99)
    once = verdict({P99: 700.0}, history, P99)
    assert once.verdict == "unchanged"  # one good night is not evidence enough
    twice = verdict({P99: 700.0}, nights([700.0], P99)[:1] + history, P99,
                    previous={P99: once.to_dict()})
    assert twice.verdict == "improvement"
    assert verdict({P99: 1300.0}, history, P99).verdict == "regression"
    # below 0.3 x the 10% practical effect: never flagged, however quiet the history
    assert verdict({P99: 1025.0}, history, P99).verdict == "unchanged"


def test_a_noisy_history_raises_the_smallest_step_it_can_see():
    noisy = nights([1000, 1200, 850, 1150, 900, 1100, 950, 1050, 1180, 870])
    v = verdict({RATE: 880.0}, noisy)
    quiet = verdict({RATE: 1000.0}, nights(steady(10)))
    assert v.verdict == "unchanged" and v.detail["mde_pct"] > 5 * quiet.detail["mde_pct"]


def test_an_mde_reads_as_the_change_of_the_value_a_person_would_see():
    """A rate's MDE is the drop it catches, a latency's the rise: a log step of 0.2 is an
    18.1% drop and a 22.1% rise (before, both read 22.1%)."""
    from tasks.analysis.detector import step_pct

    assert step_pct(RATE, 0.2) == pytest.approx(18.13, abs=0.01)
    assert step_pct(P99, 0.2) == pytest.approx(22.14, abs=0.01)
    quiet = verdict({RATE: 1000.0}, nights(steady(20)))
    floor = quiet.detail["floor_pct"]  # 0.3 x the 5% that matters, as a drop
    assert floor == pytest.approx(100 * (1 - 1 / 1.015), abs=0.01)


def test_a_metric_too_noisy_to_guard_says_so_and_why():
    rng = random.Random(4)
    p99 = nights([5000 * math.exp(rng.gauss(0, 0.3)) for _ in range(20)], P99)
    v = verdict({P99: 5000.0}, p99, P99)
    assert v.detail["mde_pct"] > 30  # 3x the 10% that matters
    assert "too noisy to guard" in v.detail["too_noisy"] and "over 20 nights" in v.detail["too_noisy"]
    assert "too_noisy" not in verdict({RATE: 1000.0}, nights(steady(20))).detail


def test_a_short_history_is_learning_and_flags_only_what_is_beyond_doubt():
    rng = random.Random(2)
    wobbly = [1000 * math.exp(rng.gauss(0, 0.05)) for _ in range(4)]
    v = verdict({RATE: 700.0}, nights(wobbly))
    assert v.verdict == "learning" and v.detail["note"] == "learning: 4 of 8 nights"
    assert v.confidence is None and "mde_pct" not in v.detail
    # five nights at exactly the target rate, then 30% less two nights in a row
    flat = nights([1000.0] * 5)
    first = verdict({RATE: 700.0}, flat)
    assert (first.verdict, first.detail["doubt_once"]) == ("learning", True)
    stepped = [{**flat[0], "run_id": "n6", "metrics": {RATE: 700.0}}] + flat
    again = verdict({RATE: 700.0}, stepped, previous={RATE: first.to_dict()})
    assert (again.verdict, again.detail["nights"]) == ("regression", 2)
    # the step lasts: n7 (held out, as the store holds a flagged night) is still a regression
    held = [{**flat[0], "run_id": "n7", "metrics": {RATE: 700.0}, "held_out": [RATE]}]
    still = verdict({RATE: 700.0}, held + stepped, previous={RATE: again.to_dict()})
    assert (still.verdict, still.detail["nights"]) == ("regression", 3)
    # one wild night, then a normal one: nothing
    calm = verdict({RATE: 1000.0}, stepped, previous={RATE: first.to_dict()})
    assert calm.verdict == "learning" and not calm.detail["doubt_once"]


def test_while_learning_a_stage_that_swung_little_by_chance_is_held_to_its_peers_noise():
    """Five nights 1% either side of 1000 swing 1% at most, so 30% less is 36 times their
    widest swing: alone, two such nights are a regression. Beside three peers of five
    nights each drawn at 12% noise (they tell 7.6%, 5.9 d.o.f.), the two-night threshold
    with that noise at the doubt level is +85% and the stage is still learning; 80% less is
    caught all the same."""
    quiet = nights([1000 * math.exp(d) for d in (0.0, 0.01, -0.01, 0.01, -0.01)])
    rng = random.Random(9)
    peers = pooled_noise([nights([1000 * math.exp(rng.gauss(0, 0.12)) for _ in range(5)])
                          for _ in range(3)], Policy())
    floor = baseline_for(RATE, quiet, None, Policy(), peers[RATE]).doubt_floor
    assert peers[RATE].judged is None and -math.log(0.7) < floor < -math.log(0.2)
    for step, given, expected in ((700.0, None, "regression"), (700.0, peers, "learning"),
                                  (200.0, peers, "regression")):
        first = verdict({RATE: step}, quiet, peers=given)
        again = verdict({RATE: step}, [{**quiet[0], "run_id": "n6", "metrics": {RATE: step}}]
                        + quiet, previous={RATE: first.to_dict()}, peers=given)
        assert again.verdict == expected, (step, given, first.detail, again.detail)
        assert first.detail["doubt_once"] == (expected == "regression")


def test_the_doubt_floor_counts_peers_of_three_nights_or_more_that_show_a_noise():
    """A peer of 2 nights tells no noise, nor one of 3 whose two nights alike make its
    sigma 0 (it would lower the floor unseen); 3 nights that differ count."""
    policy = Policy()
    assert peer_noise([nights([1000.0, 1300.0])], RATE, policy) is None
    assert peer_noise([nights([1000.0, 1000.0, 1300.0])], RATE, policy).doubt is None
    counted = peer_noise([nights([1000.0, 1000.0, 1300.0]), nights([1000.0, 1100.0, 900.0])],
                         RATE, policy)
    assert counted.doubt.stages == 1 and counted.doubt.sigma > 0 and counted.judged is None


def test_noise_is_pooled_with_peers_in_line_and_never_borrowed_when_noisier():
    rng = random.Random(6)
    def history(sigma, n=10):
        return nights([1000 * math.exp(rng.gauss(0, sigma)) for _ in range(n)])
    peers = pooled_noise([history(0.02, 25) for _ in range(4)], Policy())
    mine = history(0.02, 16)
    own = verdict({RATE: 1000.0}, mine)
    pooled = verdict({RATE: 1000.0}, mine, peers=peers)
    assert peers[RATE].judged.stages == 4 and pooled.detail["noise_stages"] == 5
    assert pooled.detail["noise_peers_weight"] > 0.3  # told beside the verdict
    assert pooled.detail["mde_pct"] < own.detail["mde_pct"]
    noisy = verdict({RATE: 1000.0}, history(0.2, 20), peers=peers)
    assert noisy.detail["noise_stages"] == 1  # a 10x noisier stage keeps its own noise
    # 10 nights of its own cannot show a stage twice as noisy as its peers 9 times in 10
    # (the F test sees it 86 times): it keeps its own noise until it has 13
    assert verdict({RATE: 1000.0}, mine[:10], peers=peers).detail["noise_stages"] == 1
    assert verdict({RATE: 1000.0}, mine[:13], peers=peers).detail["noise_stages"] == 5


def test_peers_lend_their_nights_by_how_likely_the_stage_shares_their_noise():
    """Not pool or not: a stage a little noisier than its peers by chance still draws on
    a good part of their nights (an F test at 0.25 kept it apart, as it does 1 like stage
    in 4), one twice as noisy on hardly any, and the weight falls as its noise rises."""
    policy, peers = Policy(), Noise(0.02, 28.0, 3)  # 3 peers of 20 nights
    def lent(ratio: float) -> float:  # the peers' d.o.f. lent to a stage of 20 nights
        own = Noise(0.02 * math.sqrt(ratio), 9.3)
        return pooled_with_peers(own, peers, policy).dof - own.dof
    assert lent(1.0) > 0.5 * 28 and lent(1.5) > 0.2 * 28
    assert lent(4.0) < 0.01 * 28 and lent(16.0) < 1e-3
    assert all(lent(a) > lent(b) for a, b in zip((0.5, 1, 1.5, 2, 3), (1, 1.5, 2, 3, 4)))
    shared = pooled_with_peers(Noise(0.02 * math.sqrt(0.8), 9.3), peers, policy)
    assert shared.stages == 4 and shared.peers_weight > 0.5
    assert 0.02 * math.sqrt(0.8) < shared.sigma < 0.02
    assert pooled_with_peers(Noise(0.04, 9.3), peers, policy).stages == 1  # said alone
    # far from both hypotheses their densities underflow, not the odds between them
    assert peer_weight(9.3, 28.0, 1e-120, 0.1, 2.0) > 0.9
    assert 0 < peer_weight(9.3, 28.0, 1e60, 0.1, 2.0) < 1e-6
    for nothing in (0.0, math.inf, math.nan):  # no ratio to weigh: judged alone, never NaN
        assert peer_weight(9.3, 28.0, nothing, 0.1, 2.0) == 0.0
    for setting, bad in (("pool_prior", 1.5), ("pool_guard", 1.0)):
        with pytest.raises(ValueError, match=f"Policy.{setting}"):
            Policy(**{setting: bad})


def test_the_noise_estimate_is_the_t_likelihood_scale_tighter_than_the_mad():
    """On heavy-tailed (t3) nights both estimate the same robust sigma, and the t scale
    varies less from history to history: the d.o.f. the detector credits it with."""
    rng = random.Random(11)

    def t3() -> float:  # a Student t with 3 d.o.f.
        return rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)

    histories = [[0.02 * t3() for _ in range(20)] for _ in range(1500)]
    by_t = [math.log(t_scale(tuple(h), 3.0)) for h in histories]
    by_mad = [math.log(noise_sigma(h)) for h in histories]
    robust = 0.02 * 1.4826 * 0.7648923  # the robust sigma of 0.02 x t3
    for logs in (by_t, by_mad):
        assert math.exp(sorted(logs)[len(logs) // 2]) == pytest.approx(robust, rel=0.08)
    worth = [1 / (2 * statistics.pvariance(logs)) / 19 for logs in (by_t, by_mad)]
    assert worth[0] == pytest.approx(0.49, abs=0.06) and worth[1] == pytest.approx(0.30, abs=0.04)
    assert t_scale((5.0, 5.0, 5.0, 6.0), 3.0) == 0.0  # most nights equal: as the MAD
    # two wild nights in 8: the t likelihood gives way (a quarter), the estimate is capped
    calm = [0.02 * t3() for _ in range(6)]
    wild = tuple(calm + [0.74, 0.74])
    assert t_scale(wild, 3.0) <= 1.5 * noise_sigma(list(wild)) + 1e-12


def test_held_out_values_never_feed_the_baseline():
    history = nights([800.0] * 5, held_out=[RATE]) + nights(steady())
    v = verdict({RATE: 800.0}, history)
    assert v.baseline_value == pytest.approx(1000.0, rel=0.01) and v.verdict == "regression"
    assert v.detail["history"] == 12


def test_aa_noise_stays_quiet_over_many_nights():
    """100 stages x 30 nights in runs of 4 (each stage's noise pooled with its peers' as the
    compare step pools it), every judged metric with 2% heavy-tailed night-to-night noise,
    through the lifecycle (flagged values held out, never released): at most one false
    alarm per 100 metric series, the bench's bar."""
    rng = random.Random(7)
    names = judged_metrics(Policy())
    alarms = 0
    for _ in range(25):
        histories, previous = [[] for _ in range(4)], [{} for _ in range(4)]
        for night in range(30):
            for i in range(4):
                values = {m: 1000.0 * math.exp(0.02 * rng.gauss(0, 1) / max(0.3, rng.random()))
                          for m in names}  # a normal divided by a uniform: a heavy tail
                peers = pooled_noise(histories[:i] + histories[i + 1:], Policy())
                vs = compare_stage("s", values, "valid", histories[i], run_id=f"n{night}",
                                   previous=previous[i], peers=peers)
                alarms += sum(v.verdict == "regression" and previous[i].get(v.metric, {})
                              .get("verdict") != "regression" for v in vs)
                previous[i].update({v.metric: v.to_dict() for v in vs
                                    if v.verdict != "no_baseline"})
                histories[i].insert(0, {"run_id": f"n{night}", "metrics": values, "held_out":
                                        [v.metric for v in vs if v.detail.get("hold")]})
    assert alarms <= len(names)  # 100 stages: len(names) x 100 metric series


def test_a_release_run_is_compared_with_the_pinned_release():
    history = nights(steady(cv=0.002))
    release = {"label": "9.4.5", "run_id": "rel", "metrics": {RATE: 1200.0}}
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


def test_a_capacity_held_with_cpu_to_spare_says_so_beside_its_verdict():
    """A broker that fell behind while neither it nor its host used its CPU up was stopped
    by something else: the verdict on max_rate says so, whatever it is; it is not said
    where either was used up or is not known (a shared host may have been full)."""
    history = nights(steady(level=130_000.0, cv=0.02), metric="max_rate")
    slow = {"max_rate": 95_000.0, "broker_cpu_used_pct": 78.4, "host_cpu_used_pct": 88.0}
    v = verdict(slow, history, metric="max_rate")
    assert v.verdict in FLAGGED and v.detail["cpu_to_spare"] == {"broker_pct": 78.4,
                                                                 "host_pct": 88.0}
    assert verdict_note(v.__dict__, short=True).endswith("CPU to spare: broker 78%, host 88%")
    assert "something else stopped it" in verdict_note(v.__dict__)
    for used_up in ({"broker_cpu_used_pct": 87.0}, {"host_cpu_used_pct": 98.5},
                    {"host_cpu_used_pct": None}):
        v = verdict({**slow, **used_up}, history, metric="max_rate")
        assert "cpu_to_spare" not in v.detail and "CPU to spare" not in verdict_note(v.__dict__)
    # learning, it still says so; another metric of the stage never does
    v = verdict(slow, history[:3], metric="max_rate")
    assert v.verdict == "learning" and "CPU to spare" in verdict_note(v.__dict__)
    assert "cpu_to_spare" not in verdict({**slow, RATE: 900.0}, nights(steady())).detail


def test_a_capacitys_cpu_is_read_against_the_cores_its_broker_can_use():
    """Mosquitto's one event loop can use one core whatever its host has; a broker without
    such a limit is measured against its host's cores (none without them), the CPUs it
    was started with where a cpuset leaves fewer, or the CPUs it was kept on; the host's
    figure needs its cores."""
    hold = {"broker_cpu_avg": 78.0, "host_cpu_avg": 176.0}
    assert cpu_at_capacity(hold, "mosquitto", 2) == {"broker_cpu_used_pct": 78.0,
                                                     "host_cpu_used_pct": 88.0}
    assert cpu_at_capacity(hold, "mosquitto", None) == {"broker_cpu_used_pct": 78.0,
                                                        "host_cpu_used_pct": None}
    assert cpu_at_capacity({"broker_cpu_avg": 150.0}, "rabbitmq", 2)["broker_cpu_used_pct"] == 75.0
    assert cpu_at_capacity(hold, "rabbitmq", None)["broker_cpu_used_pct"] is None
    kept = cpu_at_capacity({"broker_cpu_avg": 150.0}, "rabbitmq", 4, kept_on="0-1")
    assert kept["broker_cpu_used_pct"] == 75.0  # of 2 CPUs, not the host's 4
    # started where a cpuset leaves perfpipe 2 of the host's 4: of those 2 (its host's of 4)
    fenced = cpu_at_capacity({"broker_cpu_avg": 150.0, "host_cpu_avg": 200.0}, "rabbitmq", 4,
                             may_use=2)
    assert fenced == {"broker_cpu_used_pct": 75.0, "host_cpu_used_pct": 50.0}
    assert cpu_at_capacity({"broker_cpu_avg": 150.0}, "rabbitmq", 4, kept_on="0",
                           may_use=2)["broker_cpu_used_pct"] == 150.0  # kept on 1 of them

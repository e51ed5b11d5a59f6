"""The max-rate search against simulated brokers of known capacity (pure logic)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tasks.catalog.ratesearch import ProbeResult, RateSearch, SearchPolicy
from tasks.steps.load_metrics import confirming_hold


def run(search: RateSearch, capacity: float) -> list[float]:
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(ProbeResult(rate, sent_ratio=min(1.0, capacity / rate),
                                  received_ratio=min(1.0, capacity / rate)))
    return rates


@pytest.mark.parametrize("start,capacity", [(100, 5000), (2000, 5150), (4000, 4100), (900, 1000)])
def test_search_lands_within_precision_of_the_capacity(start, capacity):
    search = RateSearch(start, SearchPolicy(max_probes=20))
    rates = run(search, capacity)
    outcome = search.outcome()
    assert outcome["converged"] and outcome["reason"] is None
    # kept up means within 5% short of the offered rate: the answer is at most 1/0.95 above
    assert capacity * 0.9 <= outcome["max_rate"] <= capacity / 0.95
    assert outcome["ceiling"] <= outcome["max_rate"] * 1.1
    growing = rates[:rates.index(max(rates)) + 1]
    assert growing == sorted(growing)  # ramps up from below the peak, then narrows down


def test_a_start_above_capacity_backs_off_first():
    """Down to just below what the failed probe delivered; by `growth` when it says
    nothing (it delivered nothing, or more than a growth step lower would offer)."""
    search = RateSearch(10_000, SearchPolicy(max_probes=20))
    rates = run(search, 1_800)
    assert rates[:2] == [10_000, pytest.approx(1_800 * 0.95)]
    assert search.outcome()["converged"]

    silent = RateSearch(10_000, SearchPolicy(max_probes=20))
    while (rate := silent.next_rate()) is not None:
        silent.record(ProbeResult(rate, 1.0, 1.0 if rate <= 1_800 else 0.0))
    assert [p["rate"] for p in silent.outcome()["probes"]][:4] == [10_000, 5_000, 2_500, 1_250]
    assert silent.outcome()["converged"]


def test_unconverged_searches_say_why():
    never_fails = RateSearch(100, SearchPolicy(max_probes=3))
    run(never_fails, 1e9)
    assert (never_fails.outcome()["max_rate"], never_fails.outcome()["converged"]) == (400, False)
    assert "kept up at every probe, up to 400 msg/s" in never_fails.outcome()["reason"]
    always_fails = RateSearch(100, SearchPolicy(min_rate=20))
    run(always_fails, 1)
    assert always_fails.outcome()["max_rate"] is None
    assert always_fails.outcome()["reason"] == "no probe kept up, down to 25 msg/s"


def test_errors_or_a_send_backlog_fail_a_probe():
    policy = SearchPolicy()
    assert not ProbeResult(100, 1.0, 1.0, errors=1).keeps_up(policy.tolerance)
    # a client without a CONNACK by the connect deadline counts no error: the stage's gate
    # holds it invalid, and the search the same
    unconnected = ProbeResult(100, 1.0, 0.99, connects_failed=3)
    assert not unconnected.keeps_up(policy.tolerance)
    assert unconnected.reason(policy.tolerance) == "3 connections failed"
    backlog = ProbeResult(100, 0.9, 1.0)
    assert not backlog.keeps_up(policy.tolerance)
    assert backlog.reason(policy.tolerance) == "sent 90.0% of the offered rate (send backlog)"


def test_a_search_scenario_plans_one_template_and_probes_scale_it():
    from tasks.catalog.scenarios import Scenario
    from tasks.catalog.stages import expand, probe

    doc = {"name": "s", "source": "t", "qos": [0, 1],
           "publishers": [{"group": "pub", "count": 10, "topic": "t/{scenario}", "rate_per_client": 50}],
           "subscribers": [{"group": "sub", "count": 1, "topics": ["t/{scenario}"]}],
           "stages": {"measure_s": 3, "search": {"growth": 1.5}}}
    templates = expand(Scenario.model_validate(doc))
    assert [t.stage_id for t in templates] == ["s.q0.c100.search", "s.q1.c100.search"]
    assert templates[0].search["growth"] == 1.5 and templates[0].target_publish_rate == 500
    p = probe(templates[0], 1250.0, 3)
    assert (p.stage_id, p.probe_of, p.search) == ("s.q0.c100.search.p3", "s.q0.c100.search", None)
    assert p.target_publish_rate == pytest.approx(1250.0) and p.rate_pct == 250
    with pytest.raises(ValueError, match="rate_pct: a search starts from one rate"):
        Scenario.model_validate({**doc, "stages": {"rate_pct": [50, 100], "search": {}}})


def held(capacity: float, hold_capacity: float | None = None):
    """A simulated broker for probes and holds: a hold may sustain less than a short probe."""
    def result(rate: float, sustained: float) -> ProbeResult:
        return ProbeResult(rate, sent_ratio=min(1.0, sustained / rate),
                           received_ratio=min(1.0, sustained / rate))
    return lambda rate, hold: result(rate, hold_capacity if hold and hold_capacity else capacity)


def search_and_hold(search: RateSearch, broker) -> list[tuple[str, float]]:
    steps = []
    while (rate := search.next_rate()) is not None:
        steps.append(("probe", rate))
        search.record(broker(rate, False))
    while (rate := search.next_hold()) is not None:
        steps.append(("hold", rate))
        search.record_hold(broker(rate, True))
    return steps


def test_a_probe_that_fell_behind_says_where_to_look_next():
    search = RateSearch(1_000, SearchPolicy(precision=0.02, max_probes=20))
    rates = [rate for _, rate in search_and_hold(search, held(5_100))]
    # 8,000 fell behind having delivered 5,100: the next probe is just below that, not at
    # the geometric middle of 4,000 and 8,000 (5,657)
    assert rates[:5] == [1_000, 2_000, 4_000, 8_000, pytest.approx(5_100 * 0.99)]
    outcome = search.outcome()
    assert outcome["converged"] and 5_100 * 0.98 <= outcome["max_rate"] <= 5_100 / 0.95
    assert len(rates) <= 8


def test_the_answer_is_held_and_steps_down_when_it_does_not_hold():
    policy = SearchPolicy(precision=0.02, max_probes=20, hold_s=10)
    search = RateSearch(1_000, policy)
    search_and_hold(search, held(5_000, hold_capacity=1))  # the search phase only ...
    search.held.clear()
    best = search.best
    # ... then over 10 s the broker sustains less, 6% less: the next hold goes below what
    # the failed one delivered, down to what the best probe showed (5% tolerance) at most
    sustained = 0.95 * best / 1.01
    holds = [rate for kind, rate in search_and_hold(search, held(5_000, sustained))
             if kind == "hold"]
    assert holds == [best, pytest.approx(best * 0.95 * 0.99)] and len(holds) <= policy.holds
    outcome = search.outcome()
    assert [h["kept_up"] for h in outcome["holds"]] == [False, True]
    assert outcome["converged"] and outcome["max_rate"] == holds[1] and outcome["hold_s"] == 10

    never = RateSearch(1_000, policy)
    search_and_hold(never, held(5_000, hold_capacity=1_000))
    assert never.outcome()["converged"] is False
    assert never.outcome()["reason"].startswith("no rate held for 10 s: tried ")


def test_a_warm_start_ramps_up_from_below_the_last_capacity_in_small_steps():
    policy = SearchPolicy(growth=2.0, precision=0.02, max_probes=20)
    warm = RateSearch(1_000, policy, last_capacity=5_000, warm=True)
    assert warm.start_rate == 4_500 and warm._growth(4_500) == 1.1
    assert RateSearch(1_000, policy, last_capacity=None, warm=True).start_rate == 1_000
    assert RateSearch(1_000, policy, last_capacity=5_000).start_rate == 1_000  # not warm
    rates = [rate for _, rate in search_and_hold(warm, held(5_000))]
    assert rates[0] < 5_000 and len(rates) <= 5


@pytest.mark.parametrize("capacity", [20_000, 29_000, 50_000, 130_000, 300_000])
def test_a_warm_search_finds_a_capacity_far_from_the_last_within_its_probes(capacity):
    """The nightly capacity search's settings, warm from 100,000 msg/s, against a broker
    that lost most of its capacity since, or gained much: it converges and holds within
    `max_probes`. In steps of 10% it stepped down from 90,000 by 1.1 a probe (or up by
    1.1 to 3.1x), ran out of probes, and was invalid that night and every night after (a
    warm start begins at the last valid capacity), so the biggest regression was never
    judged."""
    policy = SearchPolicy(growth=2.0, precision=0.02, max_probes=14, hold_s=10, holds=3)
    search = RateSearch(10_000, policy, last_capacity=100_000, warm=True)
    search_and_hold(search, held(capacity))
    outcome = search.outcome()
    assert outcome["converged"], outcome["reason"]
    assert capacity * 0.95 <= outcome["max_rate"] <= capacity / 0.95
    counted = [p for p in outcome["probes"] if not p["retried"]]
    assert len(counted) <= 10, [round(p["rate"]) for p in outcome["probes"]]


def test_a_driver_at_its_limit_at_the_answer_makes_the_search_say_so():
    search = RateSearch(1_000, SearchPolicy(precision=0.1))
    for rate in (1_000, 2_000, 4_000):
        search.record(ProbeResult(rate, 1.0, 1.0, driver_cpu=40.0))
    search.record(ProbeResult(8_000, 0.5, 0.5, driver_cpu=99.0))
    search.probes[-2] = (ProbeResult(4_000, 1.0, 1.0, driver_cpu=97.0), True)
    search.record(ProbeResult(4_300, 0.9, 0.9))
    outcome = search.outcome()
    assert outcome["converged"] is False
    assert outcome["reason"].startswith("a driver process used 97% of a core at 4000 msg/s")


def test_drivers_sharing_cpus_they_used_up_at_the_answer_make_the_search_say_so():
    """Two driver processes on the one CPU broker.cpus left them: neither over 90% of a
    core, together 99% of that CPU."""
    search = RateSearch(1_000, SearchPolicy(precision=0.1))
    for rate in (1_000, 2_000, 4_000):
        search.record(ProbeResult(rate, 1.0, 1.0, driver_cpu=rate / 80,
                                  drivers_cpus_used=rate / 40))
    assert search.outcome()["reason"].startswith("the broker kept up at every probe")
    search.record(ProbeResult(4_300, 0.9, 0.9, driver_cpu=50.0, drivers_cpus_used=99.0))
    assert search.converged
    outcome = search.outcome()
    assert outcome["converged"] is False and outcome["max_rate"] == 4_000
    assert outcome["reason"].startswith(
        "the driver processes of one host used 100% of the CPUs they may run on at 4000 msg/s "
        "(over 90%): the load generator may be what ran out, not the broker; add driver hosts")
    search.probes[-2] = (ProbeResult(4_000, 1.0, 1.0, driver_cpu=50.0, drivers_cpus_used=89.0),
                         True)
    assert search.outcome()["converged"] is True


def test_a_driver_at_its_limit_at_a_held_answer_records_the_rate_that_held():
    """A run on this machine: the hold at the best probe (132,411 msg/s) fell behind, the
    next one (126,865) held with a driver at 97% of a core. The answer recorded beside that
    reason is the rate that held, not the best probe's, whose hold failed."""
    policy = SearchPolicy(precision=0.02, max_probes=20, hold_s=10)
    search = RateSearch(1_000, policy)
    broker = held(5_000, hold_capacity=0.95 * 5_000 / 1.01)
    while (rate := search.next_rate()) is not None:
        search.record(broker(rate, False))
    while (rate := search.next_hold()) is not None:
        search.record_hold(replace(broker(rate, True), driver_cpu=97.0))
    assert [k for _, k in search.held] == [False, True]
    (failed, _), (kept, _) = search.held
    assert failed.rate == search.best and kept.rate < failed.rate
    outcome = search.outcome()
    assert outcome["converged"] is False
    # the rate recorded is the hold whose broker cost load_metrics records beside it
    assert outcome["max_rate"] == kept.rate == next(
        h["rate"] for h in outcome["holds"] if h["kept_up"])
    assert outcome["reason"].startswith(f"a driver process used 97% of a core at {kept.rate:.0f}")


def test_a_failure_just_above_the_best_narrows_the_bracket_and_is_never_probed_again():
    """A probe that kept up and the next one above it that fell behind by more than the
    tolerance disagree (their noise differed): the failed rate still bounds the bracket.
    Replays a night of this machine's Mosquitto, whose search probed 121,239 msg/s twice and
    then failed on two failed probes at one rate."""
    search = RateSearch(10_000, SearchPolicy(precision=0.02, max_probes=14))
    for rate, received in [(10_000, 1.0), (20_000, 1.0), (40_000, 1.0), (80_000, 1.0),
                           (160_000, 0.731), (115_787, 1.0), (119_394, 1.0)]:
        best = search.next_rate()
        assert best == pytest.approx(rate, rel=1e-3)
        search.record(ProbeResult(best, 1.0, received))
    failed_at = search.next_rate()
    search.record(ProbeResult(failed_at, 1.0, 0.882))  # delivered below the best
    assert search.top == failed_at
    assert search.converged  # 119,394 and 121,239 are within 2%
    assert search.next_rate() is None and search.outcome()["max_rate"] == best


def test_two_failed_probes_at_one_rate_narrow_on_the_lower_delivery():
    search = RateSearch(1_000, SearchPolicy(precision=0.01, max_probes=10))
    for probe in [ProbeResult(1_000, 1.0, 1.0), ProbeResult(2_000, 1.0, 0.80),
                  ProbeResult(2_000, 1.0, 0.70)]:
        search.record(probe)
    assert search.next_rate() == pytest.approx(2_000 * 0.70 * (1 - 0.005))


def test_a_hold_that_fell_behind_steps_down_to_what_it_delivered():
    """The throttled bench broker after a 5% capacity cut (1,900 msg/s): the 3 s probe at
    1,999 kept up within the 5% tolerance (95.05%), but over the 10 s hold the backlog rose.
    Steps of 2% (1,960, 1,921) would never hold; the next hold goes below what 1,999
    delivered, and holds. A stalled hold (half delivered) steps down no further than the
    best probe vouches for; when the hold there falls behind too, the next goes below what
    the two delivered."""
    def search_at_1999() -> RateSearch:
        search = RateSearch(1_817, SearchPolicy(growth=1.1, precision=0.02, hold_s=10))
        for rate, received in [(1_817, 1.0), (1_999, 0.9505), (2_199, 0.864)]:
            assert search.next_rate() == pytest.approx(rate, rel=1e-3)
            search.record(ProbeResult(search.next_rate(), 1.0, received))
        assert search.next_rate() is None and search.next_hold() == search.best
        return search

    rising = "backlog rose in 9 of 10 seconds, by 908 messages"
    search = search_at_1999()
    search.record_hold(ProbeResult(search.best, 1.0, 0.955, backlog=rising))
    second = search.next_hold()
    assert second == pytest.approx(search.best * 0.955 * 0.99)  # 1,890, below 1,900
    search.record_hold(ProbeResult(second, 1.0, 1.0))
    assert search.outcome()["max_rate"] == second and search.outcome()["converged"]

    stalled = search_at_1999()
    stalled.policy = replace(stalled.policy, holds=3)
    stalled.record_hold(ProbeResult(stalled.best, 1.0, 0.5, backlog=rising))
    floor = stalled.next_hold()
    assert floor == pytest.approx(stalled.best * 0.95 * 0.99)
    stalled.record_hold(ProbeResult(floor, 1.0, 0.6, backlog=rising))  # failed there too
    # two holds fell behind: just below the most either delivered (the floor's 60%)
    assert stalled.next_hold() == pytest.approx(floor * 0.6 * 0.99)


def test_a_hold_at_the_floor_that_fails_too_goes_below_what_the_holds_delivered():
    """A night on this machine (capacity_fanin QoS 0, 1 ms tick): the 3 s probe at 171,733
    msg/s kept up, the 10 s hold there delivered 91.0% (156,277), the hold at the floor
    (best x 0.95 x 0.99, 161,515) 84.6%. The broker's 10 s capacity is what the holds
    showed, not the probe: the third hold goes just below the most they delivered, where
    steps of 2% (158,348) would have failed again."""
    rising = "backlog rose in 9 of 10 seconds"

    def held_at(best: float, holds: int = 3, last_capacity: float | None = None) -> RateSearch:
        policy = SearchPolicy(precision=0.02, max_probes=20, hold_s=10, holds=holds)
        search = RateSearch(best, policy, last_capacity=last_capacity)
        search.record(ProbeResult(best, 1.0, 0.99))
        search.record(ProbeResult(175_000, 1.0, 0.93))
        assert search.next_rate() is None and search.next_hold() == best
        return search

    search = held_at(171_733)
    search.record_hold(ProbeResult(171_733, 1.0, 0.910, backlog=rising))
    floor = search.next_hold()
    assert floor == pytest.approx(171_733 * 0.95 * 0.99)
    # the stage ran it a few ulps off (a rate per client, times the clients)
    search.record_hold(ProbeResult(floor * (1 + 1e-15), 1.0, 0.846, backlog=rising))
    third = search.next_hold()
    assert third == pytest.approx(171_733 * 0.910 * 0.99)  # 154,714
    search.record_hold(ProbeResult(third, 1.0, 1.0))
    assert search.outcome()["max_rate"] == third and search.outcome()["converged"]
    assert search.next_hold() is None

    # a hold that fell behind just above the floor goes to the floor first, not below it
    above = held_at(171_733)
    above.record_hold(ProbeResult(171_733, 1.0, 0.96, backlog=rising))  # to 163,215
    assert above.next_hold() == pytest.approx(171_733 * 0.96 * 0.99)
    above.record_hold(ProbeResult(above.next_hold(), 1.0, 0.9, backlog=rising))
    assert above.next_hold() == pytest.approx(floor)

    # a hold run again (it fell behind below the last capacity) is not counted, nor what it
    # delivered (99%, its backlog rising)
    again = held_at(171_733, last_capacity=172_000)
    again.record_hold(ProbeResult(171_733, 1.0, 0.99, backlog=rising))
    assert again.retrying and again.next_hold() == 171_733
    again.record_hold(ProbeResult(171_733, 1.0, 0.88, backlog=rising))
    again.record_hold(ProbeResult(again.next_hold(), 1.0, 0.80, backlog=rising))  # the floor
    assert again.next_hold() == pytest.approx(171_733 * 0.88 * 0.99)

    # holds that delivered nothing tell nothing: no third hold, and no rate held
    broken = held_at(171_733)
    broken.record_hold(ProbeResult(171_733, 0.0, 0.0))
    broken.record_hold(ProbeResult(broken.next_hold(), 0.0, 0.0))
    assert broken.next_hold() is None and broken.max_rate is None
    assert broken.outcome()["reason"].startswith("no rate held for 10 s")


def test_a_probe_that_stalls_below_the_last_capacity_is_probed_again():
    """A clean clone's slowdown test, third A night, against a bucket of exactly 2,000
    msg/s: the warm start's first probe, at 1,855 (90% of the last night's 2,061), received
    64.2% of its deliveries (a stall; every other probe kept up to 2,000). Taken as the
    ceiling, it answered 1,769. Probed again, it keeps up and the search finds 2,000."""
    policy = SearchPolicy(growth=2.0, precision=0.05, max_probes=10)
    start = RateSearch(1_000, policy, last_capacity=2_061, warm=True).start_rate
    stalls = [start]

    def broker(rate: float) -> ProbeResult:
        if stalls and rate == stalls[0]:
            stalls.pop()
            return ProbeResult(rate, 1.0, 0.642)
        return ProbeResult(rate, min(1.0, 2_000 / rate), min(1.0, 2_000 / rate))

    def search(search: RateSearch) -> list[float]:
        return [rate for _, rate in search_and_hold(search, lambda rate, _: broker(rate))]

    # the search as it was: nothing run again
    before = RateSearch(1_000, replace(policy, retries=0), last_capacity=2_061, warm=True)
    search(before)
    assert before.outcome()["max_rate"] < 0.9 * 2_000 and not before.probes_aside

    stalls.append(start)
    again = RateSearch(1_000, policy, last_capacity=2_061, warm=True)
    rates = search(again)
    assert rates[:2] == [start, start]
    assert 2_000 * 0.95 <= again.outcome()["max_rate"] <= 2_000 / 0.95
    probes = again.outcome()["probes"]
    assert len(probes) == len(rates) and [p["retried"] for p in probes].count(True) == 1
    assert (probes[0]["rate"], probes[0]["kept_up"], probes[0]["retried"]) == (start, False, True)
    assert probes[0]["why"] == "received 64.2% of the expected deliveries"


def test_a_hold_that_stalls_below_the_last_capacity_is_held_again():
    """A stalled hold would step the answer down to what the best probe vouches for (6%
    below it, `test_a_hold_that_fell_behind_steps_down_to_what_it_delivered`); below the
    capacity last measured, it is held again at the same rate first."""
    policy = SearchPolicy(growth=2.0, precision=0.05, max_probes=10, hold_s=10, holds=2)
    search = RateSearch(1_000, policy, last_capacity=2_061, warm=True)
    steps = search_and_hold(search, held(2_000))
    assert not search.probes_aside and not search.held_aside  # no stall: none run twice
    stalled = RateSearch(1_000, policy, last_capacity=2_061, warm=True)
    run(stalled, 2_000)  # the probes, as above
    best = stalled.best
    assert stalled.next_hold() == best < 2_061
    stalled.record_hold(ProbeResult(best, 1.0, 0.5))  # a stall
    assert stalled.next_hold() == best  # held again, not stepped down
    stalled.record_hold(ProbeResult(best, 1.0, 1.0))
    assert stalled.next_hold() is None and stalled.outcome()["max_rate"] == best
    assert [h["retried"] for h in stalled.outcome()["holds"]] == [True, False]
    assert ("hold", best) in steps and stalled.outcome()["max_rate"] == search.outcome()["max_rate"]
    # the broker's cost at capacity is read over the hold that kept up, the second
    assert confirming_hold("s.search", stalled.outcome()) == "s.search.h2"
    assert confirming_hold("s.search", search.outcome()) == "s.search.h1"
    assert confirming_hold("s.search", {**search.outcome(), "holds": []}) is None


def test_a_hold_that_stalls_just_above_the_last_capacity_is_held_again():
    """On a night like the last ones the best probe, and so the first hold, usually lands a
    little above the capacity last measured (a probe keeps up within the tolerance): a stall
    there read as a 6% loss, a suspicion, and the next such night a regression."""
    policy = SearchPolicy(growth=2.0, precision=0.02, max_probes=10, hold_s=10, holds=3)
    for above, again in ((1.04, True), (1.06, False)):
        search = RateSearch(1_000, policy, last_capacity=2_000, warm=True)
        run(search, 2_000)
        best = search.best
        search.last_capacity = best / above  # what the hold is judged against
        assert search.next_hold() == best
        search.record_hold(ProbeResult(best, 1.0, 0.85))  # a stall
        if again:  # within the tolerance above it: held again at the same rate
            assert search.retrying and search.next_hold() == best
        else:  # further above: the broker may be past it tonight, so it steps down
            assert not search.retrying and search.next_hold() < best


def test_a_broker_that_lost_capacity_falls_behind_again_and_costs_one_probe():
    policy = SearchPolicy(growth=2.0, precision=0.05, max_probes=10)
    # now 1,500; `plain` runs nothing again
    plain = RateSearch(1_000, replace(policy, retries=0), last_capacity=2_000, warm=True)
    warm_again = RateSearch(1_000, policy, last_capacity=2_000, warm=True)
    rates, rates_again = run(plain, 1_500), run(warm_again, 1_500)
    assert rates_again == [rates[0]] + rates  # the first failure probed twice, no more
    assert [warm_again.probes[i][0].rate for i in warm_again.probes_aside] == [1_800]
    # a hold that falls behind after the search's one retry is stepped down at once
    warm_again.policy = replace(warm_again.policy, hold_s=10)
    warm_again.record_hold(ProbeResult(warm_again.next_hold(), 1.0, 0.5))
    assert warm_again.next_hold() < warm_again.best
    assert warm_again.outcome()["max_rate"] == plain.outcome()["max_rate"]
    assert 1_500 * 0.9 <= plain.outcome()["max_rate"] <= 1_500 / 0.95


def test_a_probe_run_again_that_falls_behind_again_bounds_the_search_by_itself():
    """Only the second run counts: the first, set aside, delivered half, the second 90%,
    so the bracket's top is what the second delivered (1,800 x 0.9 / 0.95), not the
    first's 947, and the next probe goes just below it."""
    search = RateSearch(1_000, SearchPolicy(growth=2.0, precision=0.02), last_capacity=2_000)
    search.record(ProbeResult(1_000, 1.0, 1.0))
    search.record(ProbeResult(1_800, 1.0, 0.5))
    assert search.retrying and search.next_rate() == 1_800 and search.top is None
    search.record(ProbeResult(1_800, 1.0, 0.9))
    assert not search.retrying
    assert search.top == pytest.approx(1_800 * 0.9 / 0.95)
    assert search.next_rate() == pytest.approx(1_800 * 0.9 * 0.99)


def test_a_probe_run_again_uses_none_of_the_budget_and_never_loops():
    search = RateSearch(1_000, SearchPolicy(growth=2.0, max_probes=3, precision=0.02),
                        last_capacity=3_000)
    search.record(ProbeResult(1_000, 1.0, 1.0))
    search.record(ProbeResult(2_000, 1.0, 0.5))  # set aside
    search.record(ProbeResult(2_000, 1.0, 1.0))
    assert search.next_rate() == 4_000  # the third of max_probes: the one set aside is free
    assert [p["retried"] for p in search.outcome()["probes"]] == [False, True, False]
    search.record(ProbeResult(4_000, 1.0, 0.9))  # the third: the budget is spent
    assert search.next_rate() is None
    assert search.outcome()["reason"].startswith(
        "not converged after 3 probes (and 1 run again): between 2000 and ")

    replayed = RateSearch(1_000, SearchPolicy(growth=2.0, precision=0.02), last_capacity=3_000)
    replayed.record(ProbeResult(1_000, 1.0, 1.0))
    stalled = ProbeResult(2_000, 1.0, 0.5)
    replayed.record(stalled)
    replayed.record(stalled)  # the same result again (a caller replaying it) counts
    assert not replayed.retrying and replayed.next_rate() < 2_000

    held = RateSearch(1_000, SearchPolicy(precision=0.02, hold_s=10, holds=2),
                      last_capacity=1_020)
    held.record(ProbeResult(1_000, 1.0, 1.0))
    held.record(ProbeResult(1_010, 1.0, 1.0))
    held.record(ProbeResult(1_030, 1.0, 0.9))  # above the last capacity: converged on 1,010
    held.record_hold(ProbeResult(held.next_hold(), 1.0, 0.4))  # set aside
    held.record_hold(ProbeResult(held.next_hold(), 1.0, 0.9))  # fell behind again: counts
    assert [h.rate for h, _ in held.held] == [1_010, 1_010]
    assert held.next_hold() < 1_010  # the second of 2 holds
    held.record_hold(ProbeResult(held.next_hold(), 1.0, 0.4))
    assert held.next_hold() is None
    assert held.outcome()["reason"].startswith(
        "no rate held for 10 s: tried 1010 (received 40.0% of the expected deliveries; "
        "run again), 1010 (")


def test_warm_started_nights_see_a_5pct_loss_and_a_coarse_search_is_refused():
    """Night after night from the last answer, as the nightly runs: at the 2% precision the
    answer follows the broker, and 5% less capacity reads as most of 5% less. A 10% search
    answered 0.99 x last night's whatever the broker did within its warm start's step."""
    from tasks.catalog.scenarios import SearchSettings
    from tasks.config_files import ConfigError, validate

    def nights(capacities: list[float], precision: float) -> list[float]:
        answers, last = [], None
        for capacity in capacities:
            policy = SearchPolicy(growth=2.0, precision=precision, max_probes=14, hold_s=10)
            search = RateSearch(1_000, policy, last_capacity=last, warm=True)
            search_and_hold(search, held(capacity))
            last = search.outcome()["max_rate"]
            answers.append(last)
        return answers

    fine = nights([2_000] * 6 + [1_900], 0.02)
    # a probe keeps up within the 5% tolerance, so an answer may read up to 5% above
    assert all(2_000 <= a <= 2_000 / 0.95 for a in fine[:6])
    assert max(fine[:6]) / min(fine[:6]) < 1.01 and fine[6] / fine[5] - 1 <= -0.035
    coarse = nights([2_000, 2_100, 1_990, 2_050], 0.10)
    # each answer is last night's x 0.9 x 1.1^k: a broker 5.2% slower (2,100 -> 1,990) read
    # 10% slower, one 3% faster (1,990 -> 2,050) 8.9% faster
    steps = [math.log(b / a / 0.9, 1.1) for a, b in zip(coarse, coarse[1:])]
    assert steps == pytest.approx([round(k) for k in steps], abs=1e-9)
    assert coarse[2] / coarse[1] == pytest.approx(0.9)
    assert coarse[3] / coarse[2] == pytest.approx(0.9 * 1.1 ** 2)
    with pytest.raises(ConfigError, match="precision: 0.1 cannot resolve max_rate's 5% minimum"):
        validate(SearchSettings, {"precision": 0.1}, "x.yml")
    assert (SearchSettings().precision, SearchSettings().max_probes) == (0.02, 14)
    assert validate(SearchSettings, {"precision": 0.025}, "x.yml").precision == 0.025


def _first_hold_failed(failed: ProbeResult) -> dict:
    """The outcome of a search (kept up to 1,000 msg/s, fell behind above) whose first hold
    went as `failed` did, at its rate: the next hold must go lower and confirm."""
    search = RateSearch(1_000, SearchPolicy(precision=0.02, hold_s=4))
    for rate in (1_000, 2_000):
        search.record(ProbeResult(rate, 1.0, 1.0 if rate == 1_000 else 0.5))
    while (rate := search.next_rate()) is not None:
        search.record(ProbeResult(rate, 1.0, 1.0 if rate <= 1_000 else 0.5))
    first = search.next_hold()
    search.record_hold(replace(failed, rate=first))
    second = search.next_hold()
    assert second is not None and second < first
    search.record_hold(ProbeResult(second, 1.0, 1.0))
    outcome = search.outcome()
    assert outcome["converged"] and outcome["max_rate"] == second
    return outcome


def test_a_hold_that_delivered_all_but_unevenly_is_held_lower():
    """A hold whose deliveries swung over its window (the validity gate's throughput CV
    over 0.25) has not shown the rate sustained, though it delivered what was asked in
    all: its stage would be invalid, and with it the night's capacity. It fails as one
    that fell behind does, and the next hold goes lower. A probe is not judged on it."""
    from tasks.driver.output import COUNTER_COLUMNS
    from tasks.steps.stages import probe_outcome

    def hold(delivered_per_s: list[int], is_hold: bool = True) -> ProbeResult:
        planned = {"target_publish_rate": 1_000.0, "expected_delivery_rate": 1_000.0,
                   "qos": 0, "receivers": {"0": 1}, "windows": {
                       "measure_start": 100, "measure_end": 100 + len(delivered_per_s)}}
        rows = [[second, 1_000, 0, delivered] + [0] * (len(COUNTER_COLUMNS) - 4)
                for second, delivered in enumerate(delivered_per_s, 100)]
        counters = "\n".join(",".join(map(str, row)) for row in [COUNTER_COLUMNS, *rows])
        return probe_outcome(planned, [counters], [{}], hold=is_hold)

    assert COUNTER_COLUMNS[:4] == ("second", "published", "acked", "received")
    steady = hold([990, 1_010, 1_000, 1_000])
    assert steady.keeps_up(0.05) and steady.unstable is None
    swinging = hold([1_600, 400, 1_700, 300])  # all 4,000 delivered, a CV of 0.65
    assert (swinging.sent_ratio, swinging.received_ratio) == (1.0, 1.0)
    assert not swinging.keeps_up(0.05)
    assert swinging.reason(0.05) == "throughput unstable over the window (CV 0.65 > 0.25)"
    assert hold([1_000]).unstable is None  # one second has no spread to judge
    # a probe's few seconds are not judged on it: one catch-up burst is no swing
    assert hold([1_600, 400, 1_700, 300], is_hold=False).keeps_up(0.05)

    outcome = _first_hold_failed(swinging)
    assert outcome["holds"][0]["why"] == outcome["holds"][0]["unstable"] == swinging.unstable


def test_a_probe_or_hold_that_broke_its_qos_promise_did_not_keep_up():
    """A broker that drops QoS 1 messages past a subscriber's queue can still deliver 99.75%
    of them, within the search's tolerance: the search counted such a hold as kept up, then
    the validity gate voided its stage (a message lost at QoS 1) and with it the night's
    capacity. A probe or hold that lost a message at QoS 1 or 2 (whole-probe, from the
    summaries, as the gate counts it), or saw a duplicate at QoS 2, now fails with the
    gate's reason, and the next hold goes lower. QoS 0 promises nothing; a subscription
    the broker granted QoS 0 is held to QoS 0's promise, as the gate holds it."""
    from tasks.driver.output import COUNTER_COLUMNS
    from tasks.steps.stages import probe_outcome

    def probe(qos: int, unique: int, *, by_qos: int | None = None, duplicated: int = 0,
              hold: bool = False, summary_missing: bool = False) -> ProbeResult:
        planned = {"target_publish_rate": 1_000.0, "expected_delivery_rate": 1_000.0,
                   "qos": qos, "receivers": {"0": 1, "1": 1},
                   "windows": {"measure_start": 100, "measure_end": 104}}
        rows = [[second, 1_000, 1_000, 1_000 - (second == 101) * (4_000 - unique)]
                + [0] * (len(COUNTER_COLUMNS) - 4) for second in range(100, 104)]
        counters = "\n".join(",".join(map(str, row)) for row in [COUNTER_COLUMNS, *rows])
        publisher = {"last_seq": {"0": 2_000, "1": 2_000}, "totals": {"duplicated": 0}}
        subscriber = {"unique_received": unique, "totals": {"duplicated": duplicated},
                      "qos_judgement": {"by_qos": {str(qos if by_qos is None else by_qos):
                                                   {"unique": unique}}}}
        return probe_outcome(planned, [counters],
                             [publisher, {} if summary_missing else subscriber], hold=hold)

    lossy = probe(1, 3_990)
    assert lossy.received_ratio == pytest.approx(0.9975)  # within any tolerance
    assert not lossy.keeps_up(0.05)
    assert lossy.reason(0.05) == "10 messages lost at QoS 1, which promises delivery"
    assert not probe(1, 3_990, hold=True).keeps_up(0.05)
    assert probe(1, 4_000).keeps_up(0.05)
    assert probe(0, 3_990).keeps_up(0.05)  # QoS 0 allows loss: the aggregation notes it
    assert probe(1, 3_990, by_qos=0).keeps_up(0.05)  # granted QoS 0: held to QoS 0
    twice = probe(2, 4_000, duplicated=3)
    assert twice.reason(0.05) == "3 duplicates at QoS 2, which promises exactly once"
    assert probe(1, 4_000, duplicated=3).keeps_up(0.05)  # QoS 1 allows duplicates
    # a process that left no summary: its deliveries unknown, loss is not counted (as the
    # aggregation counts none); its counters still judge the probe
    assert probe(1, 3_990, summary_missing=True).keeps_up(0.05)

    outcome = _first_hold_failed(probe(1, 3_990, hold=True))
    assert outcome["holds"][0]["why"] == outcome["holds"][0]["broken"] == (
        "10 messages lost at QoS 1, which promises delivery")


def test_a_probe_is_judged_as_the_gate_judges_its_stage_and_a_line_cut_short_is_skipped():
    """The gate counts client errors over the whole stage and calls more than 105% of the
    expected deliveries off too (a backlog from before the window delivered in it): a
    hold that kept up by the search's old rules was then voided with the night's
    capacity. The search now judges both as the gate does. And a counters line cut short
    by a killed driver, which the aggregation drops as malformed, no longer ends the step
    with a TypeError."""
    from tasks.driver.output import COUNTER_COLUMNS
    from tasks.steps.stages import probe_outcome

    errors_at = COUNTER_COLUMNS.index("errors")

    def hold(delivered_per_s: list[int], *, warmup_errors: int = 0, tail: str = ""
             ) -> ProbeResult:
        planned = {"target_publish_rate": 1_000.0, "expected_delivery_rate": 1_000.0,
                   "qos": 0, "receivers": {"0": 1}, "windows": {
                       "measure_start": 100, "measure_end": 100 + len(delivered_per_s)}}
        warmup = [0] * len(COUNTER_COLUMNS)
        warmup[0], warmup[errors_at] = 99, warmup_errors
        rows = [warmup] + [[second, 1_000, 0, delivered] + [0] * (len(COUNTER_COLUMNS) - 4)
                           for second, delivered in enumerate(delivered_per_s, 100)]
        counters = "\n".join(",".join(map(str, row)) for row in [COUNTER_COLUMNS, *rows])
        return probe_outcome(planned, [counters + tail], [{}], hold=True)

    assert hold([1_000] * 4).keeps_up(0.05)
    errored = hold([1_000] * 4, warmup_errors=1)  # in the warm-up, outside the window
    assert errored.errors == 1 and errored.reason(0.05) == "1 client errors"
    over = hold([1_100, 1_100, 1_060, 1_060])  # 108%: the gate allows 95%..105%
    assert not over.keeps_up(0.05)
    assert over.reason(0.05) == ("received 108.0% of the expected deliveries (a backlog from "
                                 "before the window delivered in it)")
    cut = hold([1_000] * 4, tail="\n103,5")  # the last line cut short
    assert cut.keeps_up(0.05) and cut.received_ratio == 1.0

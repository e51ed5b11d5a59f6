"""The max-rate search against simulated brokers of known capacity (pure logic)."""

from __future__ import annotations

import pytest

from tasks.catalog.ratesearch import ProbeResult, RateSearch, SearchPolicy


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
    search = RateSearch(10_000, SearchPolicy(max_probes=20))
    rates = run(search, 1_800)
    assert rates[:3] == [10_000, 5_000, 2_500] and rates[3] < 2_500
    assert search.outcome()["converged"]


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

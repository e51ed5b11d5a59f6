"""The per-second tail and the stalls (`tasks.analysis.tails`): pure logic, no I/O."""

from __future__ import annotations

import random

from tasks.analysis.tails import STALL_FACTOR, stalled_seconds, tails_of_seconds
from tasks.driver.histogram import bucket_of, percentile

Histogram = dict[int, int]


def _histogram(values: list[int]) -> Histogram:
    counts: Histogram = {}
    for value in values:
        counts[bucket_of(value)] = counts.get(bucket_of(value), 0) + 1
    return counts


def _night(seed: int, late: dict[int, tuple[float, int]],
           scale: float = 1.0) -> dict[int, Histogram]:
    """30 seconds of 500 samples around 1 ms (x `scale`); in the seconds of `late`
    {second: (share, us)}, that share of the samples waits that many microseconds more."""
    rng, night = random.Random(seed), {}
    for second in range(30):
        values = [int(scale * rng.lognormvariate(7.0, 0.3)) for _ in range(500)]
        share, extra = late.get(second, (0.0, 0))
        cut = int(share * len(values))
        night[second] = _histogram([v + extra for v in values[:cut]] + values[cut:])
    return night


def _window_p99(night: dict[int, Histogram]) -> float:
    total: Histogram = {}
    for counts in night.values():
        for bucket, count in counts.items():
            total[bucket] = total.get(bucket, 0) + count
    return percentile(total, 99)


def test_stalls_are_counted_and_left_out_of_the_judged_tail():
    calm = _night(3, {})
    stalled = _night(3, {4: (0.2, 100_000), 17: (0.2, 40_000)})
    before, after = tails_of_seconds("e2e", calm), tails_of_seconds("e2e", stalled)
    assert after["e2e_stall_seconds"] == 2.0 and before["e2e_stall_seconds"] == 0.0
    # two stall seconds carry the window's p99 (200 of 15,000 samples late, 1.3%) ...
    assert _window_p99(stalled) > 10 * _window_p99(calm)
    # ... and not the judged tail, nor the typical second's
    assert abs(after["e2e_latency_p99_no_stall"] / before["e2e_latency_p99_no_stall"] - 1) < 0.02
    assert after["e2e_latency_p99_typical"] == before["e2e_latency_p99_typical"]
    # the longest stall: the worst second's largest delay beyond the typical latency
    assert 95_000 < after["e2e_stall_longest"] < 105_000
    assert before["e2e_stall_longest"] == 0.0
    # with nothing stalled, the judged tail is the window's p99
    assert before["e2e_latency_p99_no_stall"] == _window_p99(calm)


def test_a_tail_that_worsens_in_a_third_of_the_seconds_moves_the_judged_tail():
    """What the median over seconds would hide: 10 seconds in 30 with 3% of their samples
    5 ms late (no second reaches the stall factor)."""
    calm = tails_of_seconds("e2e", _night(5, {}))
    worse = tails_of_seconds("e2e", _night(5, {s: (0.03, 5_000) for s in range(0, 30, 3)}))
    assert worse["e2e_stall_seconds"] == 0.0
    assert worse["e2e_latency_p99_no_stall"] > 1.5 * calm["e2e_latency_p99_no_stall"]
    assert worse["e2e_latency_p99_typical"] < 1.1 * calm["e2e_latency_p99_typical"]


def test_a_slower_broker_moves_every_tail():
    fast, slow = (tails_of_seconds("e2e", _night(7, {}, scale)) for scale in (1.0, 1.3))
    for name in ("e2e_latency_p99_no_stall", "e2e_latency_p99_typical"):
        assert 1.25 < slow[name] / fast[name] < 1.35, name
    assert slow["e2e_stall_seconds"] == 0.0


def test_a_second_just_under_the_factor_is_no_stall():
    night = {s: _histogram([1000] * 100) for s in range(9)}
    night[9] = _histogram([1000] * 98 + [int(STALL_FACTOR * 1000 * 0.95)] * 2)
    assert tails_of_seconds("e2e", night)["e2e_stall_seconds"] == 0.0
    night[9] = _histogram([1000] * 98 + [int(STALL_FACTOR * 1000 * 1.05)] * 2)
    assert tails_of_seconds("e2e", night)["e2e_stall_seconds"] == 1.0


def test_no_samples_is_null_not_zero():
    assert tails_of_seconds("pub_ack", {}) == {
        "pub_ack_latency_p99_typical": None, "pub_ack_latency_p99_no_stall": None,
        "pub_ack_stall_seconds": None, "pub_ack_stall_longest": None}
    assert stalled_seconds([]) == []


def test_latencies_that_read_0_are_no_stalls():
    """Every sample in the lowest bucket (a receiver's clock behind the sender's reads
    them so): the typical second's p99 is 0, and no second counts as a stall against it."""
    night = {s: _histogram([0] * 100) for s in range(10)}
    tails = tails_of_seconds("e2e", night)
    assert tails["e2e_stall_seconds"] == 0.0
    assert tails["e2e_latency_p99_no_stall"] == _window_p99(night)

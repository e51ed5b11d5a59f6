"""Latency tails a nightly can trust, and the stalls that make them untrustworthy.

A latency tail over the whole measure window is set by stalls: one 100 ms pause of the
host's scheduler, or 40 ms of TCP waiting for a delayed ACK, delays every message sent
during it, so the window's p99 reads the stall, not how fast the broker delivers
(night-to-night noise of the window's e2e p99 here: 64% on a stage that stalled every
night, the batch of 2026-11-24 in `bench/noise_measured.json`'s ``earlier_batches``).
So a stage's tail is read per second:

- **the typical second's tail** (``<kind>_latency_p99_typical``): the median over the
  measure window's seconds of each second's p99 (read from that second's histogram summed
  over every driver process). A stall moves the seconds it hits, not the median.
- **stall seconds** (``<kind>_stall_seconds``): the seconds whose p99 is at least
  `STALL_FACTOR` times the typical second's, and **the longest stall**
  (``<kind>_stall_longest``): the largest latency in those seconds beyond the typical
  second's median latency, an estimate of how long delivery stood still.
- **the p99 without the stall seconds** (``<kind>_latency_p99_no_stall``): the window's
  p99 with those seconds' samples left out; the window's p99 itself when nothing stalled.
  This is the tail that is judged; the others are recorded beside it.

Why this one: `bench/measure_noise.py` measured the night-to-night noise of each
(``tail_estimators``, that batch's): over 12 nights of the smoke suite, on the stage where 1 to 3
seconds stalled every night, the window's p99 moved 64% (robust sigma; sd 89%), the
typical second's 9.0% (sd 15%) and the p99 without stall seconds 9.7% (sd 9.7%); on the
stages without stalls the last is the window's p99, and it was quieter than the typical
second's in 4 of those 5 stage-kinds. It also sees what the median over seconds hides:
a broker whose tail worsens in a third of the seconds moves it, and not the median.
Stalls are recorded, not judged: a stall's cause may be the host's scheduler, TCP or the
broker, and telling which takes a person. The ones measured here were TCP's: 40 ms each
(Nagle on the broker's side waiting for the subscriber's delayed ACK), 7 stall seconds in
4 smoke runs with Mosquitto's defaults and none in 4 with ``set_tcp_nodelay true``
(bench/README.md).
Pure logic, standard library only (the Spark job's driver side and the noise bench use it).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tasks.driver.histogram import percentile

STALL_FACTOR = 5.0  # a second's p99 this many times the typical second's: a stall


@dataclass(frozen=True)
class SecondTail:
    """One second of one latency kind, summed over every process of a stage (microseconds,
    bucket midpoints as `tasks.driver.histogram.percentile` reads them)."""

    second: int
    count: int
    p50: float
    p99: float
    max: float


def second_tail(second: int, counts: Mapping[int, int]) -> SecondTail:
    """One second's tail from its summed histogram {bucket: count} (not empty)."""
    return SecondTail(second, sum(counts.values()), percentile(counts, 50),
                      percentile(counts, 99), percentile(counts, 100))


def typical_p99(seconds: Iterable[SecondTail]) -> float | None:
    """The median over seconds of each second's p99; None without a second of samples."""
    values = [s.p99 for s in seconds if s.count > 0]
    return statistics.median(values) if values else None


def stalls(seconds: list[SecondTail]) -> list[SecondTail]:
    """The seconds whose p99 is at least STALL_FACTOR times the typical second's; none
    when the typical second's is 0 (latencies read as 0: no scale to call one a stall
    against, where every second would count)."""
    typical = typical_p99(seconds)
    if typical is None or typical <= 0:
        return []
    return [s for s in seconds if s.count > 0 and s.p99 >= STALL_FACTOR * typical]


def stalled_seconds(seconds: list[SecondTail]) -> list[int]:
    """The seconds `stalls` names, in order: the ones whose buckets a caller leaves out."""
    return sorted(s.second for s in stalls(seconds))


def tail_metrics(kind: str, seconds: list[SecondTail], window: Mapping[int, int],
                 stalled: Mapping[int, int]) -> dict[str, float | None]:
    """A stage's tail metrics of one latency kind (null without samples). `seconds`: each
    window second's tail; `window`: the window's summed histogram {bucket: count};
    `stalled`: the summed histogram of the seconds `stalled_seconds` names."""
    names = (f"{kind}_latency_p99_typical", f"{kind}_latency_p99_no_stall",
             f"{kind}_stall_seconds", f"{kind}_stall_longest")
    typical = typical_p99(seconds)
    if typical is None:
        return dict.fromkeys(names)
    stalled_tails = stalls(seconds)
    median_p50 = statistics.median(s.p50 for s in seconds if s.count > 0)
    longest = max((s.max - median_p50 for s in stalled_tails), default=0.0)
    calm = {b: n - stalled.get(b, 0) for b, n in window.items() if n > stalled.get(b, 0)}
    return dict(zip(names, (typical, percentile(calm, 99), float(len(stalled_tails)),
                            max(0.0, longest))))


def tails_of_seconds(kind: str, per_second: Mapping[int, Mapping[int, int]]
                     ) -> dict[str, float | None]:
    """`tail_metrics` from every window second's histogram {second: {bucket: count}}, for
    a caller that holds them all (the Spark job holds only what `tail_metrics` needs)."""
    tails = [second_tail(second, counts) for second, counts in sorted(per_second.items())
             if sum(counts.values()) > 0]
    stalled = set(stalled_seconds(tails))
    window: dict[int, int] = {}
    stall: dict[int, int] = {}
    for second, counts in sorted(per_second.items()):
        for bucket, count in counts.items():
            window[bucket] = window.get(bucket, 0) + count
            if second in stalled:
                stall[bucket] = stall.get(bucket, 0) + count
    return tail_metrics(kind, tails, window, stall)

"""Max-rate search: the highest rate the broker sustains, found the way the reports find it
(ramped up from below, then held long enough to show the throughput stable and the backlog
not rising). Pure: no I/O.

A probe is one short stage at one rate. It *keeps up* when the publishers sent what they
were asked to (no send backlog building up in the driver) and the subscribers received
what was expected, both within `tolerance`, with no client errors, no failed connect, a
subscription backlog that did not keep rising, and the promise of its QoS kept (no message
lost at QoS 1 or 2, no duplicate at QoS 2: `broken`, the validity gate's, whose stage it
would void; a broker that drops messages past a subscriber's queue at a rate has not kept
up with it, however few it dropped). A hold must also have delivered steadily
over its window (`unstable`: the validity gate's throughput CV, which judges its stage):
one the gate would call unstable has not shown the rate sustained, so the search holds
lower, as for one that fell behind, rather than vouch for a rate its stage is then
invalid at.

The search grows the rate by `growth` until a probe fails, backs off by the same factor
while the first one fails (or to just below what it delivered, when that is lower), and
then narrows the bracket between the highest probe that
kept up and the lowest that did not until they are within `precision` of each other (or
`max_probes` ran). Narrowing bisects geometrically, but a probe that fell behind also says
what the broker did deliver: when that estimate lies inside the bracket, the next probe
goes just below it (a broker that fell behind at 8,000 msg/s having delivered 5,100 is
next probed near 5,100, not at 5,700), and no rate above delivered / (1 - tolerance) can
keep up, which bounds the bracket from above.

With `hold_s`, the answer is then held: one more probe at the rate found, `hold_s` seconds
long; when it does not keep up over that longer window, the rate steps down (by
`precision`, or to just below what the failed hold delivered when that is lower, never
below what the best probe showed the broker sustains until a hold there failed too, then
`precision` lower, or just below the most any counted failed hold delivered when that is
lower, and no more holds under `min_rate`) and is held again, at most `holds` times. The
search's answer is the rate that held.

A search knows the capacity the stage last measured on the same fingerprint and setup.
A warm start begins 10% below it and steps by at most 10% within 0.81 to 1.2 times it,
by `growth` beyond (a broker that lost or gained most of its capacity since is found in
as many probes as a cold search takes). A probe or hold that falls behind below it contradicts the
earlier nights, and a window of a few seconds is short enough for one scheduler stall to
sink it, so it runs once more at the same rate before it counts (`retries` times a search
at most; set aside, it is still listed, marked `retried`, and counts for neither the
bracket nor `max_probes` and `holds`). A hold does so up to `tolerance` above it: it runs at
the best probe, which keeps up within that much, so on a night like the last ones the first
hold is usually just above the last capacity, where a stall would otherwise read as a loss. A broker that really lost capacity falls behind
again, and costs the search one probe or hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis.validity import Gates, driver_limit


@dataclass(frozen=True)
class SearchPolicy:
    growth: float = 2.0  # rate factor between probes until the first failure
    precision: float = 0.10  # stop when highest-ok and lowest-failed are this close
    max_probes: int = 8
    tolerance: float = 0.05  # sent and received within 5% of what was asked
    min_rate: float = 1.0  # msg/s: below this, give up backing off
    hold_s: int = 0  # hold the rate found for this long (0: no hold)
    holds: int = 2  # hold attempts, each lower than the last (one run again: not counted)
    retries: int = 1  # probes or holds that fell behind below last_capacity, run again
    # %: a driver process busier than this share of a core, or a host's driver processes
    # of the CPUs they may run on, may be the bottleneck (the validity gates' threshold)
    max_driver_cpu: float = Gates().max_driver_cpu_pct


WARM_BELOW = 0.9  # a warm start begins this far below the last capacity measured
WARM_GROWTH = 1.1  # ... and grows in steps of at most this near it
WARM_REACH = 1.2  # up to this much above it; beyond, and below WARM_BELOW**2 of it, the
# scenario's own growth again: a broker far from its last capacity is found in as few
# probes as a cold search would take (at 1.1 a step, 14 probes reached 3.1x the last
# capacity, or a third of it, and the search ended unconverged every night after)


@dataclass(frozen=True)
class ProbeResult:
    rate: float  # offered msg/s (all publishers)
    sent_ratio: float  # published / offered over the measure window
    received_ratio: float  # unique deliveries / expected over the measure window
    errors: int = 0
    # clients that never connected (a stage's validity gate too): the probe ran less load
    connects_failed: int = 0
    backlog: str | None = None  # why the subscription backlog kept rising, if it did
    unstable: str | None = None  # a hold's: why its deliveries were too unstable, if they were
    # what the deliveries broke of their QoS's promise (lost, duplicated), if anything
    broken: str | None = None
    driver_cpu: float | None = None  # the busiest driver process, % of a core, publishing
    # a host's driver processes over the CPUs they may run on, %, the highest host's
    drivers_cpus_used: float | None = None

    def keeps_up(self, tolerance: float) -> bool:
        """Sent and received what was asked within `tolerance` (more received than that
        is a backlog from before the window delivered in it, as the validity gate holds a
        stage to it), and nothing else went wrong."""
        return (self.sent_ratio >= 1 - tolerance
                and 1 - tolerance <= self.received_ratio <= 1 + tolerance
                and self.errors == 0 and self.connects_failed == 0 and self.backlog is None
                and self.unstable is None and self.broken is None)

    @property
    def delivered_rate(self) -> float:
        """What the broker took and delivered, as a rate of this probe's offer."""
        return self.rate * min(self.sent_ratio, self.received_ratio)

    def reason(self, tolerance: float) -> str:
        if self.keeps_up(tolerance):
            return "kept up"
        parts = []
        if self.sent_ratio < 1 - tolerance:
            parts.append(f"sent {self.sent_ratio:.1%} of the offered rate (send backlog)")
        if self.received_ratio < 1 - tolerance:
            parts.append(f"received {self.received_ratio:.1%} of the expected deliveries")
        if self.received_ratio > 1 + tolerance:
            parts.append(f"received {self.received_ratio:.1%} of the expected deliveries (a "
                         "backlog from before the window delivered in it)")
        if self.errors:
            parts.append(f"{self.errors} client errors")
        if self.connects_failed:
            parts.append(f"{self.connects_failed} connections failed")
        if self.backlog:
            parts.append(self.backlog)
        if self.unstable:
            parts.append(self.unstable)
        if self.broken:
            parts.append(self.broken)
        return "; ".join(parts)


@dataclass
class RateSearch:
    """A search from `start_rate`; with `warm` and a `last_capacity`, from WARM_BELOW of
    that capacity instead, in steps of at most WARM_GROWTH near it."""

    start_rate: float
    policy: SearchPolicy = SearchPolicy()
    last_capacity: float | None = None  # what the stage last measured, when known
    warm: bool = False
    probes: list[tuple[ProbeResult, bool]] = field(default_factory=list)
    held: list[tuple[ProbeResult, bool]] = field(default_factory=list)
    # positions in probes and held of the results set aside (each run again next at its
    # rate): listed where they ran, never counted
    probes_aside: set[int] = field(default_factory=set)
    held_aside: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.warm and self.last_capacity:
            self.start_rate = self.last_capacity * WARM_BELOW

    def _growth(self, rate: float) -> float:
        """The factor between probes from `rate`: small steps near the last capacity on a
        warm start, the scenario's `growth` elsewhere."""
        last = self.last_capacity
        if self.warm and last and last * WARM_BELOW ** 2 <= rate <= last * WARM_REACH:
            return min(self.policy.growth, WARM_GROWTH)
        return self.policy.growth

    @property
    def best(self) -> float | None:
        """The highest rate that kept up, if any."""
        ok = [p.rate for p, kept in self.probes if kept]
        return max(ok) if ok else None

    def record(self, probe: ProbeResult) -> bool:
        return self._record(probe, self.probes, self.probes_aside, below=1.0)

    def record_hold(self, probe: ProbeResult) -> bool:
        # a hold runs at the best probe, which keeps up within `tolerance`: one up to that
        # much above the last capacity is in line with the earlier nights too
        return self._record(probe, self.held, self.held_aside,
                            below=1 + self.policy.tolerance)

    def _record(self, probe: ProbeResult, into: list[tuple[ProbeResult, bool]],
                aside: set[int], below: float) -> bool:
        """Record a result; one that fell behind under `below` x the last capacity is set
        aside to run again (while the search has retries left)."""
        kept = probe.keeps_up(self.policy.tolerance)
        into.append((probe, kept))
        if (not kept and self.last_capacity is not None
                and probe.rate < self.last_capacity * below
                and len(self.probes_aside) + len(self.held_aside) < self.policy.retries):
            aside.add(len(into) - 1)
        return kept

    @property
    def retrying(self) -> bool:
        """Whether the result recorded last was set aside, to be run again at its rate."""
        return self._again(self.held, self.held_aside) is not None if self.held \
            else self._again(self.probes, self.probes_aside) is not None

    @staticmethod
    def _counted(entries: list[tuple[ProbeResult, bool]],
                 aside: set[int]) -> list[tuple[ProbeResult, bool]]:
        return [entry for i, entry in enumerate(entries) if i not in aside]

    @staticmethod
    def _again(entries: list[tuple[ProbeResult, bool]], aside: set[int]) -> float | None:
        """The rate of the last of `entries` when it was set aside: it runs again next."""
        return entries[-1][0].rate if len(entries) - 1 in aside else None

    @property
    def top(self) -> float | None:
        """The lowest rate known not to keep up: the lowest failed probe above `best`, or
        less where a failed probe delivered less (above delivered / (1 - tolerance) no probe
        can keep up, if a broker that fell behind delivers no more when offered more). A
        delivery estimate at or below `best` contradicts the probe that kept up there (the
        two probes saw different noise), so that probe bounds by its own rate."""
        best = self.best or 0.0
        bounds = []
        for p, kept in self._counted(self.probes, self.probes_aside):
            if not kept and p.rate > best:
                estimate = min(p.rate, p.delivered_rate / (1 - self.policy.tolerance))
                bounds.append(estimate if estimate > best else p.rate)
        return min(bounds) if bounds else None

    @property
    def converged(self) -> bool:
        best, top = self.best, self.top
        return best is not None and top is not None and top <= best * (1 + self.policy.precision)

    def _narrowed(self, best: float, top: float) -> float:
        """The next rate inside (best, top): just below what the lowest failed probe
        delivered when that lies inside, else the geometric middle."""
        step = 1 + self.policy.precision
        failed = [p for p, kept in self._counted(self.probes, self.probes_aside)
                  if not kept and p.rate > best]
        lowest = min(p.rate for p in failed)
        estimate = min(p.delivered_rate for p in failed if p.rate == lowest) \
            * (1 - self.policy.precision / 2)
        if best * step <= estimate <= top / step:
            return estimate
        return math.sqrt(best * top)

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when the search phase is over."""
        if not self.probes:
            return self.start_rate
        if (again := self._again(self.probes, self.probes_aside)) is not None:
            return again
        counted = self._counted(self.probes, self.probes_aside)
        if self.converged or len(counted) >= self.policy.max_probes:
            return None
        best, top = self.best, self.top
        if best is None:  # even the lowest probe failed: back off
            return self._backed_off(min((p for p, _ in counted), key=lambda p: p.rate))
        if top is None:  # never failed yet: keep growing
            return best * self._growth(best)
        return self._narrowed(best, top)

    def _backed_off(self, lowest: ProbeResult) -> float | None:
        """Below the lowest probe, which fell behind: one growth step lower, or just below
        what it delivered when that is lower still (a broker that delivered 20,000 of an
        offered 90,000 is next probed near 20,000, not at 81,800); None under `min_rate`."""
        rate = lowest.rate / self._growth(lowest.rate)
        delivered = lowest.delivered_rate * (1 - self.policy.precision / 2)
        if self.policy.min_rate <= delivered < rate:
            rate = delivered
        return rate if rate >= self.policy.min_rate else None

    def next_hold(self) -> float | None:
        """The next rate to hold for hold_s, or None when holding is over (or not asked)."""
        if not self.policy.hold_s or self.best is None or not self.converged:
            return None
        if (again := self._again(self.held, self.held_aside)) is not None:
            return again
        counted = self._counted(self.held, self.held_aside)
        if any(kept for _, kept in counted) or len(counted) >= self.policy.holds:
            return None
        if not self.held:
            return self.best
        return self._stepped_down(self.held[-1][0])

    def _stepped_down(self, failed: ProbeResult) -> float | None:
        """The rate to hold after `failed` did not hold: `precision` lower, or just below
        what it delivered when that is lower still. A probe keeps up within `tolerance`, so
        the rate found may be up to that much above what the broker sustains, and steps of
        `precision` alone would not reach it in `holds` tries; the broker sustained at least
        best x (1 - tolerance) in that probe, which bounds the step from below (one stalled
        hold cannot drag the answer down). Once the hold at that floor failed too, the holds
        that fell behind say what the broker sustains over `hold_s` better than a short probe
        does: `precision` lower, or just below the most any of them delivered when that is
        lower (one stalled hold among them cannot drag it down); None (no more holds) when
        that is below `min_rate`, as when a hold delivered nothing. Never the same rate
        twice."""
        policy = self.policy
        stepped = failed.rate / (1 + policy.precision)
        below = 1 - policy.precision / 2  # "just below" a rate
        floor = self.best * (1 - policy.tolerance) * below
        if failed.rate > floor * (1 + 1e-9):  # above it, not the floor as a stage ran it
            return max(min(stepped, failed.delivered_rate * below), floor)
        most = max(p.delivered_rate for p, kept in self._counted(self.held, self.held_aside)
                   if not kept)
        rate = min(stepped, most * below)
        return rate if rate >= policy.min_rate else None

    @property
    def max_rate(self) -> float | None:
        """The search's answer: the rate that held (with a hold), else the best probe."""
        if not self.policy.hold_s:
            return self.best
        held = [p.rate for p, kept in self.held if kept]
        return held[0] if held else None

    def _driver_at_answer(self) -> tuple[str, str] | None:
        """(what, what to add) when the load generator was at its limit at the answer
        (`tasks.analysis.validity.driver_limit`, at max_driver_cpu)."""
        answer = [p for p, kept in (self.held if self.policy.hold_s else self.probes)
                  if kept and p.rate == self.max_rate]
        if not answer:
            return None
        return driver_limit({"driver_cpu_max": answer[0].driver_cpu,
                             "drivers_cpus_used_pct": answer[0].drivers_cpus_used},
                            Gates(max_driver_cpu_pct=self.policy.max_driver_cpu))

    def outcome(self) -> dict:
        """What the run records: the answer and whether it can be trusted."""
        best, ceiling = self.best, self.top
        holding = bool(self.policy.hold_s)
        if not self.converged:
            if best is None:
                verdict = f"no probe kept up, down to {min(p.rate for p, _ in self.probes):.0f} msg/s"
            elif ceiling is None:
                verdict = (f"the broker kept up at every probe, up to {best:.0f} msg/s: raise "
                           "the start rate")
            else:
                again = (f" (and {len(self.probes_aside)} run again)" if self.probes_aside
                         else "")
                counted = len(self._counted(self.probes, self.probes_aside))
                verdict = (f"not converged after {counted} probes{again}: between {best:.0f} "
                           f"and {ceiling:.0f} msg/s")
        elif holding and self.max_rate is None:
            verdict = (f"no rate held for {self.policy.hold_s} s: tried "
                       + ", ".join(f"{p.rate:.0f} ({p.reason(self.policy.tolerance)}"
                                   f"{'; run again' if i in self.held_aside else ''})"
                                   for i, (p, _) in enumerate(self.held)))
        elif (limited := self._driver_at_answer()) is not None:
            what, add = limited
            verdict = (f"{what} at {self.max_rate:.0f} msg/s (over "
                       f"{self.policy.max_driver_cpu:.0f}%): the load generator may be what "
                       f"ran out, not the broker; add {add}")
        else:
            verdict = None

        def listed(probes: list[tuple[ProbeResult, bool]], aside: set[int]) -> list[dict]:
            return [{"rate": p.rate, "sent_ratio": p.sent_ratio, "received_ratio": p.received_ratio,
                     "errors": p.errors, "connects_failed": p.connects_failed, "kept_up": kept,
                     "why": p.reason(self.policy.tolerance),
                     # the reasons a stage's gate shares, each on its own (None: passed)
                     "unstable": p.unstable, "broken": p.broken,
                     "retried": i in aside, "driver_cpu": p.driver_cpu,
                     "drivers_cpus_used": p.drivers_cpus_used}
                    for i, (p, kept) in enumerate(probes)]

        # the rate that held, even when a verdict makes the search untrusted (a driver at its
        # limit there); else the best probe (no hold asked, not converged, or none held)
        answer = self.max_rate if self.max_rate is not None else best
        return {"max_rate": answer, "ceiling": ceiling,
                "converged": verdict is None, "reason": verdict,
                "probes": listed(self.probes, self.probes_aside),
                "holds": listed(self.held, self.held_aside), "hold_s": self.policy.hold_s}

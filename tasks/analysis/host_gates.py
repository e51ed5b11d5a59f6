"""Nights the broker's host was not itself: pure.

A metric gated by a figure of its host (`MetricDef.gated_by`) is not judged on a night that
figure was far off the host's usual, and such nights stay out of its baseline, noise and
change point (`tasks.analysis.nights`). Two figures gate, each with its own rule:

- the host's pace (`host_pace_us`, the CPU time a fixed piece of work took): a night more
  than `Policy.pace_gate` off the median of the newest `window` nights' (a ratio, either
  way), once `min_history` nights have one. On this machine's real nights every false
  change verdict of the latency metrics fell on such a night (bench/README.md).
- the host's steal (`host_steal_pct`, the time its virtual CPUs were ready to run while the
  hypervisor ran something else, % of one core): a night more than `Policy.steal_gate`
  points of a core above the median of the newest `window` nights that recorded one (one
  is enough). Only more steal disturbs. On this machine, nights of the slowdown test with
  47% and 58% of a core stolen (0-15% on the other nights of their histories) cost the
  broker 2.4x its CPU per message.

Against a release with no usual to go by (too few nights that recorded the figure: a stage
the nightly never ran), each of the two nights compared is judged against the other.
The rules are the detector's ("Host pace, host steal").
"""

from __future__ import annotations

import math
import statistics

from ..metrics import HOST_PACE, HOST_STEAL, METRICS, MetricDef
from .covariate import log_of
from .policy import Policy

USUAL_NIGHTS = "on its usual nights"  # what a night is compared with, given a usual


class HostGate:
    """One figure of the host that gates a metric: its usual over the recent nights, how far
    a night is off it (on the gate's own scale), and what a gated verdict says
    (`detail_key` in its detail, a note)."""

    figure: str
    detail_key: str

    def scale(self, value: float | None) -> float | None:
        """Where a value is compared (None: unusable)."""
        raise NotImplementedError

    def unscale(self, scaled: float) -> float:
        """A value from where it is compared."""
        raise NotImplementedError

    def beyond(self, off: float, policy: Policy) -> bool:
        """A night this far off the usual is not judged."""
        raise NotImplementedError

    def least_nights(self, policy: Policy) -> int:
        """The nights that must have recorded the figure for a usual."""
        raise NotImplementedError

    def amount(self, off: float) -> float:
        """How far off, as the verdict's detail says it."""
        raise NotImplementedError

    def said(self, value: float, off: float) -> str:
        """What the host did, in words: 'ran 32% slower'."""
        raise NotImplementedError

    def short(self, amount: float) -> str:
        """What the host did in a table's cell, from the detail's amount."""
        raise NotImplementedError

    def usual(self, history: list[dict], policy: Policy) -> float | None:
        """The median (scaled) over the newest `window` nights that recorded the figure
        (held-out and gated nights count: the usual is the host's, whatever a metric did);
        None with fewer than `least_nights`."""
        values = [x for night in history[:policy.window]
                  if (x := self.scale(night["metrics"].get(self.figure))) is not None]
        return statistics.median(values) if len(values) >= self.least_nights(policy) else None

    def off(self, value: float | None, usual: float | None, policy: Policy) -> float | None:
        """How far (scaled) a night's figure is from the usual, when beyond the gate; None
        when it is not, or either is unknown."""
        tonight = self.scale(value)
        if tonight is None or usual is None:
            return None
        off = tonight - usual
        return off if self.beyond(off, policy) else None

    def gated(self, night: str, value: float, off: float, against: str) -> dict:
        """The detail of a verdict not judged: how far off, and why in words. `night`:
        'tonight' or 'on the release night'; `against`: what the usual was ('on its usual
        nights', 'on the night it is compared with')."""
        usual = self.unscale(self.scale(value) - off)
        median = "their median " if against == USUAL_NIGHTS else ""
        return {self.detail_key: self.amount(off), "note": (
            f"not judged: {night} {self.said(value, off)} than {against} ({self.figure} "
            f"{value:.4g} against {median}{usual:.4g})")}


class PaceGate(HostGate):
    figure, detail_key = HOST_PACE, "off_pace_pct"

    def scale(self, value: float | None) -> float | None:
        return log_of(value)

    def unscale(self, scaled: float) -> float:
        return math.exp(scaled)

    def beyond(self, off: float, policy: Policy) -> bool:
        return (off > math.log1p(policy.pace_gate)
                or off < math.log1p(-min(policy.pace_gate, 0.99)))

    def least_nights(self, policy: Policy) -> int:
        return policy.min_history

    def amount(self, off: float) -> float:
        return round(100 * math.expm1(off), 1)

    def said(self, value: float, off: float) -> str:
        return f"the host ran {abs(math.expm1(off)):.0%} {'slower' if off > 0 else 'faster'}"

    def short(self, amount: float) -> str:
        return f"host off its pace {amount:+.0f}%"


class StealGate(HostGate):
    figure, detail_key = HOST_STEAL, "steal_over_pct"

    def scale(self, value: float | None) -> float | None:
        return value if value is not None and value >= 0 else None

    def unscale(self, scaled: float) -> float:
        return scaled

    def beyond(self, off: float, policy: Policy) -> bool:
        return off > policy.steal_gate

    def least_nights(self, policy: Policy) -> int:
        return 1

    def amount(self, off: float) -> float:
        return round(off, 1)

    def said(self, value: float, off: float) -> str:
        return (f"the hypervisor took {value:.1f}% of a core from the host, {off:.1f} points "
                "more")

    def short(self, amount: float) -> str:
        return f"host's steal +{amount:.1f} points of a core"


GATES: dict[str, HostGate] = {gate.figure: gate for gate in (PaceGate(), StealGate())}


def gated_note(detail: dict) -> str | None:
    """A table cell's note for a verdict not judged as its host was off its usual (its
    detail, stored ones of any age); None for another."""
    return next((gate.short(detail[gate.detail_key]) for gate in GATES.values()
                 if gate.detail_key in detail), None)


def check_gates(defs: dict[str, MetricDef] = METRICS) -> None:
    """Every figure a metric is gated by (`MetricDef.gated_by`) has its rule here: one
    without would fail only when a night is compared."""
    missing = sorted({figure for m in defs.values() for figure in m.gated_by} - set(GATES))
    if missing:
        raise ValueError(f"tasks.metrics gates metrics by {missing}, which "
                         "tasks.analysis.host_gates has no rule for: add a HostGate to GATES")


check_gates()

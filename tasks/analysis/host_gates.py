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
  points of a core above the median of the newest `window` nights that recorded one (0
  before any did: a host steals nothing until it shows it). Only more steal disturbs.
  On this machine, nights of the slowdown test with 47% and 58% of a core stolen (0-15% on
  the other nights of their histories) cost the broker 2.4x its CPU per message.

The rules are the detector's ("Host pace, host steal").
"""

from __future__ import annotations

import math
import statistics

from ..metrics import HOST_PACE, HOST_STEAL
from .covariate import log_of
from .policy import Policy


class HostGate:
    """One figure of the host that gates a metric: its usual over the recent nights, how far
    a night is off it (on the gate's own scale), and what a gated verdict says."""

    figure: str

    def scale(self, value: float | None) -> float | None:
        """Where a value is compared (None: unusable)."""
        raise NotImplementedError

    def beyond(self, off: float, policy: Policy) -> bool:
        """A night this far off the usual is not judged."""
        raise NotImplementedError

    def too_few(self, policy: Policy) -> tuple[int, float | None]:
        """(the nights the usual needs, the usual with fewer: None for no gate)."""
        raise NotImplementedError

    def detail(self, off: float) -> dict:
        """The verdict detail that says the night was gated, and by how much."""
        raise NotImplementedError

    def note(self, night: str, value: float, off: float) -> str:
        """Why a metric was not judged: `night` ('tonight', 'on the release night')."""
        raise NotImplementedError

    def usual(self, history: list[dict], policy: Policy) -> float | None:
        """The median (scaled) over the newest `window` nights that recorded the figure
        (held-out and gated nights count: the usual is the host's, whatever a metric did)."""
        values = [x for night in history[:policy.window]
                  if (x := self.scale(night["metrics"].get(self.figure))) is not None]
        least, without = self.too_few(policy)
        return statistics.median(values) if len(values) >= least else without

    def off(self, value: float | None, usual: float | None, policy: Policy) -> float | None:
        """How far (scaled) a night's figure is from the usual, when beyond the gate; None
        when it is not, or either is unknown."""
        tonight = self.scale(value)
        if tonight is None or usual is None:
            return None
        off = tonight - usual
        return off if self.beyond(off, policy) else None


class PaceGate(HostGate):
    figure = HOST_PACE

    def scale(self, value: float | None) -> float | None:
        return log_of(value)

    def beyond(self, off: float, policy: Policy) -> bool:
        return (off > math.log1p(policy.pace_gate)
                or off < math.log1p(-min(policy.pace_gate, 0.99)))

    def too_few(self, policy: Policy) -> tuple[int, float | None]:
        return policy.min_history, None

    def detail(self, off: float) -> dict:
        return {"off_pace_pct": round(100 * math.expm1(off), 1)}

    def note(self, night: str, value: float, off: float) -> str:
        return (f"not judged: {night} the host ran {abs(math.expm1(off)):.0%} "
                f"{'slower' if off > 0 else 'faster'} than on its usual nights "
                f"({self.figure} {value:.4g} against their median {value / math.exp(off):.4g})")


class StealGate(HostGate):
    figure = HOST_STEAL

    def scale(self, value: float | None) -> float | None:
        return value if value is not None and value >= 0 else None

    def beyond(self, off: float, policy: Policy) -> bool:
        return off > policy.steal_gate

    def too_few(self, policy: Policy) -> tuple[int, float | None]:
        return 1, 0.0

    def detail(self, off: float) -> dict:
        return {"steal_over_pct": round(off, 1)}

    def note(self, night: str, value: float, off: float) -> str:
        return (f"not judged: {night} the hypervisor took {value:.0f}% of a core from the "
                f"host, {off:.0f} points more than on its usual nights ({self.figure} "
                f"{value:.3g} against their median {value - off:.3g})")


GATES: dict[str, HostGate] = {gate.figure: gate for gate in (PaceGate(), StealGate())}
# the detail keys of a gated verdict (`HostGate.detail`): what the views count as not judged
GATED_DETAILS = ("off_pace_pct", "steal_over_pct")

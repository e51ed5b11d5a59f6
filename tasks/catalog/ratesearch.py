"""Max-rate search: raise the offered rate while the broker keeps up, back off when it
does not, and narrow down to the highest sustained rate. Pure: no I/O.

A probe is one short stage at one rate. It *keeps up* when the publishers sent what they
were asked to (no send backlog building up in the driver) and the subscribers received
what was expected, both within `tolerance`, with no client errors. The search grows the
rate by `growth` until a probe fails, backs off by the same factor while the first one
fails, and then bisects geometrically between the highest probe that kept up and the
lowest that did not, until they are within `precision` of each other (so the answer is
within `precision` of the rate where the backlog starts to grow) or `max_probes` ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SearchPolicy:
    growth: float = 2.0  # rate factor between probes until the first failure
    precision: float = 0.10  # stop when highest-ok and lowest-failed are this close
    max_probes: int = 8
    tolerance: float = 0.05  # sent and received within 5% of what was asked
    min_rate: float = 1.0  # msg/s: below this, give up backing off


@dataclass(frozen=True)
class ProbeResult:
    rate: float  # offered msg/s (all publishers)
    sent_ratio: float  # published / offered over the measure window
    received_ratio: float  # unique deliveries / expected over the measure window
    errors: int = 0

    def keeps_up(self, tolerance: float) -> bool:
        return (self.sent_ratio >= 1 - tolerance and self.received_ratio >= 1 - tolerance
                and self.errors == 0)

    def reason(self, tolerance: float) -> str:
        if self.keeps_up(tolerance):
            return "kept up"
        parts = []
        if self.sent_ratio < 1 - tolerance:
            parts.append(f"sent {self.sent_ratio:.1%} of the offered rate (send backlog)")
        if self.received_ratio < 1 - tolerance:
            parts.append(f"received {self.received_ratio:.1%} of the expected deliveries")
        if self.errors:
            parts.append(f"{self.errors} client errors")
        return "; ".join(parts)


@dataclass
class RateSearch:
    start_rate: float
    policy: SearchPolicy = SearchPolicy()
    probes: list[tuple[ProbeResult, bool]] = field(default_factory=list)

    @property
    def best(self) -> float | None:
        """The highest rate that kept up, if any."""
        ok = [p.rate for p, kept in self.probes if kept]
        return max(ok) if ok else None

    @property
    def ceiling(self) -> float | None:
        """The lowest rate that did not keep up above `best`, if any."""
        best = self.best or 0.0
        failed = [p.rate for p, kept in self.probes if not kept and p.rate > best]
        return min(failed) if failed else None

    def record(self, probe: ProbeResult) -> bool:
        kept = probe.keeps_up(self.policy.tolerance)
        self.probes.append((probe, kept))
        return kept

    @property
    def converged(self) -> bool:
        best, ceiling = self.best, self.ceiling
        return best is not None and ceiling is not None and ceiling <= best * (1 + self.policy.precision)

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when the search is over."""
        if not self.probes:
            return self.start_rate
        if self.converged or len(self.probes) >= self.policy.max_probes:
            return None
        best, ceiling = self.best, self.ceiling
        if best is None:  # even the lowest probe failed: back off
            rate = min(p.rate for p, _ in self.probes) / self.policy.growth
            return rate if rate >= self.policy.min_rate else None
        if ceiling is None:  # never failed yet: keep growing
            return best * self.policy.growth
        return math.sqrt(best * ceiling)

    def outcome(self) -> dict:
        """What the run records: the answer and whether it can be trusted."""
        best, ceiling = self.best, self.ceiling
        if self.converged:
            verdict = None
        elif best is None:
            verdict = f"no probe kept up, down to {min(p.rate for p, _ in self.probes):.0f} msg/s"
        elif ceiling is None:
            verdict = f"the broker kept up at every probe, up to {best:.0f} msg/s: raise the start rate"
        else:
            verdict = (f"not converged after {len(self.probes)} probes: between {best:.0f} "
                       f"and {ceiling:.0f} msg/s")
        return {"max_rate": best, "ceiling": ceiling, "converged": self.converged,
                "reason": verdict,
                "probes": [{"rate": p.rate, "sent_ratio": p.sent_ratio,
                            "received_ratio": p.received_ratio, "errors": p.errors,
                            "kept_up": kept, "why": p.reason(self.policy.tolerance)}
                           for p, kept in self.probes]}

"""Validity gates from the reports: a stage that fails one is reported but never compared.

Pure: metrics in, (validity, reasons) out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..metrics import backlog


@dataclass(frozen=True)
class Gates:
    rate_tolerance: float = 0.05  # delivered within 5% of target ("follows the theoretical max")
    max_throughput_cv: float = 0.25  # per-second delivered rate stable over the window
    max_errors: int = 0
    max_driver_cpu_pct: float = 90.0  # a driver process busier than this may be the bottleneck
    # backlog (published x receivers - delivered, cumulative) may not rise in most seconds
    # of the window and grow by more than this share of the window's expected deliveries
    max_backlog_growth: float = 0.02
    rising_share: float = 0.8


def backlog_rising(series: dict, fan_out: float, gates: Gates = Gates()) -> str | None:
    """Why the subscription backlog kept rising over the window, or None. `fan_out`:
    deliveries expected per message published (expected delivery rate / target rate)."""
    published, delivered = series.get("published_per_s") or [], series.get("delivered_per_s") or []
    if len(published) < 2 or len(published) != len(delivered) or fan_out <= 0:
        return None
    owed = backlog(published, delivered, fan_out)
    expected = sum(published) * fan_out
    growth = owed[-1]
    rising = sum(1 for before, after in zip([0.0, *owed], owed) if after > before)
    if expected and growth > gates.max_backlog_growth * expected \
            and rising >= gates.rising_share * len(owed):
        return (f"backlog rose in {rising} of {len(owed)} seconds, by {growth:,.0f} messages "
                f"({growth / expected:.1%} of the window's deliveries): the broker fell behind")
    return None


def judge(metrics: dict, *, qos: int, aggregation_status: str, problems: list[str],
          series: dict | None = None, gates: Gates = Gates()) -> tuple[str, list[str]]:
    reasons = []
    if aggregation_status != "ok":
        reasons.append(f"aggregation {aggregation_status}: " + "; ".join(problems[:3]))
    ratio = metrics.get("achieved_ratio")
    if ratio is None:
        reasons.append("no delivered-rate target to check against")
    elif abs(ratio - 1.0) > gates.rate_tolerance:
        reasons.append(f"delivered {ratio:.1%} of the target rate "
                       f"(allowed {1 - gates.rate_tolerance:.0%}..{1 + gates.rate_tolerance:.0%})")
    cv = metrics.get("throughput_cv")
    if cv is not None and cv > gates.max_throughput_cv:
        reasons.append(f"throughput unstable over the window (CV {cv:.2f} > {gates.max_throughput_cv})")
    if ratio and metrics.get("target_rate") and metrics.get("delivered_rate"):
        fan_out = metrics["delivered_rate"] / ratio / metrics["target_rate"]
        backlog = backlog_rising(series or {}, fan_out, gates)
        if backlog:
            reasons.append(backlog)
    driver_cpu = metrics.get("driver_cpu_max")
    if driver_cpu is not None and driver_cpu > gates.max_driver_cpu_pct:
        reasons.append(f"a driver process used {driver_cpu:.0f}% of a core while publishing "
                       f"(over {gates.max_driver_cpu_pct:.0f}%): the load generator may be "
                       "the bottleneck; add driver processes or hosts")
    if (metrics.get("errors") or 0) > gates.max_errors:
        reasons.append(f"{metrics['errors']:.0f} client errors")
    if qos >= 1 and (metrics.get("lost") or 0) > 0:
        reasons.append(f"{metrics['lost']:.0f} messages lost at QoS {qos}, which promises delivery")
    if qos == 2 and (metrics.get("duplicated") or 0) > 0:
        reasons.append(f"{metrics['duplicated']:.0f} duplicates at QoS 2, which promises exactly once")
    return ("invalid" if reasons else "valid"), reasons

"""Validity gates from the reports: a stage that fails one is reported but never compared.

Pure: metrics in, (validity, reasons) out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gates:
    rate_tolerance: float = 0.05  # delivered within 5% of target ("follows the theoretical max")
    max_throughput_cv: float = 0.25  # per-second delivered rate stable over the window
    max_errors: int = 0


def judge(metrics: dict, *, qos: int, aggregation_status: str, problems: list[str],
          gates: Gates = Gates()) -> tuple[str, list[str]]:
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
    if (metrics.get("errors") or 0) > gates.max_errors:
        reasons.append(f"{metrics['errors']:.0f} client errors")
    if qos >= 1 and (metrics.get("lost") or 0) > 0:
        reasons.append(f"{metrics['lost']:.0f} messages lost at QoS {qos}, which promises delivery")
    if qos == 2 and (metrics.get("duplicated") or 0) > 0:
        reasons.append(f"{metrics['duplicated']:.0f} duplicates at QoS 2, which promises exactly once")
    return ("invalid" if reasons else "valid"), reasons

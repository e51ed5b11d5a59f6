"""Validity gates from the reports: a stage that fails one is reported but never compared.

Pure: metrics in, (validity, reasons) out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..metrics import backlog


@dataclass(frozen=True)
class Gates:
    rate_tolerance: float = 0.05  # delivered within 5% of target ("follows the theoretical max")
    max_throughput_cv: float = 0.25  # per-second delivered rate stable over the window
    max_errors: int = 0
    # a client that never connected (refused, or no CONNACK by the connect deadline; either
    # counts here, not among the errors): the stage ran a smaller load than it planned
    max_connects_failed: int = 0
    # a driver process busier than this (% of a core), or a host's driver processes over
    # this share of the CPUs they may run on, may be the bottleneck
    max_driver_cpu_pct: float = 90.0
    # backlog (published x receivers - delivered, cumulative) may not rise in most seconds
    # of the window and grow by more than this share of the window's expected deliveries
    max_backlog_growth: float = 0.02
    rising_share: float = 0.8


def deliveries_per_message(expected_delivery_rate: float | None,
                           target_rate: float | None) -> float | None:
    """Deliveries expected per message published: the stage's expected delivery rate over
    its publish rate (None where either is unknown), as the search, the gates and the
    aggregation's backlog read it."""
    if expected_delivery_rate is None or not target_rate:
        return None
    return expected_delivery_rate / target_rate


def throughput_cv(delivered_per_s: list[int]) -> float | None:
    """How unstable a window's deliveries were: the coefficient of variation of its
    per-second deliveries (the aggregation's `throughput_cv`, and a search's holds as
    they end); None under two seconds or with nothing delivered."""
    if len(delivered_per_s) < 2 or not statistics.fmean(delivered_per_s):
        return None
    return statistics.pstdev(delivered_per_s) / statistics.fmean(delivered_per_s)


def unstable(cv: float | None, gates: Gates = Gates()) -> str | None:
    """Why the deliveries were too unstable over the window (`throughput_cv`), or None."""
    if cv is not None and cv > gates.max_throughput_cv:
        return f"throughput unstable over the window (CV {cv:.2f} > {gates.max_throughput_cv})"
    return None


RISE = 0.5  # messages: a backlog that grew less in a second did not rise (rounding)


def backlog_rising(series: dict, fan_out: float | None, gates: Gates = Gates()) -> str | None:
    """Why the subscription backlog kept rising over the window, or None. `fan_out`:
    deliveries expected per message published (`deliveries_per_message`). A second counts
    as rising when the backlog grew by `RISE` or more: a fan-out read from rounded rates
    is a hair off 1, and a second that owed 2e-7 messages more once counted, turning a
    hold that kept up into one that fell behind (the search and the gates disagreed)."""
    published, delivered = series.get("published_per_s") or [], series.get("delivered_per_s") or []
    if len(published) < 2 or len(published) != len(delivered) or fan_out is None or fan_out <= 0:
        return None  # fan_out None: the stage's rates unknown
    owed = backlog(published, delivered, fan_out)
    expected = sum(published) * fan_out
    growth = owed[-1]
    rising = sum(1 for before, after in zip([0.0, *owed], owed) if after - before >= RISE)
    if expected and growth > gates.max_backlog_growth * expected \
            and rising >= gates.rising_share * len(owed):
        return (f"backlog rose in {rising} of {len(owed)} seconds, by {growth:,.0f} messages "
                f"({growth / expected:.1%} of the window's deliveries): the broker fell behind")
    return None


def process_cpu_pct(summary: Mapping) -> float | None:
    """A driver process's CPU over its publish phase (its summary's `publish_cpu`: warm-up
    and measure window) in % of one core; None where it did not record it."""
    cpu = summary.get("publish_cpu") or {}
    return 100 * cpu["cpu_s"] / cpu["wall_s"] if cpu.get("wall_s") else None


def drivers_cpus_used_pct(summaries: Iterable[Mapping]) -> float | None:
    """The driver processes' CPU summed over the CPUs they may run on (their summaries'
    `cpus`), per host and set of CPUs, where that is highest. Processes that share CPUs can
    use them up while none of them is busy: the two a search runs on the one CPU that
    `broker.cpus: '0'` leaves on a 2-CPU host show 50% each. A process that recorded no CPU
    or no CPUs (or no summary) is left out, so this is a lower bound; None when none
    recorded both. It counts the drivers only: CPUs they share with the broker (unpinned)
    can be full at a lower figure, which the capacity note reads from the host's CPU."""
    groups: dict[tuple[object, frozenset[int]], float] = {}
    for summary in summaries:
        used, cpus = process_cpu_pct(summary), summary.get("cpus")
        if used is not None and cpus:
            key = (summary.get("host"), frozenset(cpus))
            groups[key] = groups.get(key, 0.0) + used
    return max((used / len(cpus) for (_, cpus), used in groups.items()), default=None)


def _idle_pct(summary: Mapping) -> float | None:
    """A summary's `publish_cpu.cpus_idle_pct`: the % of its publish phase the CPUs the
    process may run on were idle, whoever kept them busy."""
    return (summary.get("publish_cpu") or {}).get("cpus_idle_pct")


def _least_idle(summaries: Iterable[Mapping]) -> Mapping | None:
    """The summary whose CPUs were the least idle; None when none recorded it."""
    return min((s for s in summaries if _idle_pct(s) is not None), key=_idle_pct, default=None)


def driver_hosts_idle_pct(summaries: Iterable[Mapping]) -> float | None:
    """The least idle of the driver processes' CPUs over their publish phase
    (`_idle_pct`): DESIGN.md's driver host idle CPU. None when no process recorded it."""
    least = _least_idle(summaries)
    return _idle_pct(least) if least is not None else None


# a driver's CPUs (on a host apart from the broker's) idle less than this share of its
# publish phase: said on the stage
DRIVER_IDLE_NOTE_PCT = 10.0


def driver_idle_note(summaries: list[Mapping], broker_host: str | None) -> str | None:
    """What a stage says when the CPUs of its driver processes on hosts of their own were
    rarely idle while they published (`driver_hosts_idle_pct` of those): something else
    kept them busy, and a driver kept waiting for a CPU sends late, so the load may have
    been the host's and not the broker's. A note, not a gate. Drivers on the broker's host
    are left out: a broker at its capacity keeps their CPUs busy, as a search means it to
    (the capacity's own note reads the host's CPU)."""
    apart = [summary for summary in summaries if summary.get("host") != broker_host]
    least = _least_idle(apart)
    if least is None or (idle := _idle_pct(least)) >= DRIVER_IDLE_NOTE_PCT:
        return None
    used = drivers_cpus_used_pct([s for s in apart if s.get("host") == least.get("host")])
    theirs = f" ({used:.0f}% by the drivers themselves)" if used is not None else ""
    return (f"the CPUs a driver process may run on were idle {idle:.0f}% of its publish "
            f"phase{theirs}: a driver kept waiting for a CPU sends late, so the load "
            "generator may have been short of CPU")


def driver_limit(metrics: Mapping, gates: Gates = Gates()) -> tuple[str, str] | None:
    """(what, what to add) when the load generator may have been the bottleneck: a host's
    driver processes over `max_driver_cpu_pct` of the CPUs they may run on (more processes
    would not help), or one driver process over that share of a core
    (`drivers_cpus_used_pct`, `driver_cpu_max`)."""
    limit = gates.max_driver_cpu_pct
    busiest, shared = metrics.get("driver_cpu_max"), metrics.get("drivers_cpus_used_pct")
    if shared is not None and shared > limit:
        return (f"the driver processes of one host used {shared:.0f}% of the CPUs they may run "
                "on", "driver hosts, or CPUs for them (fewer in broker.cpus)")
    if busiest is not None and busiest > limit:
        return (f"a driver process used {busiest:.0f}% of a core",
                "more driver processes (procs; search_procs for a search) or driver hosts")
    return None


# a stage the aggregation did not find ok: the first of its problems its reason names
REASON_PROBLEMS = 3


def stage_notes(aggregation_status: str, problems: list[str]) -> list[str]:
    """What the aggregation said of a stage that `judge`'s reasons do not: every problem
    of a stage aggregated ok (notices only), those past the first `REASON_PROBLEMS` else."""
    return list(problems) if aggregation_status == "ok" else problems[REASON_PROBLEMS:]


def promised_qos(qos: int, metrics: Mapping) -> int:
    """The QoS whose promise a stage's deliveries are held to: the stage's, or the highest
    one its subscribers received at (`delivery_qos`) where that is lower, the broker having
    granted less: RabbitMQ's MQTT plugin grants QoS 1 to a QoS 2 subscription, and QoS 1
    allows duplicates."""
    delivered = metrics.get("delivery_qos")
    return min(qos, int(delivered)) if delivered is not None else qos


def delivered_qos(summaries: Iterable[Mapping]) -> int | None:
    """The highest QoS at which the subscribers received any of the stage's messages (a
    delivery's QoS is the lower of the publish's and what the broker granted the
    subscription): the aggregation's `delivery_qos`, from the processes' summaries. None
    when nothing was received."""
    seen = [int(qos) for summary in summaries
            for qos, entry in ((summary.get("qos_judgement") or {}).get("by_qos") or {}).items()
            if entry.get("unique")]
    return max(seen, default=None)


@dataclass(frozen=True)
class Loss:
    """A stage's messages against its deliveries, from its processes' summaries: each
    publisher's last sequence number times the subscribers that should get its messages
    (stage.json's ``receivers``), against the unique deliveries the subscribers counted.
    Whole-stage: a message the broker dropped is lost whenever it was sent."""

    expected: int
    unique: int
    unmatched: tuple[str, ...] = ()  # "publisher I of HOST/PROC": none in ``receivers``
    # missing deliveries that may be of messages the broker had not acknowledged when the
    # drain ended (the publishers' ``unacked_by_stream`` times their receivers), at most
    # what is missing beyond the subscribers' gaps: a gap is a message the broker took
    # before a later one it delivered, so it broke the promise whatever was unacknowledged
    unacked: int = 0

    @property
    def lost(self) -> int:
        return max(0, self.expected - self.unique)


def message_loss(summaries: Iterable[Mapping], receivers: Mapping[str, int]) -> Loss:
    """The stage's `Loss` (the aggregation's ``lost`` metric, and a search's probes)."""
    expected = unique = unacked = gaps = 0
    unmatched = []
    for summary in summaries:
        for index, last_seq in sorted((summary.get("last_seq") or {}).items()):
            if str(index) not in receivers:
                unmatched.append(f"publisher {index} of {summary.get('host')}/"
                                 f"{summary.get('proc')}")
            expected += int(last_seq) * int(receivers.get(str(index), 0))
        unique += int(summary.get("unique_received") or 0)
        unacked += sum(int(n) * int(receivers.get(str(index), 0))
                       for index, n in (summary.get("unacked_by_stream") or {}).items())
        gaps += int(summary.get("missing_at_end") or 0)
    owed = min(unacked, max(0, expected - unique - gaps))
    return Loss(expected, unique, tuple(unmatched), owed)


def broken_promises(qos: int, lost: float, duplicated: float, unacked: float = 0) -> list[str]:
    """What the deliveries broke of the promise of the QoS they are held to
    (`promised_qos`): a message lost at QoS 1 or 2, a duplicate at QoS 2. A validity gate
    of a stage, and what makes a search's probe or hold fail (the broker did not keep up
    its promise at that rate). QoS 1 and 2 promise only what the broker acknowledged: of
    the deliveries missing, up to `unacked` (`Loss.unacked`) were of messages it had not
    acknowledged when the drain ended, and break no promise."""
    reasons = []
    promised_lost = max(0.0, lost - unacked)
    if qos >= 1 and promised_lost > 0:
        of_acked = " the broker acknowledged" if unacked else ""
        reasons.append(f"{promised_lost:.0f} messages{of_acked} lost at QoS {qos}, which "
                       "promises delivery")
    if qos == 2 and duplicated > 0:
        reasons.append(f"{duplicated:.0f} duplicates at QoS 2, which promises exactly once")
    return reasons


def judge(metrics: dict, *, qos: int, aggregation_status: str, problems: list[str],
          series: dict | None = None, gates: Gates = Gates()) -> tuple[str, list[str]]:
    reasons = []
    if aggregation_status != "ok":
        reasons.append(f"aggregation {aggregation_status}: "
                       + "; ".join(problems[:REASON_PROBLEMS]))
    ratio = metrics.get("achieved_ratio")
    if ratio is None:
        reasons.append("no expected delivery rate to check against")
    elif abs(ratio - 1.0) > gates.rate_tolerance:
        reasons.append(f"delivered {ratio:.1%} of the expected delivery rate "
                       f"(allowed {1 - gates.rate_tolerance:.0%}..{1 + gates.rate_tolerance:.0%})")
    if shaky := unstable(metrics.get("throughput_cv"), gates):
        reasons.append(shaky)
    backlog = backlog_rising(series or {}, deliveries_per_message(
        metrics.get("expected_delivery_rate"), metrics.get("target_rate")), gates)
    if backlog:
        reasons.append(backlog)
    if limited := driver_limit(metrics, gates):
        what, add = limited
        reasons.append(f"{what} while publishing (over {gates.max_driver_cpu_pct:.0f}%): the "
                       f"load generator may be the bottleneck; add {add}")
    if (metrics.get("errors") or 0) > gates.max_errors:
        reasons.append(f"{metrics['errors']:.0f} client errors")
    failed = metrics.get("connects_failed") or 0
    if failed > gates.max_connects_failed:
        tried = failed + (metrics.get("connects_ok") or 0)
        reasons.append(f"{failed:.0f} of {tried:.0f} connections failed (refused, or no CONNACK "
                       "by the connect deadline): the stage ran fewer clients than planned")
    reasons += broken_promises(promised_qos(qos, metrics), metrics.get("lost") or 0,
                               metrics.get("duplicated") or 0,
                               metrics.get("unacked_deliveries") or 0)
    return ("invalid" if reasons else "valid"), reasons

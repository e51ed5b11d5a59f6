"""Per-stage metric names, units and better-direction, and the words perfpipe judges them
with (verdicts, alert statuses, what a person may do to an alert, a run's status and the
exit code it makes): a contract shared by the Spark job, the results store, the
comparison, the report, the CLI and the DAGs. Data and small pure functions, standard
library only (DAG files read it at parse time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricDef:
    name: str
    unit: str
    better: str  # "higher" | "lower" | "none" (recorded, never judged)
    min_effect: float = 0.0  # smallest relative change that matters (0: never judged)
    # a recorded metric that shares this one's night-to-night noise: judged at tonight's
    # value of it, along the slope its nights show (`tasks.analysis.covariate`)
    adjusted_by: str | None = None
    # recorded figures of the broker's host (its pace, its steal): on a night one was far
    # off the host's usual, this metric is not judged, and such nights stay out of its
    # baseline (`tasks.analysis.host_gates`)
    gated_by: tuple[str, ...] = ()
    # a figure of the broker itself, the same on every stage it serves: also judged across
    # the run's stages on one fingerprint, their changes pooled (`tasks.analysis.across`)
    across_stages: bool = False


# The driver processes' CPU a message where they share the broker's host: the covariate
# the broker's cost and e2e p50 are judged at (`MetricDef.adjusted_by`)
DRIVER_CPU = "driver_cpu_s_per_10k"
# The CPU time a fixed piece of work took on the broker's host (`tasks.driver.pace`), and
# the time the hypervisor took its virtual CPUs: what the metrics a slower host moves are
# gated by (`MetricDef.gated_by`, `tasks.analysis.host_gates`): latency by both, the
# broker's CPU a message and its capacity by the steal
HOST_PACE = "host_pace_us"
HOST_STEAL = "host_steal_pct"
HOST_DISTURBED = (HOST_PACE, HOST_STEAL)

LATENCY_KINDS = ("e2e", "pub_ack", "connect", "subscribe", "pub_delay")
LATENCY_STATS = ("avg", "p50", "p95", "p99", "p99_9", "max", "stddev")
TAIL_KINDS = ("e2e", "pub_ack")  # their tails are also read per second (tasks.analysis.tails)


def p99_per_s_series(kind: str) -> str:
    """The series of a tail kind's p99 per second of the measure window (microseconds)."""
    return f"{kind}_p99_per_s"


def bucket_series(kind: str) -> tuple[str, str]:
    """The two aligned series of a tail kind's summed window buckets: (index, count)."""
    return f"{kind}_buckets", f"{kind}_bucket_counts"


BROKER_CPU_SERIES = "broker_cpu_per_s"  # % of one core, per second of the measure window

_DEFS: list[MetricDef] = [
    MetricDef("delivered_rate", "msg/s", "higher", 0.05),
    MetricDef("published_rate", "msg/s", "higher", 0.05),
    MetricDef("target_rate", "msg/s", "none"),  # the stage's publish rate
    # the deliveries it intends: the publish rate times the subscribers each message
    # reaches; what delivered_rate is held against (achieved_ratio)
    MetricDef("expected_delivery_rate", "msg/s", "none"),
    MetricDef("achieved_ratio", "ratio", "higher"),
    MetricDef("throughput_cv", "ratio", "none"),
    MetricDef("messages_delivered", "msg", "none"),
    MetricDef("lost", "msg", "lower"),
    MetricDef("loss_ratio", "ratio", "lower"),
    # missing deliveries of QoS 1/2 messages the broker had not acknowledged when the
    # drain ended: no promise broken (`validity.Loss.unacked`, `broken_promises`)
    MetricDef("unacked_deliveries", "msg", "none"),
    MetricDef("duplicated", "msg", "lower"),
    # the highest QoS the subscribers received the stage's messages at (a delivery's is the
    # lower of the publish's and what the broker granted): where it is below the stage's,
    # the promise loss and duplicates are judged against (`tasks.analysis.validity`)
    MetricDef("delivery_qos", "qos", "none"),
    MetricDef("out_of_order", "msg", "lower"),
    MetricDef("errors", "count", "lower"),
    MetricDef("inflight_full", "count", "none"),
    MetricDef("delay_overruns", "count", "none"),
    MetricDef("connects_ok", "count", "none"),
    MetricDef("connects_failed", "count", "lower"),
    # Connections per second over the stage's connect phase: summed ``connected`` of every
    # process's summary ``connect_phase`` over max(last_connack_at) - min(first_connect_at)
    # across processes and hosts (tasks/driver/output.py); null, with a problem line, when
    # a process lacks connect_phase. Higher is better. Recorded but not judged yet: the
    # driver paces its connects (spec connect_rate), so the figure is capped by the
    # scenario, and its night-to-night noise has not been measured.
    MetricDef("connect_rate", "conn/s", "higher"),
    # The broker, over the measure window (`tasks.driver.sampler`): from its processes on its
    # host, else from what it reports itself (its $SYS or Prometheus endpoint), else from a
    # host it has to itself. CPU in % of one core. Judged: what a message costs.
    MetricDef("broker_cpu_avg", "%", "lower"),
    MetricDef("broker_cpu_max", "%", "none"),
    MetricDef("broker_cpu_user_avg", "%", "none"),
    MetricDef("broker_cpu_sys_avg", "%", "none"),
    MetricDef("broker_rss_avg", "bytes", "lower"),
    MetricDef("broker_rss_max", "bytes", "none"),
    # CPU-seconds the broker spent per 10,000 messages delivered: the cost of a message.
    # Minimum effect 5%: below that a change is not worth a person's morning. Its
    # night-to-night noise on the smoke suite's stages was 1.7% to 9.0% (robust sigma) from
    # one batch to the next, as the shared host's pace moved (bench/noise_measured.json).
    # Where every driver process runs on the broker's host, it is judged at tonight's
    # driver_cpu_s_per_10k, along the slope the stage's nights show (`adjusted_by`).
    # A broker that costs more a message costs more on every stage: judged across the run's
    # stages too (`across_stages`; on 32 real nights past learning the stages' changes at
    # the driver's CPU, as judged, had rank correlations of -0.14 to +0.03 from stage to
    # stage: bench/README.md real_nights.py). Not judged on a night the hypervisor took far
    # more of the host than usual (`gated_by`: 2.4x its cost on two such nights).
    MetricDef("broker_cpu_s_per_10k", "CPU-s", "lower", 0.05, adjusted_by=DRIVER_CPU,
              gated_by=(HOST_STEAL,), across_stages=True),
    # The same for the driver's processes (each over its publish phase), where every one
    # runs on the broker's host (`spark.stage_metrics.relative_cost`); null on other
    # topologies. Recorded, the covariate of broker_cpu_s_per_10k and e2e_latency_p50: on
    # a shared host they move together from night to night.
    MetricDef(DRIVER_CPU, "CPU-s", "none"),
    # The broker's CPU over its driver's, where every driver process runs on the broker's
    # host (`spark.stage_metrics.relative_cost`, which says why): what a message costs the
    # broker with most of the shared host's pace taken out. Null on other topologies.
    # Recorded, no longer judged: broker_cpu_s_per_10k at tonight's driver CPU takes more
    # of the pace out, along the slope the nights show where the ratio holds it at 1 (night
    # to night on the smoke suite's stages, robust sigma: 1.8% against 3.5% in one batch,
    # 1.3% against 2.2% in another; bench/README.md).
    MetricDef("broker_cpu_per_driver_cpu", "ratio", "lower"),
    # resident memory per 1,000 connected clients (publishers + subscribers); noise 0.5%
    MetricDef("broker_rss_per_1k_conn", "bytes", "lower", 0.05),
    MetricDef("broker_processes", "count", "none"),
    MetricDef("broker_threads_max", "count", "none"),
    MetricDef("broker_open_files_max", "count", "none"),
    MetricDef("broker_ctx_switches_per_s", "1/s", "none"),
    # what the broker reports itself: connections and the messages it holds for subscribers
    MetricDef("broker_connections_max", "count", "none"),
    MetricDef("broker_backlog_max", "msg", "none"),
    # the broker's host (CPU in % of one core, over all its CPUs)
    MetricDef("host_cpu_avg", "%", "none"),
    MetricDef("host_mem_used_max", "bytes", "none"),
    MetricDef("host_net_rx_avg", "bytes/s", "none"),
    MetricDef("host_net_tx_avg", "bytes/s", "none"),
    # the median over the window of the CPU time a fixed piece of work took on the broker's
    # host (tasks/driver/pace.py): more, a slower host; recorded, not judged; the latency
    # metrics are not judged on a night it is far off its usual (`gated_by`)
    MetricDef(HOST_PACE, "us", "none"),
    # the mean over the window of the time the host's virtual CPUs were ready to run while the
    # hypervisor ran something else (% of one core; 0 on bare metal; a search's: the most
    # its probes and holds that fell behind and its confirming hold saw, `search_steal`);
    # recorded, not judged; the latency metrics, the broker's CPU a message and its
    # capacity are not judged on a night it is far above its usual (`gated_by`)
    MetricDef(HOST_STEAL, "%", "none"),
    # A max-rate search's answer (tasks/catalog/ratesearch.py): the highest offered rate the broker
    # kept up with; recorded on the search's own stage, whose probes are never compared.
    MetricDef("max_rate", "msg/s", "higher", 0.05, gated_by=(HOST_STEAL,)),
    # Over the hold that confirmed a search's answer: the broker's CPU as % of the cores its
    # work can use (`tasks.analysis.capacity.broker_cores`: 1 for Mosquitto's one event
    # loop, the CPUs `broker.cpus` keeps it on, else those perfpipe may use on its host, for
    # a broker it started, or the host's cores), and its host's CPU as % of all its cores.
    # Recorded, never judged: under both lines of `tasks.analysis.capacity`, the verdict on
    # max_rate says the broker fell behind with CPU to spare.
    MetricDef("broker_cpu_used_pct", "%", "none"),
    MetricDef("host_cpu_used_pct", "%", "none"),
    # The busiest driver process's CPU over the publish phase (% of one core), and a host's
    # driver processes' summed over the CPUs they may run on (the highest host's): validity
    # inputs (the load generator must not be the bottleneck), never judged.
    MetricDef("driver_cpu_max", "%", "none"),
    MetricDef("drivers_cpus_used_pct", "%", "none"),
    # The driver host idle CPU (DESIGN.md): the least idle share of the CPUs a driver
    # process may run on over its publish phase, whatever kept them busy (another tenant, or
    # the broker where they share a host); recorded, never judged
    MetricDef("driver_host_idle_pct", "%", "none"),
    # The subscription backlog over the measure window (`backlog`): its high-water mark and
    # its least-squares slope; a slope near 0 means the broker kept up.
    MetricDef("backlog_max", "msg", "none"),
    MetricDef("backlog_slope", "msg/s", "none"),
]
for _kind in LATENCY_KINDS:
    for _stat in LATENCY_STATS:
        # the window's p99 is recorded, not judged: stalls set it (the judged tail is
        # <kind>_latency_p99_no_stall below)
        _effect = {"p50": 0.10, "avg": 0.10}.get(_stat, 0.0) if _kind in TAIL_KINDS else 0.0
        # e2e p50 includes the driver's own send and read of each message: on a host the
        # broker shares with its driver it moves with the driver's CPU from night to night
        # (slope 0.27-0.34 on the smoke stages, bench/README.md "paired_change.py"), and is
        # judged at tonight's, as the cost is. The mean, PUBACK p50 and the judged tail fit
        # no slope that held on every stage (bench/README.md): judged as they are.
        _by = DRIVER_CPU if (_kind, _stat) == ("e2e", "p50") else None
        _DEFS.append(MetricDef(f"{_kind}_latency_{_stat}", "us", "lower", _effect,
                               adjusted_by=_by, gated_by=HOST_DISTURBED))

# Per-second tails and stalls of the tail kinds (`tasks.analysis.tails`, which says which
# one is judged and why).
for _kind in TAIL_KINDS:
    _DEFS += [MetricDef(f"{_kind}_latency_p99_typical", "us", "lower",
                        gated_by=HOST_DISTURBED),
              MetricDef(f"{_kind}_latency_p99_no_stall", "us", "lower", 0.10,
                        gated_by=HOST_DISTURBED),
              MetricDef(f"{_kind}_stall_seconds", "s", "lower"),
              MetricDef(f"{_kind}_stall_longest", "us", "lower")]

METRICS: dict[str, MetricDef] = {m.name: m for m in _DEFS}


def check_covariates(defs: dict[str, MetricDef]) -> None:
    """Every `MetricDef.adjusted_by` and `gated_by` names a metric of `defs` that is
    recorded, not judged (a judged covariate would move its own verdicts with the other's):
    a name that is not there would leave the metric judged as it is, unseen."""
    for m in defs.values():
        for field_name, by in [("adjusted_by", m.adjusted_by),
                               *(("gated_by", gate) for gate in m.gated_by)]:
            if by is not None and (by not in defs or defs[by].better != "none"):
                raise ValueError(f"tasks.metrics: {m.name}.{field_name} = {by!r} is not a "
                                 "recorded, never judged metric: name one defined here with "
                                 "better='none'")


check_covariates(METRICS)
# What a broker team asks of a stage first, beside its rate: its capacity and what a message
# and a connection cost (drawn open in the report's history, with earlier nights in Slack)
CAPACITY_AND_COST = ("max_rate", "broker_cpu_s_per_10k", "broker_cpu_per_driver_cpu",
                     "broker_rss_per_1k_conn")

# A release label as a person types it (the release DAG's `release_label`, a pinned
# baseline's); "rolling", the earlier nights' baseline, is never one
# (no newline anywhere: the Param's JSON Schema check searches with Python's `re`, where
# `$` also matches before a last newline; the lookahead reads the same in a browser's regex)
RELEASE_LABEL = r"^(?![\s\S]*\n)(?!rolling$)[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
RELEASE_LABEL_RULE = "letters, digits, '.', '_', '-'; not 'rolling', the earlier nights' baseline"


def is_release_label(label: str) -> bool:
    """`label` names a release as the release DAG's Param takes it (`RELEASE_LABEL`)."""
    return re.fullmatch(RELEASE_LABEL, label) is not None


def against_release(label: str) -> str:
    """What a verdict judged against a pinned release says it was judged against (its
    detail "baseline"; "rolling" for the earlier nights)."""
    return f"release:{label}"


def compared_release(detail: dict | None) -> str | None:
    """The release label a verdict was judged against (`against_release`); None for the
    rolling history."""
    baseline = (detail or {}).get("baseline", "rolling")
    return baseline.removeprefix("release:") if baseline.startswith("release:") else None


# A run: why it ran, and how it ended ("running" until teardown closes it).
RUN_KINDS = ("nightly", "release", "manual")
RUN_STATUSES = ("running", "ok", "failed", "invalid")


def feeds_baselines(status: str, excluded: bool) -> bool:
    """Whether a run may stand for a good night: a rolling or release baseline, a pin,
    another tool's history. It finished ok and no one excluded it (the store's
    `queries._comparable` asks the same in SQL)."""
    return status == "ok" and not excluded


def exit_code(status: str, warning: str | None, airflow_state: str = "success", *,
              stored: bool = True) -> int:
    """A closed run's status as `perfpipe run` and `perfpipe nightly` exit with it: 0 ok,
    1 not ok, 5 ok with a warning (Slack not told): a script or a scheduler sees
    a night nobody heard of, though its results are good. Under Airflow (`perfpipe
    nightly`) a DAG run that is not green is 1, unless its run ended ok with the warning:
    then its alert task failed on purpose, and it is the same 5. 4 when the run's status
    is not stored (the database away at teardown: `perfpipe step teardown RUN` stores it
    once it is back), as the CLI exits whenever the database is away."""
    if not stored:
        return 4
    if airflow_state != "success" and not (status == "ok" and warning):
        return 1
    return 1 if status != "ok" else 5 if warning else 0


# What the comparison says of one metric of one stage tonight, worst first (the report's
# order too). `learning`: too few nights yet to know the noise, so nothing is judged but
# what is beyond doubt; like `unchanged`, it clears a suspicion.
VERDICTS = ("regression", "suspected", "improvement", "unchanged", "learning", "no_baseline",
            "invalid")


def verdict_rank(verdict: str) -> int:
    """Where a verdict sorts, worst first (`VERDICTS`' order; one it does not know, last)."""
    return VERDICTS.index(verdict) if verdict in VERDICTS else len(VERDICTS)


# A bad night: its value stays out of later baselines, and its alert is opened or confirmed.
FLAGGED = ("suspected", "regression")
# Nothing was compared: these say nothing of a change, so they neither open, confirm nor
# clear an alert, and a summary lists them apart.
NOT_JUDGED = ("no_baseline", "invalid")


def noise_known(comparison: dict) -> bool:
    """The verdict was made past learning, so the noise it measured may draw a band: its
    detail has the night's `score`. One made while learning (flagged as beyond doubt or
    not) measured its noise on too few nights; one not judged measured none."""
    return "score" in (comparison.get("detail") or {})


def flagged_across(detail: dict) -> bool:
    """The run's stages together set the verdict of this detail (its `across.flagged`,
    written by `tasks.analysis.across`): one change of the broker, seen on every stage."""
    return bool((detail.get("across") or {}).get("flagged"))


# An alert's lifecycle (sql/alerts.py): the statuses while it is open, then the closing ones.
OPEN_ALERT_STATUSES = ("new", "suspected", "confirmed", "acked")
ALERT_STATUSES = OPEN_ALERT_STATUSES + ("fixed", "accepted", "false_positive", "recovered",
                                        "cleared")
# What a person may do to an alert (`perfpipe alerts ACTION ID`, the maintenance DAG's
# `action`), and the status each one sets.
ALERT_ACTIONS = {"ack": "acked", "accept": "accepted", "false-positive": "false_positive",
                 "fixed": "fixed"}


def backlog(published: list[float], delivered: list[float], fan_out: float) -> list[float]:
    """Messages published but not yet delivered, at the end of each second of the window:
    the running sum of published x fan_out (deliveries each message owes) - delivered."""
    out, total = [], 0.0
    for sent, got in zip(published, delivered):
        total += sent * fan_out - got
        out.append(total)
    return out


def slope(values: list[float]) -> float | None:
    """Least-squares slope per step (per second for a per-second series)."""
    n = len(values)
    if n < 2:
        return None
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values))
    return num / sum((x - mean_x) ** 2 for x in range(n))


def metric(name: str) -> MetricDef:
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}: add it to tasks.metrics") from None

"""Per-stage metrics from what Spark summed: rates and series of the measure window,
loss, whole-stage counters, connection rate, driver CPU, latency percentiles from the
summed histogram buckets, per-second tails and stalls (`tasks.analysis.tails`), the
broker's CPU, RSS and cost per message from its sampler's rows, and the stage's entry of
stage_metrics.json.
Plain Python on small tables: no Spark here.

Metric names are those of `tasks.metrics.METRICS`; a metric that cannot be computed is
null, never a zero. A judged one says why in a problem line; a recorded one whose input is
absent by the setup (the host's figures with no broker host, the relative cost where the
drivers do not share the broker's host) is null without one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from spark.stage_files import StageFiles, sample_values
from tasks.analysis.tails import SecondTail, tail_metrics
from tasks.analysis.validity import (
    deliveries_per_message,
    delivered_qos,
    driver_hosts_idle_pct,
    driver_idle_note,
    drivers_cpus_used_pct,
    message_loss,
    process_cpu_pct,
    promised_qos,
    throughput_cv,
)
from tasks.driver.histogram import summarize
from tasks.driver.output import STAGE_FILE, SUMMARY_FILE
from tasks.metrics import (
    BROKER_CPU_SERIES,
    LATENCY_KINDS,
    LATENCY_STATS,
    METRICS,
    TAIL_KINDS,
    backlog,
    bucket_series,
    p99_per_s_series,
    slope,
)

SIGNIFICANT_DIGITS = 10
TOTAL_COLUMNS = ("duplicated", "out_of_order", "errors", "inflight_full", "delay_overruns",
                 "connects_ok", "connects_failed")


@dataclass
class Sums:
    """What Spark hands back: small per-stage tables."""

    series: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    whole: dict[str, dict[int, int]] = field(default_factory=dict)  # delivered, every second
    totals: dict[str, dict[str, int]] = field(default_factory=dict)
    histograms: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
    tails: dict[str, dict[str, list[SecondTail]]] = field(default_factory=dict)  # by second
    stalled: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)  # stall seconds
    malformed: dict[str, set[str]] = field(default_factory=dict)  # dataset -> stage ids

    def flag(self, dataset: str, row: Mapping) -> None:
        if row["malformed"]:
            self.malformed.setdefault(dataset, set()).add(row["stage_id"])


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def traffic_metrics(stage: StageFiles, per_second: dict[int, tuple[int, int]]) -> tuple[dict, dict]:
    """Rates and the per-second series of the measure window (seconds without rows are 0)."""
    start, end = stage.window
    seconds = list(range(start, end))
    delivered = [per_second.get(s, (0, 0))[0] for s in seconds]
    published = [per_second.get(s, (0, 0))[1] for s in seconds]
    measure_s = len(seconds)
    delivered_rate = _ratio(sum(delivered), measure_s)
    metrics = {
        "delivered_rate": delivered_rate,
        "published_rate": _ratio(sum(published), measure_s),
        "achieved_ratio": _ratio(delivered_rate, stage.doc.get("expected_delivery_rate")),
        "throughput_cv": throughput_cv(delivered),
        "messages_delivered": sum(delivered),
    }
    per_message = deliveries_per_message(stage.doc.get("expected_delivery_rate"),
                                         stage.doc.get("target_publish_rate"))
    if per_message is not None:
        owed = backlog(published, delivered, per_message)
        metrics["backlog_max"] = max([0.0, *owed])
        metrics["backlog_slope"] = slope(owed)
    series = {"seconds": seconds, "delivered_per_s": delivered, "published_per_s": published}
    return metrics, series


def stage_series(stage: StageFiles, whole: dict[int, int]) -> dict[str, list[int]]:
    """Delivered per second over the whole stage (warm-up and cool-down too), for charts."""
    windows = stage.doc.get("windows") or {}
    if "start" not in windows or "end" not in windows:
        return {}
    seconds = list(range(windows["start"], windows["end"]))
    return {"stage_seconds": seconds, "stage_delivered_per_s": [whole.get(s, 0) for s in seconds]}


def window_series(seconds: list[int], tails: dict[str, list[SecondTail]],
                  broker_rows: list[dict]) -> dict[str, list]:
    """Per second of the measure window, beside its delivered rate: each tail kind's p99
    (microseconds) and the broker's CPU (% of one core); null where a second has none."""
    out: dict[str, list] = {}
    for kind in TAIL_KINDS:
        p99 = {t.second: t.p99 for t in tails.get(kind, [])}
        out[p99_per_s_series(kind)] = [p99.get(s) for s in seconds]
    cpu = {int(r["second"]): r["cpu_pct"] for r in broker_rows if r.get("cpu_pct") is not None}
    out[BROKER_CPU_SERIES] = [cpu.get(s) for s in seconds]
    return out


def histogram_series(histograms: dict[str, dict[int, int]]) -> dict[str, list[int]]:
    """The window's summed buckets of each tail kind, as two aligned series (bucket index,
    count; `tasks.driver.histogram` reads them), so a stored run's percentile curve can be
    drawn again from SQL."""
    out: dict[str, list[int]] = {}
    for kind in TAIL_KINDS:
        buckets = sorted((b, c) for b, c in histograms.get(kind, {}).items() if c)
        index, counts = bucket_series(kind)
        out[index], out[counts] = [b for b, _ in buckets], [c for _, c in buckets]
    return out


def loss_metrics(stage: StageFiles, promised: int | None = None) -> dict:
    """Whole-stage loss: expected (last_seq x receivers) minus unique deliveries; noted
    when any where the QoS it is held to (`promised`, `validity.promised_qos`; the stage's
    own when not given) is 0, since no gate holds it then."""
    if stage.missing:
        stage.problem("loss not computed: processes without summary: " + ", ".join(stage.missing))
        return {}
    loss = message_loss(stage.summaries, stage.doc.get("receivers") or {})
    for publisher in loss.unmatched:
        stage.problem(f"{publisher} has no receivers in {STAGE_FILE}")
    expected, unique, lost = loss.expected, loss.unique, loss.lost
    if unique > expected:  # a receiver the stage did not count: loss elsewhere is hidden
        stage.problem(f"{unique:,} unique deliveries where {expected:,} were expected: loss "
                      f"reads 0 and may hide loss of other streams; check the receivers "
                      f"{STAGE_FILE} counts for each publisher")
    if promised is None:
        promised = stage.doc.get("qos")
    if lost and promised == 0:  # QoS 1/2 loss fails a validity gate instead
        stage.problem(f"{lost:,} of {expected:,} messages lost ({lost / expected:.2%}): QoS 0 "
                      "allows it, so no gate fails on it, but a broker that keeps up loses "
                      "none (one drops QoS 0 messages past a subscriber's queue)")
    return {"lost": lost, "loss_ratio": _ratio(lost, expected), "unacked_deliveries": loss.unacked}


def qos_metrics(stage: StageFiles) -> dict:
    """The highest QoS the subscribers received the stage's messages at (``delivery_qos``;
    a delivery's QoS is the lower of the publish's and what the broker granted the
    subscription), so a lower promise is taken only when no delivery kept the stage's.
    What a broker gave below the stage's QoS is noted: subscriptions granted less (their
    SUBACKs), deliveries at less, QoS 2 publishes acknowledged with a PUBACK (RabbitMQ's
    MQTT plugin does all three for QoS 2)."""
    asked = stage.doc.get("qos")
    delivered = delivered_qos(stage.summaries)
    if asked is None:
        return {"delivery_qos": delivered}
    granted: dict[int, int] = {}
    for summary in stage.summaries:
        for qos, count in (summary.get("subscriptions_granted") or {}).items():
            granted[int(qos)] = granted.get(int(qos), 0) + int(count)
    below = {qos: n for qos, n in granted.items() if qos < asked}
    if below:
        stage.problem(f"the broker granted {sum(below.values()):,} of {sum(granted.values()):,} "
                      f"subscriptions less than the QoS {asked} they asked for (QoS "
                      + ", ".join(f"{q}: {n:,}" for q, n in sorted(below.items())) + ")")
    if delivered is not None and delivered < asked:
        stage.problem(f"subscribers received this QoS {asked} stage's messages at QoS "
                      f"{delivered} at most, so its loss and duplicates are judged against QoS "
                      f"{delivered}'s promise")
    downgraded = sum(int(summary.get("qos2_pubacks") or 0) for summary in stage.summaries)
    if downgraded:
        stage.problem(f"the broker acknowledged {downgraded:,} QoS 2 publishes with a PUBACK, "
                      "as QoS 1, without QoS 2's exactly-once handshake: their pub_ack "
                      "latency is to that PUBACK")
    return {"delivery_qos": delivered}


def counter_metrics(totals: dict[str, int] | None) -> dict:
    """Whole-stage counter sums."""
    if not totals:
        return {}
    return {name: totals[name] for name in TOTAL_COLUMNS}


def connect_metrics(stage: StageFiles) -> dict:
    """Connection rate from every process's ``connect_phase`` (tasks.driver.output).

    connect_rate = summed ``connected`` / (latest ``last_connack_at`` - earliest
    ``first_connect_at``) over all processes and hosts, each time as its host's clock has
    it (a host whose clock is not trusted is flagged by `spark.stage_files._check_clocks`).
    Null, with the reason in the problems, when a process has no summary or no
    connect_phase, or nothing connected.
    """
    if stage.missing:
        stage.problem("connect_rate not computed: processes without summary: "
                      + ", ".join(stage.missing))
        return {}
    connected, firsts, lasts, without = 0, [], [], []
    for summary in stage.summaries:
        phase = summary.get("connect_phase")
        label = f"{summary.get('host')}/{summary.get('proc')}"
        try:
            connected += int(phase["connected"] or 0)
            first, last = phase["first_connect_at"], phase["last_connack_at"]
        except (KeyError, TypeError, ValueError):
            without.append(label)
            continue
        if first is not None and last is not None:
            firsts.append(float(first))
            lasts.append(float(last))
    if without:
        stage.problem(f"connect_rate not computed: no connect_phase in {SUMMARY_FILE} of "
                      + ", ".join(without))
        return {}
    span = max(lasts) - min(firsts) if firsts else None
    if not connected or not span or span <= 0:
        stage.problem(f"connect_rate not computed: {connected} clients connected "
                      f"over a connect phase of {span} s")
        return {}
    return {"connect_rate": connected / span}


def _driver_cpus(stage: StageFiles) -> list[float | None]:
    """Each driver process's CPU over its publish phase, in % of one core (None where a
    process did not record it)."""
    return [process_cpu_pct(summary) for summary in stage.summaries]


def driver_metrics(stage: StageFiles) -> dict:
    """Validity inputs (the load generator may be the bottleneck,
    `tasks.analysis.validity.driver_limit`): driver_cpu_max, the busiest driver process's
    CPU over its publish phase in % of one core, and drivers_cpus_used_pct, a host's driver
    processes' over the CPUs they may run on, the highest host's; and
    driver_host_idle_pct, the least idle % of the CPUs a driver process may run on, busy
    with anything (the broker where they share a host). Each left out when no process (no
    host) recorded what it needs. Where the CPUs of drivers apart from the broker's host
    were rarely idle, the stage says so (`driver_idle_note`)."""
    busiest = [cpu for cpu in _driver_cpus(stage) if cpu is not None]
    shared = drivers_cpus_used_pct(stage.summaries)
    idle = driver_hosts_idle_pct(stage.summaries)
    metrics = ({"driver_cpu_max": max(busiest)} if busiest else {}) \
        | ({"drivers_cpus_used_pct": shared} if shared is not None else {}) \
        | ({"driver_host_idle_pct": idle} if idle is not None else {})
    if note := driver_idle_note(stage.summaries, stage.doc.get("broker_host")):
        stage.problem(note)
    return metrics


def relative_cost(stage: StageFiles, broker_cpu_avg: float | None, delivered_rate: float | None,
                  source: str) -> dict:
    """broker_cpu_per_driver_cpu: the broker's CPU (its processes', over the measure
    window) over the sum of its driver processes' (each over its publish phase, warm-up
    included), where every driver process runs on the broker's host (the embedded
    default); driver_cpu_s_per_10k: that sum's CPU-seconds per 10,000 messages delivered,
    as broker_cpu_s_per_10k is the broker's. Both do a fixed piece of work a message at a
    fixed rate, and on a shared host both slow down when the host does (its other tenants,
    its frequency): on the bench's 10K msgs/s row and the smoke suite's stages their costs
    a message correlate 0.93-0.99 from run to run, so the ratio keeps a change in the
    broker's own cost and leaves most of the host's out (bench/README.md, host_pace.py; not
    on every load: see there), and the detector judges the broker's cost and e2e p50 at
    tonight's driver_cpu_s_per_10k (their covariate: `tasks.analysis.covariate`).

    Null without a problem line of its own: a driver on another host shares nothing of the
    broker's host (the topology, not a fault), and the other causes already have one (a
    process without a summary, the broker's CPU from its own figures or its host)."""
    host = stage.doc.get("broker_host")
    cpus = _driver_cpus(stage)
    if (source != "processes" or broker_cpu_avg is None or stage.missing or not cpus
            or any(summary.get("host") != host for summary in stage.summaries)
            or any(cpu is None for cpu in cpus)):
        return {}
    return {"broker_cpu_per_driver_cpu": _ratio(broker_cpu_avg, sum(cpus)),
            "driver_cpu_s_per_10k": _ratio(sum(cpus) / 100, (delivered_rate or 0) / 10_000)}


def latency_metrics(histograms: dict[str, dict[int, int]], tails: dict[str, list[SecondTail]],
                    stalled: dict[str, dict[int, int]]) -> dict:
    """Percentiles of the window's summed buckets, and the per-second tails and stalls."""
    metrics = {}
    for kind in LATENCY_KINDS:
        summary = summarize(histograms.get(kind, {}))
        for stat in LATENCY_STATS:
            metrics[f"{kind}_latency_{stat}"] = summary.get(stat)
    for kind in TAIL_KINDS:
        metrics.update(tail_metrics(kind, tails.get(kind, []), histograms.get(kind, {}),
                                    stalled.get(kind, {})))
    return metrics


def _avg(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def _median_us(values_ns: list[float]) -> float | None:
    return statistics.median(values_ns) / 1000 if values_ns else None


def _broker_source(stage: StageFiles) -> tuple[str, list[dict]]:
    """Where the broker's CPU and RSS come from, and those rows: its processes, else what it
    reports itself, else its host when the broker has that host to itself."""
    processes = [r for r in stage.samples.get("broker", []) if r.get("processes")]
    if processes:
        return "processes", processes
    if stage.samples.get("broker"):
        stage.problem("the broker sampler found none of the broker's processes "
                      f"({(stage.doc.get('sampler') or {}).get('processes')})")
    own = [r for r in stage.samples.get("stats", []) if r.get("cpu_pct") is not None]
    if own:
        return "its own metrics", own
    if (stage.doc.get("sampler") or {}).get("dedicated") and stage.samples.get("host"):
        return "its host", [{**r, "rss_bytes": r.get("mem_used_bytes")}
                            for r in stage.samples["host"]]
    return "nothing", []


# the judged broker figures need samples in all the window's seconds but this share of
# them, or one: the sampler names each sample by the second that just ended, and a tick
# that ran late (a loaded broker host, a slow scrape) skips one
BROKER_SECONDS_MISSED = 0.2


def _judged_from(stage: StageFiles, source: str, rows: list[dict]) -> bool:
    """Whether the broker's judged figures (its CPU a message, its memory per 1,000
    clients) may be taken from `rows`: from the source the setup measures every night (its
    processes, when the sampler was told how to find them) and over most of the window.
    Else a night whose process was not found would be judged on its host's CPU and used
    memory, or on 3 seconds of 60, against nights of its processes: a false step."""
    meant = "processes" if (stage.doc.get("sampler") or {}).get("processes") else source
    if source != meant:
        stage.problem(f"broker_cpu_s_per_10k and broker_rss_per_1k_conn not computed: from "
                      f"{source}, not the broker's processes its other nights are from",
                      notice=False)
        return False
    seconds = len({r.get("second") for r in rows})
    span = stage.window[1] - stage.window[0] if stage.window else 0
    needed = span - max(1, math.floor(BROKER_SECONDS_MISSED * span))
    if span and seconds < needed:
        stage.problem(f"broker_cpu_s_per_10k and broker_rss_per_1k_conn not computed: the "
                      f"broker was sampled in {seconds} of the window's {span} seconds "
                      f"({needed} needed)", notice=False)
        return False
    return True


def broker_metrics(stage: StageFiles, delivered_rate: float | None,
                   source: tuple[str, list[dict]]) -> dict:
    """The broker over the measure window: CPU, RSS and what a message costs, from the best
    `source` `_broker_source` found (said in a problem line when it is not its processes;
    the judged figures only from the source its nights are from: `_judged_from`), plus its
    processes' detail, its own counts and its host."""
    source, rows = source
    if source not in ("processes", "nothing"):
        stage.problem(f"broker CPU and RSS from {source}: its processes were not sampled",
                      notice=False)
    metrics = {}
    if rows:
        cpu, rss = sample_values(rows, "cpu_pct"), sample_values(rows, "rss_bytes")
        metrics.update(broker_cpu_avg=_avg(cpu), broker_cpu_max=_max(cpu),
                       broker_rss_avg=_avg(rss), broker_rss_max=_max(rss))
        if _judged_from(stage, source, rows):
            # CPU-seconds per second, over messages per second, for 10,000 messages
            metrics["broker_cpu_s_per_10k"] = _ratio(
                None if metrics["broker_cpu_avg"] is None else metrics["broker_cpu_avg"] / 100,
                (delivered_rate or 0) / 10_000)
            metrics["broker_rss_per_1k_conn"] = _ratio(metrics["broker_rss_avg"],
                                                       (stage.doc.get("clients") or 0) / 1000)
    elif stage.doc.get("broker_host"):
        stage.problem("no broker CPU or RSS in the measure window")
    if source == "processes":
        metrics.update(
            broker_cpu_user_avg=_avg(sample_values(rows, "cpu_user_pct")),
            broker_cpu_sys_avg=_avg(sample_values(rows, "cpu_sys_pct")),
            broker_processes=_max(sample_values(rows, "processes")),
            broker_threads_max=_max(sample_values(rows, "threads")),
            broker_open_files_max=_max(sample_values(rows, "open_files")),
            broker_ctx_switches_per_s=_avg(sample_values(rows, "ctx_switches_per_s")))
    own = stage.samples.get("stats", [])
    metrics.update(broker_connections_max=_max(sample_values(own, "connections")),
                   broker_backlog_max=_max(sample_values(own, "backlog")))
    host = stage.samples.get("host", [])
    metrics.update(host_cpu_avg=_avg(sample_values(host, "cpu_pct")),
                   host_mem_used_max=_max(sample_values(host, "mem_used_bytes")),
                   host_net_rx_avg=_avg(sample_values(host, "net_rx_bytes_per_s")),
                   host_net_tx_avg=_avg(sample_values(host, "net_tx_bytes_per_s")),
                   host_pace_us=_median_us(sample_values(host, "pace_ns")),
                   host_steal_pct=_avg(sample_values(host, "steal_pct")))
    return metrics


def stage_result(stage: StageFiles, sums: Sums) -> dict:
    """The stage's entry of stage_metrics.json: status, problems, every metric, series."""
    metrics: dict = dict.fromkeys(METRICS)
    metrics["target_rate"] = stage.doc.get("target_publish_rate")
    metrics["expected_delivery_rate"] = stage.doc.get("expected_delivery_rate")
    series: dict = {"seconds": [], "delivered_per_s": [], "published_per_s": []}
    status = "incomplete" if stage.incomplete else "ok"
    traffic = {}
    if stage.window is not None:
        traffic, series = traffic_metrics(stage, sums.series.get(stage.stage_id, {}))
        series.update(stage_series(stage, sums.whole.get(stage.stage_id, {})))
    if not (sum(series["delivered_per_s"]) or sum(series["published_per_s"])):
        stage.problem("zero traffic in the measure window", notice=False)
        status = "no_data"
    else:
        metrics.update(traffic)
        qos = qos_metrics(stage)
        asked = stage.doc.get("qos")
        metrics.update(loss_metrics(stage, None if asked is None else promised_qos(asked, qos)))
        metrics.update(qos)
        metrics.update(counter_metrics(sums.totals.get(stage.stage_id)))
        metrics.update(connect_metrics(stage))
        metrics.update(driver_metrics(stage))
        histograms, tails = (part.get(stage.stage_id, {}) for part in (sums.histograms, sums.tails))
        metrics.update(latency_metrics(histograms, tails, sums.stalled.get(stage.stage_id, {})))
        broker = _broker_source(stage)
        metrics.update(broker_metrics(stage, metrics["delivered_rate"], broker))
        metrics.update(relative_cost(stage, metrics["broker_cpu_avg"], metrics["delivered_rate"],
                                     broker[0]))
        series.update(window_series(series["seconds"], tails, broker[1]))
        series.update(histogram_series(histograms))
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise KeyError(f"metrics missing from tasks.metrics: {sorted(unknown)}")
    return {"stage_id": stage.stage_id, "scenario": stage.doc.get("scenario"),
            "status": status, "problems": stage.problem_list(),
            "metrics": {k: tidy(v) for k, v in metrics.items()}, "series": series}


def tidy(value):
    """Round floats to SIGNIFICANT_DIGITS so reruns are byte-identical; NaN/inf -> None."""
    if value is None or isinstance(value, (bool, int)):
        return value
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}") + 0.0  # + 0.0 turns -0.0 into 0.0

"""The run report: one self-contained HTML page (inline SVG, no network needed).

`render` is pure (run, stages, hosts, histories in; HTML out) and escapes every text; the
report step (`tasks.steps.report`) reads the store and writes the file, and teardown writes
it again once the run's status is final. History first, as the morning needs it: what needs
a human (regressions and suspicions, with baseline -> tonight, nights of evidence, where the
shift began and a trend), then every judged metric night by night with its baseline and
noise band (`tasks.views.history`). Then tonight: delivered rate per QoS against what each
scenario steps (publishers, subscribers or the offered rate), with the deliveries intended
(IBM's figures), a MessageSight-style score card, capacity and broker
cost, every verdict with the smallest step it can show, invalid stages and why, what the
aggregation noted of the stages (a QoS the broker granted lower, clocks not trusted, loss
at QoS 0), each stage's latency percentile curve on a log-percentile axis (from the summed
buckets stored with the run), its delivered rate, p99 and broker CPU per second, and every
host's fingerprint and tuning. Latency is shown in ms, memory in MiB, ratios in % (`tasks.views.units`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from html import escape

from ..driver.histogram import percentile
from ..metrics import (
    BROKER_CPU_SERIES,
    TAIL_KINDS,
    bucket_series,
    p99_per_s_series,
    verdict_rank,
)
from .charts import PALETTE, line_chart, percentile_x, time_series
from .history import Histories, attention, history_section
from .tables import (
    broker_version_text,
    in_run_order,
    invalid_reasons,
    noted,
    said_counts,
    verdict_counts,
    verdict_note,
)
from .units import show, unit_of

SCORE_CARD = (("delivered_rate", "delivered"), ("expected_delivery_rate", "expected"),
              ("target_rate", "publish target"),
              ("e2e_latency_avg", "e2e avg"), ("e2e_latency_p50", "p50"),
              ("e2e_latency_p95", "p95"), ("e2e_latency_p99", "p99"),
              ("e2e_latency_p99_no_stall", "p99 without stall seconds"),
              ("e2e_latency_p99_typical", "p99 of a typical second"),
              ("e2e_stall_seconds", "stall seconds"), ("e2e_stall_longest", "longest stall"),
              ("e2e_latency_stddev", "stddev"), ("lost", "lost"),
              ("errors", "errors"), ("broker_cpu_avg", "broker CPU avg"),
              ("broker_cpu_max", "max"), ("broker_rss_max", "broker RSS max"))
# What the broker spent (from its processes, its own metrics or its host: see the stage's
# problems), and a search stage's capacity
COST = (("max_rate", "capacity"), ("broker_cpu_used_pct", "broker CPU used (of its cores)"),
        ("host_cpu_used_pct", "host CPU used (of its cores)"),
        ("broker_cpu_s_per_10k", "broker CPU / 10K msgs"),
        ("broker_cpu_per_driver_cpu", "broker CPU / driver CPU"),
        ("broker_rss_per_1k_conn", "RSS / 1K conns"), ("broker_rss_avg", "RSS avg"),
        ("broker_cpu_user_avg", "user"), ("broker_cpu_sys_avg", "sys"),
        ("broker_threads_max", "threads"), ("broker_open_files_max", "open files"),
        ("broker_ctx_switches_per_s", "ctx switches"), ("broker_connections_max", "connections"),
        ("broker_backlog_max", "backlog (its own)"), ("host_cpu_avg", "host CPU"),
        ("host_net_rx_avg", "host rx"), ("host_net_tx_avg", "host tx"),
        ("host_pace_us", "host pace"), ("host_steal_pct", "host steal"))
PERCENTILES = ("p50", "p95", "p99", "p99_9", "max")
# where the percentile curve is read (with enough samples: p99.99 needs 10,000)
CURVE_PERCENTILES = (0, 10, 25, 50, 75, 90, 95, 98, 99, 99.5, 99.8, 99.9, 99.95, 99.98, 99.99,
                     99.995, 99.999)
_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right;font-size:13px}th{background:#f3f3f3}td.l,th.l{text-align:left}
.invalid{color:#b00}.regression{background:#fdd}.suspected{background:#fec}
.improvement{background:#dfd}.charts{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0}figcaption{font-size:12px;color:#555;max-width:360px}
.attention{border:2px solid #d62728;border-radius:6px;padding:0 1em;margin:1em 0}
.attention.quiet{border-color:#2ca02c}.status-failed,.status-invalid{color:#b00}
figure.regression,figure.suspected{background:none;outline:2px solid #fbb}
details{margin:.3em 0 1em}summary{cursor:pointer;color:#555}"""


def _head(name: str, label: str) -> str:
    unit = unit_of(name)
    return f"<th>{escape(label)}" + (f" ({escape(unit)})" if unit else "") + "</th>"


def _clients(role: str) -> Callable[[dict], float | None]:
    return lambda stage: sum(g["count"] for g in stage["params"].get("groups", [])
                             if g["role"] == role)


# What a scenario's rate chart plots its stages along: the first of these that differs
# between them (fan-in steps its publishers, fan-out and broadcast their subscribers, a
# partitioned fan-in its rate); publishers when none does.
RATE_AXES: tuple[tuple[str, Callable[[dict], float | None]], ...] = (
    ("publishers", _clients("pub")), ("subscribers", _clients("sub")),
    ("offered msg/s", lambda stage: stage["metrics"].get("target_rate")))


def stepped_axis(stages: list[dict]) -> tuple[str, Callable[[dict], float | None]]:
    """(label, x of a stage) for a scenario's stages (`RATE_AXES`)."""
    for label, x in RATE_AXES:
        if len({x(stage) for stage in stages} - {None}) > 1:
            return label, x
    return RATE_AXES[0]


def rate_charts(stages: list[dict]) -> str:
    """Per scenario: delivered rate against what its stages step (`stepped_axis`), one line
    per QoS, the deliveries the stages intend dashed, one line per QoS too (their publish
    rate times the subscribers a message reaches: a scenario's QoS may each have a rate of
    their own, and one expected line drew the last QoS's under every other)."""
    by_scenario: dict[str, list[dict]] = defaultdict(list)
    for stage in stages:
        by_scenario[stage["params"].get("scenario", "?")].append(stage)
    figures = []
    for scenario, members in sorted(by_scenario.items()):
        label, x_of = stepped_axis(members)
        lines: dict[str, list] = defaultdict(list)
        targets: dict[str, dict] = defaultdict(dict)
        for stage in members:
            x, delivered = x_of(stage), stage["metrics"].get("delivered_rate")
            if x is None:  # a stage whose offered rate is not known: no point
                continue
            qos = f"QoS {stage['params'].get('qos')}"
            if delivered is not None:
                lines[qos].append((x, delivered))
            if stage["metrics"].get("expected_delivery_rate") is not None:
                targets[qos][x] = stage["metrics"]["expected_delivery_rate"]
        chart = line_chart(lines, targets={q: sorted(t.items()) for q, t in targets.items()},
                           x_label=label,
                           y_label="delivered msg/s", chart_id=f"rate-{scenario}",
                           title=f"{scenario}: delivered rate against {label}")
        figures.append(f"<figure>{chart}<figcaption>{escape(scenario)}</figcaption></figure>")
    return f'<div class="charts">{"".join(figures)}</div>'


def latency_curve(buckets: dict[int, int]) -> list[tuple[float, float]]:
    """(log-percentile x, ms) points of summed buckets, up to the percentile their count
    can resolve, and the max one step beyond it."""
    total = sum(buckets.values())
    if not total:
        return []
    shown = [p for p in CURVE_PERCENTILES if total * (1 - p / 100) >= 1]
    points = [(percentile_x(p), percentile(buckets, p) / 1000) for p in shown]
    top = percentile_x(min(99.999, 100 - 100 / (10 * total)))  # max: a little further right
    return [*points, (max(top, points[-1][0] + 0.3), percentile(buckets, 100) / 1000)]


def latency_curves(stages: list[dict]) -> str:
    """Per stage, each tail kind's latency against percentile on a log-percentile axis."""
    figures = []
    for stage in stages:
        lines = {}
        for kind in TAIL_KINDS:
            index, counts = (stage["series"].get(name) or [] for name in bucket_series(kind))
            curve = latency_curve(dict(zip(index, counts)))
            if curve:
                lines[kind] = curve
        if lines:
            sid = stage["stage_id"]
            chart = line_chart(lines, x_label="percentile", y_label="ms", x_kind="percentile",
                               y_kind="log", title=f"{sid}: latency by percentile", width=360,
                               height=220, chart_id=f"latency-{sid}")
            figures.append(f"<figure>{chart}<figcaption>{escape(sid)}: the measure window's "
                           "latency by percentile (last point: the max)</figcaption></figure>")
    if not figures:
        return "<p>No stage stored its latency buckets.</p>"
    return f'<div class="charts" id="latency-curves">{"".join(figures)}</div>'


def latency_table(stages: list[dict]) -> str:
    head = "".join(f"<th>{kind} {p.replace('_', '.')}</th>"
                   for kind in ("e2e", "pub_ack") for p in PERCENTILES)
    rows = "".join(
        f'<tr><td class="l">{escape(s["stage_id"])}</td>'
        + "".join(f'<td>{show(s["metrics"].get(name), name)}</td>'
                  for kind in ("e2e", "pub_ack") for p in PERCENTILES
                  for name in (f"{kind}_latency_{p}",)) + "</tr>"
        for s in stages)
    return f'<table id="latency"><tr><th class="l">stage (ms)</th>{head}</tr>{rows}</table>'


def per_second_charts(stages: list[dict]) -> str:
    """Per stage: delivered per second over the whole stage (measure window shaded), and the
    window's e2e p99 and broker CPU per second beside it."""
    rows = []
    for stage in stages:
        series, params = stage["series"], stage["params"]
        whole = series.get("stage_seconds") or []
        if not whole:
            continue
        start = whole[0] + params.get("warmup_s", 0)
        window = (start, start + params.get("measure_s", 0))
        sid = stage["stage_id"]
        charts = [time_series(whole, series.get("stage_delivered_per_s", []), window=window,
                              title=f"{sid}: delivered per second")]
        seconds = series.get("seconds") or []
        p99 = series.get(p99_per_s_series("e2e")) or []
        if any(v is not None for v in p99):
            charts.append(time_series(whole, _on(whole, seconds, [None if v is None else v / 1000
                                                                 for v in p99]),
                                      window=window, title=f"{sid}: e2e p99 per second",
                                      y_label="p99 ms", color=PALETTE[1]))
        cpu = series.get(BROKER_CPU_SERIES) or []
        if any(v is not None for v in cpu):
            charts.append(time_series(whole, _on(whole, seconds, cpu), window=window,
                                      title=f"{sid}: broker CPU per second",
                                      y_label="broker CPU %", color=PALETTE[2]))
        rows.append(f'<figure><div class="charts">{"".join(charts)}</div><figcaption>'
                    f"{escape(sid)}: delivered msg/s, e2e p99 and broker CPU per second "
                    "(shaded: measure window)</figcaption></figure>")
    return f'<div id="throughput">{"".join(rows)}</div>'


def _on(whole: list[int], seconds: list[int], values: list) -> list:
    """`values` of `seconds` placed on the whole stage's seconds (null elsewhere)."""
    at = dict(zip(seconds, values))
    return [at.get(s) for s in whole]


def score_card(stages: list[dict]) -> str:
    head = "".join(_head(name, label) for name, label in SCORE_CARD)
    rows = "".join(
        f'<tr><td class="l">{escape(s["stage_id"])}</td>'
        f'<td class="l {escape(s["validity"] or "")}">{escape(s["validity"] or "")}</td>'
        + "".join(f"<td>{show(s['metrics'].get(name), name)}</td>" for name, _ in SCORE_CARD)
        + "</tr>" for s in stages)
    return (f'<table id="score-card"><tr><th class="l">stage</th><th class="l">validity</th>'
            f"{head}</tr>{rows}</table>")


def cost_table(stages: list[dict]) -> str:
    """Capacity and what the broker spent, for the stages that measured any of it."""
    shown = [s for s in stages if any(s["metrics"].get(name) is not None for name, _ in COST)]
    if not shown:
        return "<p>No stage measured capacity or broker cost.</p>"
    head = "".join(_head(name, label) for name, label in COST)
    rows = "".join(
        f'<tr><td class="l">{escape(s["stage_id"])}</td>'
        + "".join(f"<td>{show(s['metrics'].get(name), name)}</td>" for name, _ in COST)
        + "</tr>" for s in shown)
    return f'<table id="cost"><tr><th class="l">stage</th>{head}</tr>{rows}</table>'


def _confidence(confidence: float | None) -> str:
    """1 - p as a percentage, never rounded up to a certainty: 0.99996 is ">99.9", not
    "100.0"."""
    if confidence is None:
        return show(None)
    return "&gt;99.9" if confidence > 0.999 else show(100 * confidence)


def verdicts(stages: list[dict]) -> str:
    """Every verdict, worst first, with the smallest step its metric can show (MDE) and
    why a metric is not guarded (too noisy) or not judged yet (learning)."""
    found = [(s["stage_id"], c) for s in stages for c in s.get("comparisons", [])]
    found.sort(key=lambda item: verdict_rank(item[1]["verdict"]))
    if not found:
        return "<p>No comparisons.</p>"
    rows = "".join(
        f'<tr class="{escape(c["verdict"])}"><td class="l">{escape(stage_id)}</td>'
        f'<td class="l">{escape(c["metric"])}</td><td class="l">{escape(c["verdict"])}</td>'
        f'<td>{show(c["baseline_value"], c["metric"])}</td><td>{show(c["value"], c["metric"])}</td>'
        f'<td class="l">{escape(unit_of(c["metric"]))}</td><td>{show(c["change_pct"])}</td><td>{show((c.get("detail") or {}).get("mde_pct"))}</td>'
        f'<td>{show(((c.get("detail") or {}).get("across") or {}).get("mde_pct"))}</td>'
        f'<td>{_confidence(c["confidence"])}</td>'
        f'<td class="l">{escape(verdict_note(c))}</td></tr>'
        for stage_id, c in found)
    return ('<table id="verdicts"><tr><th class="l">stage</th><th class="l">metric</th>'
            '<th class="l">verdict</th><th>baseline</th><th>this run</th><th class="l">unit</th>'
            '<th>change %</th>'
            '<th title="the smallest step caught within two nights (90%) at this noise">'
            'MDE %</th><th title="the same for a step on every stage of the run on this '
            'fingerprint (a change of the broker), judged across them">MDE all stages %</th>'
            f'<th>confidence %</th><th class="l">note</th></tr>{rows}</table>')


def invalid_stages(stages: list[dict]) -> str:
    bad = invalid_reasons(stages)
    if not bad:
        return "<p>Every stage passed its validity gates.</p>"
    return '<ul id="invalid">' + "".join(
        f'<li class="invalid">{escape(stage_id)}: {escape(why)}</li>'
        for stage_id, why in bad) + "</ul>"


def stage_notes(stages: list[dict]) -> str:
    """What the aggregation noted of the stages, valid or not (`tables.noted`)."""
    notes = noted(stages)
    if not notes:
        return "<p>Nothing to note.</p>"
    return '<ul id="notes">' + "".join(
        f"<li>{escape(whose)}: {escape(note)}</li>" for whose, note in notes) + "</ul>"


_HOST_HEADINGS = {"clock_offset_s": "clock offset", "memory_bytes": "memory",
                  "paho_mqtt": "paho-mqtt"}


def _host_cell(host: dict, column: str) -> str:
    """A fingerprint field as a person reads it: memory in GiB, the clock's offset in ms,
    yes/no, a list joined."""
    value = host.get(column)
    if column == "memory_bytes" and isinstance(value, (int, float)):
        return f"{value / 2**30:,.1f} GiB"
    if column == "clock_offset_s" and isinstance(value, (int, float)):
        return f"{value * 1000:+.3f} ms"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, (list, tuple)):
        return escape(", ".join(map(str, value)))
    return show(value)


def hosts_section(hosts: list[dict], tuning: list[dict]) -> str:
    columns = ("host", "roles", "cpu_model", "cpus", "memory_bytes", "kernel", "os", "python",
               "paho_mqtt", "clock_offset_s", "clock_trusted", "hash")
    rows = "".join("<tr>" + "".join(f'<td class="l">{_host_cell(h, c)}</td>' for c in columns)
                   + "</tr>" for h in hosts)
    heads = "".join(f'<th class="l">{_HOST_HEADINGS.get(c, c.replace("_", " "))}</th>'
                    for c in columns)
    table = f'<table id="hosts"><tr>{heads}</tr>{rows}</table>'
    entries = "".join(
        f'<tr><td class="l">{escape(t["host"])}</td><td class="l">{escape(e["kind"])}</td>'
        f'<td class="l">{escape(e["key"])}</td><td class="l">{show(e["wanted"])}</td>'
        f'<td class="l">{show(e["before"])}</td><td class="l">{show(e["after"])}</td>'
        f'<td class="l">{"yes" if e["ok"] else "NO"}</td><td class="l">{escape(e["action"])}</td></tr>'
        for t in tuning for e in t.get("entries", []))
    tuning_table = ('<table id="tuning"><tr><th class="l">host</th><th class="l">kind</th>'
                    '<th class="l">key</th><th class="l">wanted</th><th class="l">before</th>'
                    '<th class="l">after</th><th class="l">ok</th><th class="l">action</th></tr>'
                    f"{entries}</table>") if entries else "<p>No tuning profile.</p>"
    return table + "<h3>Tuning</h3>" + tuning_table


def _status(run: dict) -> str:
    status = escape(run["status"])
    if run["status"] == "running":  # rendered before teardown; teardown renders it again
        return f"status <b>{status}</b> (teardown has not closed it yet)"
    return f'status <b class="status-{status}">{status}</b>' + (
        f" ({escape(run['excluded_reason'])})" if run.get("excluded_reason") else "")


def render(run: dict, stages: list[dict], hosts: list[dict], tuning: list[dict] = (),
           histories: Histories | None = None) -> str:
    """The page. `histories`: stage id -> its comparable earlier nights (`Store.history`
    entries, oldest first)."""
    stages, histories = in_run_order(stages), histories or {}
    title = f"perfpipe run {run['run_id']}"
    summary = said_counts(verdict_counts(c for s in stages
                                         for c in s.get("comparisons", []))) or "none"
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f'<p>{escape(run["kind"])} · suite {escape(run["suite"])} · '
            f'{escape(run["broker_kind"])} {escape(broker_version_text(run))} · '
            + _status(run)
            + (f' · release {escape(run["release_label"])}' if run.get("release_label") else "")
            + (f' · warning: {escape(run["warning"])}' if run.get("warning") else "")
            + f"</p><p>verdicts: {escape(summary)}</p>"
            + attention(stages, histories, run["status"])
            + f"<h2>History</h2>{history_section(stages, histories)}"
            f"<h2>Delivered rate against what each scenario steps</h2>{rate_charts(stages)}"
            f"<h2>Score card</h2>{score_card(stages)}"
            f"<h2>Capacity and broker cost</h2>{cost_table(stages)}"
            f"<h2>Verdicts</h2>{verdicts(stages)}"
            f"<h2>Invalid stages</h2>{invalid_stages(stages)}"
            f"<h2>Notes on the stages</h2>{stage_notes(stages)}"
            f"<h2>Latency by percentile</h2>{latency_curves(stages)}{latency_table(stages)}"
            f"<h2>Per second</h2>{per_second_charts(stages)}"
            f"<h2>Hosts</h2>{hosts_section(hosts, list(tuning))}</body></html>")

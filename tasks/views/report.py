"""The run report: one self-contained HTML page (inline SVG, no network needed).

`render` is pure (run, stages, hosts in; HTML out) and escapes every text; the report step
(`tasks.steps.report`) reads the store and writes the file. The page
follows the seed reports: delivered rate against clients per QoS with the target line
(IBM's figures), latency percentiles per stage, each stage's per-second throughput with
the measure window shaded, a MessageSight-style score card, verdicts against the
baseline, invalid stages with their reasons, and every host's fingerprint and tuning.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape

from ..metrics import VERDICTS
from .charts import line_chart, time_series
from .tables import verdict_note

SCORE_CARD = (("delivered_rate", "delivered msg/s"), ("target_rate", "target msg/s"),
              ("e2e_latency_avg", "avg"), ("e2e_latency_p50", "p50"), ("e2e_latency_p95", "p95"),
              ("e2e_latency_p99", "p99"), ("e2e_latency_p99_no_stall", "p99 without stall seconds"),
              ("e2e_latency_p99_typical", "p99 of a typical second"),
              ("e2e_stall_seconds", "stall seconds"), ("e2e_stall_longest", "longest stall"),
              ("e2e_latency_stddev", "stddev"), ("lost", "lost"),
              ("errors", "errors"), ("broker_cpu_avg", "broker CPU % avg"),
              ("broker_cpu_max", "max"), ("broker_rss_max", "broker RSS MiB max"))
# What the broker spent (from its processes, its own metrics or its host: see the stage's
# problems), and a search stage's capacity
COST = (("max_rate", "capacity msg/s"), ("broker_cpu_s_per_10k", "broker CPU-s / 10K msgs"),
        ("broker_rss_per_1k_conn", "RSS / 1K conns MiB"), ("broker_rss_avg", "RSS MiB avg"),
        ("broker_cpu_user_avg", "user %"), ("broker_cpu_sys_avg", "sys %"),
        ("broker_threads_max", "threads"), ("broker_open_files_max", "open files"),
        ("broker_ctx_switches_per_s", "ctx switches/s"), ("broker_connections_max", "connections"),
        ("broker_backlog_max", "backlog (its own)"), ("host_cpu_avg", "host CPU %"),
        ("host_net_rx_avg", "host rx B/s"), ("host_net_tx_avg", "host tx B/s"))
MIB_METRICS = ("broker_rss_avg", "broker_rss_max", "broker_rss_per_1k_conn", "host_mem_used_max")
# Drawn night by night where a stage measured them (`histories` of `render`)
HISTORY_METRICS = ("max_rate", "broker_cpu_s_per_10k", "broker_rss_per_1k_conn")
History = dict[str, dict[str, list[tuple[str, float | None]]]]  # stage -> metric -> (run, value)
PERCENTILES = ("p50", "p95", "p99", "p99_9", "max")
_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right;font-size:13px}th{background:#f3f3f3}td.l,th.l{text-align:left}
.invalid{color:#b00}.regression{background:#fdd}.suspected{background:#fec}
.improvement{background:#dfd}.charts{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0}figcaption{font-size:12px;color:#555}"""


def fmt(value, name: str = "") -> str:
    if value is None:
        return "–"
    if name in MIB_METRICS:
        value = value / 2**20
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return escape(str(value))


def _ordered(stages: list[dict]) -> list[dict]:
    return sorted(stages, key=lambda s: s["params"].get("index", 0))


def _publishers(stage: dict) -> int:
    return sum(g["count"] for g in stage["params"].get("groups", []) if g["role"] == "pub")


def rate_charts(stages: list[dict]) -> str:
    """Per scenario: delivered rate against publishers, one line per QoS, target dashed."""
    by_scenario: dict[str, list[dict]] = defaultdict(list)
    for stage in stages:
        by_scenario[stage["params"].get("scenario", "?")].append(stage)
    figures = []
    for scenario, members in sorted(by_scenario.items()):
        lines: dict[str, list] = defaultdict(list)
        target = {}
        for stage in members:
            clients, delivered = _publishers(stage), stage["metrics"].get("delivered_rate")
            if delivered is not None:
                lines[f"QoS {stage['params'].get('qos')}"].append((clients, delivered))
            if stage["metrics"].get("target_rate") is not None:
                target[clients] = stage["metrics"]["target_rate"]
        chart = line_chart(lines, target=sorted(target.items()), x_label="publishers",
                           y_label="delivered msg/s", chart_id=f"rate-{scenario}",
                           title=f"{scenario}: delivered rate against publishers")
        figures.append(f"<figure>{chart}<figcaption>{escape(scenario)}</figcaption></figure>")
    return f'<div class="charts">{"".join(figures)}</div>'


def latency_table(stages: list[dict]) -> str:
    head = "".join(f"<th>{kind} {p.replace('_', '.')}</th>"
                   for kind in ("e2e", "pub_ack") for p in PERCENTILES)
    rows = "".join(
        f'<tr><td class="l">{escape(s["stage_id"])}</td>'
        + "".join(f'<td>{fmt(s["metrics"].get(f"{kind}_latency_{p}"))}</td>'
                  for kind in ("e2e", "pub_ack") for p in PERCENTILES) + "</tr>"
        for s in stages)
    return (f'<table id="latency"><tr><th class="l">stage (us)</th>{head}</tr>{rows}</table>')


def throughput_charts(stages: list[dict]) -> str:
    figures = []
    for stage in stages:
        series, params = stage["series"], stage["params"]
        seconds = series.get("stage_seconds") or []
        if not seconds:
            continue
        start = seconds[0] + params.get("warmup_s", 0)
        chart = time_series(seconds, series.get("stage_delivered_per_s", []),
                            window=(start, start + params.get("measure_s", 0)),
                            title=f"{stage['stage_id']}: delivered per second")
        figures.append(f"<figure>{chart}<figcaption>{escape(stage['stage_id'])} "
                       f"(shaded: measure window)</figcaption></figure>")
    return f'<div class="charts" id="throughput">{"".join(figures)}</div>'


def score_card(stages: list[dict]) -> str:
    head = "".join(f"<th>{escape(label)}</th>" for _, label in SCORE_CARD)
    rows = "".join(
        f'<tr><td class="l">{escape(s["stage_id"])}</td>'
        f'<td class="l {escape(s["validity"] or "")}">{escape(s["validity"] or "")}</td>'
        + "".join(f"<td>{fmt(s['metrics'].get(name), name)}</td>" for name, _ in SCORE_CARD)
        + "</tr>" for s in stages)
    return (f'<table id="score-card"><tr><th class="l">stage</th><th class="l">validity</th>'
            f"{head}</tr>{rows}</table><p>latency columns: end-to-end, microseconds</p>")


def cost_table(stages: list[dict]) -> str:
    """Capacity and what the broker spent, for the stages that measured any of it."""
    shown = [s for s in stages if any(s["metrics"].get(name) is not None for name, _ in COST)]
    if not shown:
        return "<p>No stage measured capacity or broker cost.</p>"
    head = "".join(f"<th>{escape(label)}</th>" for _, label in COST)
    rows = "".join(
        f'<tr><td class="l">{escape(s["stage_id"])}</td>'
        + "".join(f"<td>{fmt(s['metrics'].get(name), name)}</td>" for name, _ in COST)
        + "</tr>" for s in shown)
    return f'<table id="cost"><tr><th class="l">stage</th>{head}</tr>{rows}</table>'


def history_charts(stages: list[dict], histories: History) -> str:
    """Per stage and capacity or cost metric: its value night by night (oldest first,
    tonight last), tonight's verdict in the caption."""
    figures = []
    for stage in stages:
        verdict_of = {c["metric"]: c["verdict"] for c in stage.get("comparisons", [])}
        for metric, nights in histories.get(stage["stage_id"], {}).items():
            points = [(i + 1, v) for i, (_, v) in enumerate(nights) if v is not None]
            if not points:
                continue
            chart = line_chart({metric: points}, x_label="night (tonight last)", y_label=metric,
                               title=f"{stage['stage_id']}: {metric} night by night",
                               width=360, height=200,
                               chart_id=f"history-{stage['stage_id']}-{metric}")
            values = " · ".join(fmt(v, metric) for _, v in points)
            figures.append(f"<figure>{chart}<figcaption>{escape(stage['stage_id'])} "
                           f"{escape(metric)}: {values} "
                           f"(tonight: {escape(verdict_of.get(metric, 'not judged'))})"
                           f"</figcaption></figure>")
    if not figures:
        return "<p>No stage has a capacity or cost history yet.</p>"
    return f'<div class="charts" id="history">{"".join(figures)}</div>'


def verdicts(stages: list[dict]) -> str:
    """Every verdict, worst first, with the smallest step its metric can show (MDE) and
    why a metric is not guarded (too noisy) or not judged yet (learning)."""
    found = [(s["stage_id"], c) for s in stages for c in s.get("comparisons", [])]
    found.sort(key=lambda item: VERDICTS.index(item[1]["verdict"])
               if item[1]["verdict"] in VERDICTS else len(VERDICTS))
    if not found:
        return "<p>No comparisons.</p>"
    rows = "".join(
        f'<tr class="{escape(c["verdict"])}"><td class="l">{escape(stage_id)}</td>'
        f'<td class="l">{escape(c["metric"])}</td><td class="l">{escape(c["verdict"])}</td>'
        f'<td>{fmt(c["baseline_value"])}</td><td>{fmt(c["value"])}</td>'
        f'<td>{fmt(c["change_pct"])}</td><td>{fmt((c.get("detail") or {}).get("mde_pct"))}</td>'
        f'<td>{fmt(c["confidence"])}</td><td class="l">{escape(verdict_note(c))}</td></tr>'
        for stage_id, c in found)
    return ('<table id="verdicts"><tr><th class="l">stage</th><th class="l">metric</th>'
            '<th class="l">verdict</th><th>baseline</th><th>this run</th><th>change %</th>'
            '<th title="the smallest step caught within two nights (90%) at this noise">'
            f'MDE %</th><th>confidence</th><th class="l">note</th></tr>{rows}</table>')


def invalid_stages(stages: list[dict]) -> str:
    bad = [s for s in stages if s["validity"] != "valid"]
    if not bad:
        return "<p>Every stage passed its validity gates.</p>"
    return '<ul id="invalid">' + "".join(
        f'<li class="invalid">{escape(s["stage_id"])}: {escape(s["reason"] or "")}</li>'
        for s in bad) + "</ul>"


def hosts_section(hosts: list[dict], tuning: list[dict]) -> str:
    columns = ("host", "roles", "cpu_model", "cpus", "memory_bytes", "kernel", "os", "python",
               "paho_mqtt", "clock_offset_s", "clock_trusted", "hash")
    rows = "".join("<tr>" + "".join(f'<td class="l">{fmt(h.get(c))}</td>' for c in columns)
                   + "</tr>" for h in hosts)
    table = (f'<table id="hosts"><tr>{"".join(f"<th class=l>{c}</th>" for c in columns)}</tr>'
             f"{rows}</table>")
    entries = "".join(
        f'<tr><td class="l">{escape(t["host"])}</td><td class="l">{escape(e["kind"])}</td>'
        f'<td class="l">{escape(e["key"])}</td><td class="l">{fmt(e["wanted"])}</td>'
        f'<td class="l">{fmt(e["before"])}</td><td class="l">{fmt(e["after"])}</td>'
        f'<td class="l">{"yes" if e["ok"] else "NO"}</td><td class="l">{escape(e["action"])}</td></tr>'
        for t in tuning for e in t.get("entries", []))
    tuning_table = ('<table id="tuning"><tr><th class="l">host</th><th class="l">kind</th>'
                    '<th class="l">key</th><th class="l">wanted</th><th class="l">before</th>'
                    '<th class="l">after</th><th class="l">ok</th><th class="l">action</th></tr>'
                    f"{entries}</table>") if entries else "<p>No tuning profile.</p>"
    return table + "<h3>Tuning</h3>" + tuning_table


def render(run: dict, stages: list[dict], hosts: list[dict], tuning: list[dict] = (),
           histories: History | None = None) -> str:
    stages = _ordered(stages)
    title = f"perfpipe run {run['run_id']}"
    counts = defaultdict(int)
    for stage in stages:
        for comparison in stage.get("comparisons", []):
            counts[comparison["verdict"]] += 1
    summary = ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in sorted(counts.items())) or "none"
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f'<p>{escape(run["kind"])} · suite {escape(run["suite"])} · '
            f'{escape(run["broker_kind"])} {escape(str(run.get("broker_version")))} · '
            f'status <b>{escape(run["status"])}</b>'
            + (f' · release {escape(run["release_label"])}' if run.get("release_label") else "")
            + f"</p><p>verdicts: {escape(summary)}</p>"
            f"<h2>Delivered rate against clients</h2>{rate_charts(stages)}"
            f"<h2>Score card</h2>{score_card(stages)}"
            f"<h2>Capacity and broker cost</h2>{cost_table(stages)}"
            f"{history_charts(stages, histories or {})}"
            f"<h2>Verdicts</h2>{verdicts(stages)}"
            f"<h2>Invalid stages</h2>{invalid_stages(stages)}"
            f"<h2>Latency percentiles</h2>{latency_table(stages)}"
            f"<h2>Throughput per second</h2>{throughput_charts(stages)}"
            f"<h2>Hosts</h2>{hosts_section(hosts, list(tuning))}</body></html>")

"""Step 9, report: one self-contained HTML page per run (inline SVG, no network needed).

`render` is pure (run and stage dicts in, HTML out); every text is escaped.
"""

from __future__ import annotations

import json
from html import escape

from .run_context import RunContext

REPORT_FILE = "report.html"
SCORE_METRICS = (("delivered_rate", "delivered msg/s"), ("target_rate", "target msg/s"),
                 ("achieved_ratio", "achieved"), ("e2e_latency_avg", "e2e avg us"),
                 ("e2e_latency_p50", "p50 us"), ("e2e_latency_p95", "p95 us"),
                 ("e2e_latency_p99", "p99 us"), ("e2e_latency_stddev", "stddev us"),
                 ("lost", "lost"), ("errors", "errors"), ("broker_cpu_avg", "broker CPU %"))
_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f3f3f3}td.l{text-align:left}.invalid{color:#b00}
.regression{background:#fdd}.improvement{background:#dfd}svg{background:#fafafa}"""


def fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return escape(str(value))


def _bars(stages: list[dict]) -> str:
    """Delivered rate per stage against its target line."""
    rows = [(s["stage_id"], s["metrics"].get("delivered_rate") or 0.0,
             s["metrics"].get("target_rate") or 0.0) for s in stages]
    top = max([max(d, t) for _, d, t in rows] + [1.0])
    width, bar = 640, 22
    parts = [f'<svg id="rate-chart" role="img" width="{width + 260}" height="{bar * len(rows) + 30}">'
             f'<title>delivered rate per stage against target</title>']
    for i, (name, delivered, target) in enumerate(rows):
        y = 10 + i * bar
        parts.append(f'<text x="0" y="{y + 15}" font-size="11">{escape(name)}</text>'
                     f'<rect x="250" y="{y + 3}" width="{width * delivered / top:.1f}" '
                     f'height="{bar - 8}" fill="#4a7"/><line x1="{250 + width * target / top:.1f}" '
                     f'x2="{250 + width * target / top:.1f}" y1="{y}" y2="{y + bar}" stroke="#c33"/>')
    parts.append("</svg>")
    return "".join(parts)


def _sparkline(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    top = max(values) or 1.0
    step = 200 / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{40 - 36 * v / top:.1f}" for i, v in enumerate(values))
    return (f'<svg class="series" width="200" height="42"><polyline fill="none" stroke="#36c" '
            f'points="{points}"/></svg>')


def _score_card(stages: list[dict]) -> str:
    head = "".join(f"<th>{escape(label)}</th>" for _, label in SCORE_METRICS)
    rows = []
    for s in stages:
        cells = "".join(f"<td>{fmt(s['metrics'].get(name))}</td>" for name, _ in SCORE_METRICS)
        reason = f' title="{escape(s["reason"] or "")}"' if s["validity"] != "valid" else ""
        rows.append(f'<tr><td class="l">{escape(s["stage_id"])}</td>'
                    f'<td class="l {escape(s["validity"])}"{reason}>{escape(s["validity"])}</td>'
                    f'{cells}<td>{_sparkline(s["series"].get("delivered_per_s", []))}</td></tr>')
    return (f'<table id="score-card"><tr><th>stage</th><th>validity</th>{head}'
            f'<th>delivered per second</th></tr>{"".join(rows)}</table>')


def _verdicts(stages: list[dict]) -> str:
    rows = [f'<tr class="{escape(c["verdict"])}"><td class="l">{escape(s["stage_id"])}</td>'
            f'<td class="l">{escape(c["metric"])}</td><td class="l">{escape(c["verdict"])}</td>'
            f'<td>{fmt(c["baseline_value"])}</td><td>{fmt(c["value"])}</td>'
            f'<td>{fmt(c["change_pct"])}</td><td>{fmt(c["confidence"])}</td></tr>'
            for s in stages for c in s.get("comparisons", [])]
    if not rows:
        return "<p>No comparisons.</p>"
    return ('<table id="verdicts"><tr><th>stage</th><th>metric</th><th>verdict</th>'
            '<th>baseline</th><th>tonight</th><th>change %</th><th>confidence</th></tr>'
            + "".join(rows) + "</table>")


def _invalid(stages: list[dict]) -> str:
    bad = [s for s in stages if s["validity"] != "valid"]
    if not bad:
        return "<p>Every stage passed its validity gates.</p>"
    return "<ul>" + "".join(f'<li class="invalid">{escape(s["stage_id"])}: '
                            f'{escape(s["reason"] or "")}</li>' for s in bad) + "</ul>"


def _hosts(fingerprints: list[dict]) -> str:
    rows = "".join(f'<tr><td class="l">{escape(str(f.get("host")))}</td>'
                   f'<td class="l">{escape(str(f.get("cpu_model")))}</td><td>{fmt(f.get("cpus"))}</td>'
                   f'<td>{fmt(f.get("memory_bytes"))}</td><td class="l">{escape(str(f.get("kernel")))}</td>'
                   f'<td>{fmt(f.get("clock_offset_s"))}</td><td class="l">{escape(str(f.get("hash")))}</td></tr>'
                   for f in fingerprints)
    return ('<table id="hosts"><tr><th>host</th><th>CPU</th><th>cores</th><th>memory</th>'
            f'<th>kernel</th><th>clock offset s</th><th>fingerprint</th></tr>{rows}</table>')


def render(run: dict, stages: list[dict], fingerprints: list[dict]) -> str:
    title = f"perfpipe run {run['run_id']}"
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f'<p>{escape(run["kind"])} · suite {escape(run["suite"])} · '
            f'{escape(run["broker_kind"])} {escape(str(run.get("broker_version")))} · '
            f'status {escape(run["status"])}</p>'
            f"<h2>Delivered rate per stage (red line: target)</h2>{_bars(stages)}"
            f"<h2>Score card</h2>{_score_card(stages)}"
            f"<h2>Verdicts</h2>{_verdicts(stages)}"
            f"<h2>Invalid stages</h2>{_invalid(stages)}"
            f"<h2>Hosts</h2>{_hosts(fingerprints)}</body></html>")


def write_report(ctx: RunContext) -> str:
    store = ctx.store()
    fingerprints = [json.loads(p.read_text()) for p in sorted((ctx.run_dir / "hosts").glob("*.json"))]
    html = render(store.run(ctx.run_id), store.stages(ctx.run_id), fingerprints)
    path = ctx.run_dir / REPORT_FILE
    path.write_text(html)
    return str(path)

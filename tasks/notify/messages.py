"""Slack messages as Block Kit: pure functions, data in, {"text", "blocks"} out.

- `run_message`: the regressions a run has to tell (new confirmed alerts); first, one line
  for each change the run's stages flagged together (`across_changes`); then grouped by
  scenario, each with its stage (clients, QoS, rate), metric, baseline -> tonight with
  units (for a metric judged at its covariate, the baseline says so, and its earlier
  nights are listed as measured), % change, confidence, nights of evidence, state and
  fingerprint; capped at `MAX_ROWS`, the rest summarised with a count. Release runs
  always get one (a summary).
- `thread_reply`: later news about alerts already told (grown, recovered), for their thread.
- `invalid_run_message`, `missing_nightly_message`, `failure_message`: the short ones.
Slack's limits: a header is at most 150 characters, a section text at most 3000.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..views.tables import broker_version_text, flagged_together, said_counts
from ..views.units import with_unit

MAX_ROWS = 10
_SECTION_LIMIT = 2900


@dataclass(frozen=True)
class Row:
    """One alert's evidence: the verdict behind it and the stage it is about."""

    alert_id: int
    status: str  # the alert's status (confirmed, recovered, acked, ...) or the verdict
    verdict: str  # the comparison's verdict: regression, suspected, unchanged, ...
    scenario: str
    stage_id: str
    params: dict  # the stage's plan (qos, groups) as stored
    metric: str
    baseline_value: float | None
    value: float | None
    change_pct: float | None
    confidence: float | None
    nights: int
    fingerprint: str | None
    run_id: str  # the run the evidence comes from
    history: tuple[float, ...] = ()  # earlier nights' values as measured, oldest first
    # the smallest step the metric shows within two nights, as a person reads it
    # (`tables.mde_text`: '7.6%', '7.6% (4.2% on all 4 stages at once)'), or ''
    mde_text: str = ""
    # what judging it across the run's stages said, when they flagged it (`tables.across_note`)
    across_note: str = ""
    # why the baseline is not the earlier nights' level: 'at tonight's <covariate>' (the
    # nights moved along their slope to tonight's covariate), or ''
    baseline_note: str = ""
    # a capacity the broker kept up with on CPU to spare (`tables.cpu_note`), or ''
    cpu_note: str = ""
    # the release baseline ran on another fingerprint (`tables.release_note`), or ''
    release_note: str = ""


@dataclass(frozen=True)
class Links:
    report: str  # a URL, or the report's path when no report URL is configured
    airflow: str | None = None


def stage_label(stage_id: str, params: dict) -> str:
    """'fanin.q1.c100 (100 pubs, 1 sub, QoS 1, 1,000 msg/s)' from the stored stage plan."""
    groups = params.get("groups", [])
    pubs = sum(g.get("count", 0) for g in groups if g.get("role") == "pub")
    subs = sum(g.get("count", 0) for g in groups if g.get("role") == "sub")
    rate = sum(g.get("count", 0) * g.get("rate_per_client", 0) for g in groups
               if g.get("role") == "pub")
    qos = params.get("qos", "?")
    return f"{stage_id} ({pubs:,} pubs, {subs:,} subs, QoS {qos}, {rate:,.0f} msg/s)"


def _baseline(row: Row) -> str:
    """'0.300 CPU-s', and '(at tonight's driver_cpu_s_per_10k)' after it when it is so."""
    value = with_unit(row.metric, row.baseline_value)
    return f"{value} ({row.baseline_note})" if row.baseline_note else value


def _row_line(row: Row) -> str:
    change = "n/a" if row.change_pct is None else f"{row.change_pct:+.1f}%"
    confidence = "n/a" if row.confidence is None else f"{100 * row.confidence:.1f}%"
    nights = f"{row.nights} night{'s' if row.nights != 1 else ''}"
    before = "before, as measured" if row.baseline_note else "before"
    earlier = (f" · {before}: " + ", ".join(with_unit(row.metric, v) for v in row.history[-5:])
               if row.history else "")
    sees = f" · sees steps from {row.mde_text}" if row.mde_text else ""
    across = f" · {row.across_note}" if row.across_note else ""
    cpu = "".join(f" · {note}" for note in (row.release_note, row.cpu_note) if note)
    return (f"• `{row.metric}` {_baseline(row)} → "
            f"*{with_unit(row.metric, row.value)}* ({change}) · confidence {confidence} · "
            f"{nights} · {row.status}{across}{cpu}{sees}{earlier}")


def blind_spots(stages: list[dict]) -> list[str]:
    """One line per judged metric too noisy to guard: the stage, the metric, the reason."""
    return [f"{s['stage_id']} `{c['metric']}`: {c['detail']['too_noisy']}"
            for s in stages for c in s.get("comparisons", [])
            if (c.get("detail") or {}).get("too_noisy")]


def across_changes(rows: list[Row], run_id: str) -> list[str]:
    """One line per change the run's stages flagged together (`Row.across_note`) that two
    or more rows tell: the metric, the stages those rows are about and what the stages
    showed together (of an earlier run, which)."""
    changes = flagged_together(((r.metric, r.fingerprint, r.run_id, r.across_note), r.stage_id)
                               for r in rows if r.across_note)
    return [f"*one change across stages:* `{metric}`, told here on {', '.join(stages)} · "
            f"{note}" + ("" if run == run_id else f" (run {run}, not told then)")
            for (metric, _, run, note), stages in changes]


def _grouped(rows: list[Row], run_id: str) -> list[str]:
    """Section texts: per scenario, per stage, one line per metric; at most MAX_ROWS rows."""
    by_scenario: dict[str, dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in rows[:MAX_ROWS]:
        by_scenario[row.scenario][row.stage_id].append(row)
    texts = []
    for scenario, stages in by_scenario.items():
        lines = [f"*{scenario}*"]
        for stage_rows in stages.values():
            first = stage_rows[0]
            earlier = f" — from run {first.run_id}, not told then" if first.run_id != run_id else ""
            lines.append(stage_label(first.stage_id, first.params) + earlier)
            lines += [_row_line(r) for r in stage_rows]
        texts += _packed(lines)
    if len(rows) > MAX_ROWS:
        texts.append(f"… and {len(rows) - MAX_ROWS} more regression(s) in the report")
    return texts


def _packed(lines: list[str]) -> list[str]:
    """Lines joined into as few section texts as Slack takes (`_SECTION_LIMIT` each), each
    line whole in one of them (a line longer than a section alone is cut, marked '…')."""
    texts: list[str] = []
    for line in lines:
        line = line if len(line) <= _SECTION_LIMIT else line[:_SECTION_LIMIT - 1] + "…"
        if texts and len(texts[-1]) + 1 + len(line) <= _SECTION_LIMIT:
            texts[-1] += "\n" + line
        else:
            texts.append(line)
    return texts


def _section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _context(*parts: str) -> dict:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": p} for p in parts if p]}


def _link(url: str | None, label: str) -> str:
    if not url:
        return ""
    return f"<{url}|{label}>" if url.startswith(("http://", "https://")) else f"{label}: {url}"


def run_message(run: dict, rows: list[Row], counts: dict[str, int], links: Links,
                blind: list[str] | None = None) -> dict:
    """The run's message: its new regressions (`rows`), the verdict counts and the metrics
    too noisy to guard (`blind`, `blind_spots`)."""
    label = f" {run['release_label']}" if run.get("release_label") else ""
    suspected = sum(r.status == "suspected" for r in rows)
    parts = [f"{len(rows) - suspected} regression(s)" if len(rows) > suspected else "",
             f"{suspected} suspected" if suspected else ""]
    what = ", ".join(p for p in parts if p) or "no regressions"
    head = (f"perfpipe {run['kind']}{label} run {run['run_id']}: {what} "
            f"({run['broker_kind']} {broker_version_text(run)}, suite {run['suite']})")
    summary = said_counts(counts)
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
              _section(f"verdicts: {summary or 'none'}")]
    changes = across_changes(rows, run["run_id"])
    blocks += [_section(text) for text in _packed(changes)]
    blocks += [_section(text) for text in _grouped(rows, run["run_id"])]
    if blind:
        more = [f"… and {len(blind) - MAX_ROWS} more in the report"] if len(blind) > MAX_ROWS else []
        blocks += [_section(text) for text in _packed(
            [f"too noisy to guard ({len(blind)}):", *blind[:MAX_ROWS], *more])]
    fingerprints = sorted({r.fingerprint for r in rows if r.fingerprint})
    blocks.append(_context(_link(links.report, "report"), _link(links.airflow, "Airflow run"),
                           f"fingerprint {', '.join(fingerprints)}" if fingerprints else ""))
    return {"text": head, "blocks": blocks}


def thread_reply(run: dict, rows: list[Row], links: Links) -> dict:
    """News in an alert's thread: a regression that grew, or one that recovered."""
    lines = []
    for row in rows:
        if row.status == "recovered":
            lines.append(f":white_check_mark: {row.stage_id} `{row.metric}` recovered: "
                         f"{with_unit(row.metric, row.value)} against the baseline "
                         f"{_baseline(row)}")
        else:
            lines.append(f":small_red_triangle: {row.stage_id} {_row_line(row)[2:]}")
    texts = _packed([f"run {run['run_id']}:", *lines])
    return {"text": texts[0] + ("\n…" if len(texts) > 1 else ""),
            "blocks": [*map(_section, texts), _context(_link(links.report, "report"))]}


def invalid_run_message(run: dict, invalid: dict[str, str], total: int, links: Links) -> dict:
    """A run whose stages were mostly invalid: nothing in it could be judged."""
    reasons = "\n".join(f"• {stage}: {reason}" for stage, reason in list(invalid.items())[:5])
    text = (f":warning: perfpipe {run['kind']} run {run['run_id']}: {len(invalid)} of {total} "
            f"stages invalid, so they were not compared")
    return {"text": text, "blocks": [_section(text), _section(reasons or "(no reasons recorded)"),
                                     _context(_link(links.report, "report"),
                                              _link(links.airflow, "Airflow run"))]}


def missing_nightly_message(last_run: dict | None, max_age_h: float) -> dict:
    if last_run is None:
        text = ":warning: perfpipe: no nightly run has ever been recorded"
    else:
        text = (f":warning: perfpipe: no nightly run in the last {max_age_h:g} h; the last one, "
                f"{last_run['run_id']}, started {last_run['started_at']:%Y-%m-%d %H:%M} UTC "
                f"and ended {last_run['status']}")
    return {"text": text, "blocks": [_section(text)]}


def failure_message(*, dag_id: str, task_id: str, item: str | None, error: str,
                    log_url: str | None, run_id: str | None) -> dict:
    """A task failed: which task (and host or stage, for a mapped one), the error's first
    line, the log link."""
    first = (error.strip().splitlines() or ["(no message)"])[0][:300]
    where = f"{task_id}[{item}]" if item else task_id
    text = f"perfpipe {dag_id}: {where} failed: {first}"
    return {"text": text,
            "blocks": [_section(f":x: {text}"),
                       _context(f"*task* {where} · *run* {run_id or '-'}", _link(log_url, "log"))]}


def sent_late(message: dict, run_id: str, *, ended: bool = True) -> dict:
    """An earlier message Slack did not take then, as a later alert step sends it: a run's
    own (made as it `ended`) or a task's failure alert (made during the run)."""
    note = (f"sent late: Slack did not take it when run {run_id} ended" if ended
            else f"sent late: Slack did not take it during run {run_id}")
    return {"text": f"{message['text']} ({note})",
            "blocks": [*message.get("blocks", []), _context(f"_{note}_")]}

"""The report's history: what needs a human tonight, and every judged metric night by night.
Pure: a run's stages (with tonight's comparisons) and each stage's comparable earlier
nights in (`Store.history` entries, oldest first), HTML out."""

from __future__ import annotations

import math
from datetime import datetime
from html import escape

from ..metrics import CAPACITY_AND_COST, FLAGGED, flagged_across, noise_known, verdict_rank
from .charts import VERDICT_COLORS, Night, history_chart, sparkline
from .tables import flagged_together, mde_text, verdict_note
from .units import readable, show, unit_of

Histories = dict[str, list[dict]]  # stage id -> its earlier comparable nights, oldest first
BAND_SIGMAS = 2  # the shaded band: the baseline +- 2 noise sigmas (log scale)
# Drawn open for every stage that judges them (rate, capacity, cost); the other judged
# metrics are folded unless flagged tonight
HEADLINE = ("delivered_rate", *CAPACITY_AND_COST)


def _label(when: datetime | None, dated: bool) -> str:
    if when is None:
        return "?"
    return when.strftime("%m-%d" if dated else "%m-%d %H:%M")


def noise_band(centre: float | None, comparison: dict | None,
               sigmas: float = 1.0) -> tuple[float, float] | None:
    """(low, high): `centre` times exp(-/+ sigmas x sigma), sigma the night-to-night noise
    (log scale) a comparison measured (its detail's `noise_pct`); None when it measured
    none or its verdict was made before the noise was known (`noise_known`: a learning
    night's few nights give a sigma no band should be drawn from)."""
    c = comparison or {}
    noise = (c.get("detail") or {}).get("noise_pct")
    if centre is None or noise is None or not noise_known(c):
        return None
    return centre * math.exp(-sigmas * noise / 100), centre * math.exp(sigmas * noise / 100)


def _night(label: str, value: float, comparison: dict | None) -> Night:
    c = comparison or {}
    return Night(label, value, c.get("verdict"), c.get("baseline_value"),
                 noise_band(c.get("baseline_value"), comparison, BAND_SIGMAS))


def nights_of(metric: str, earlier: list[dict], stage: dict) -> tuple[list[Night], int | None]:
    """A metric's nights, oldest first and tonight last, and the index of the night its
    level shift began (tonight's comparison names that run), if any."""
    kept = [e for e in earlier if e["metrics"].get(metric) is not None]
    days = [e["started_at"].date() for e in kept if e.get("started_at")]
    dated = len(days) == len(set(days))  # one night a day: the date says which
    tonight = next((c for c in stage.get("comparisons", []) if c["metric"] == metric), None)
    nights = [_night(_label(e.get("started_at"), dated), e["metrics"][metric],
                     e.get("verdicts", {}).get(metric)) for e in kept]
    value = stage["metrics"].get(metric)
    if value is not None:
        nights.append(_night("tonight", value, tonight))
    shift = ((tonight or {}).get("detail") or {}).get("change_point") or {}
    runs = [e["run_id"] for e in kept] + [stage.get("run_id")]
    # the run the detector named, if drawn (it may lie before the nights drawn: no line)
    named = shift.get("run_id")
    began = runs.index(named) if named and named in runs[:len(nights)] else None
    return nights, began


def _flagged(stages: list[dict]) -> list[tuple[dict, dict]]:
    found = [(s, c) for s in stages for c in s.get("comparisons", []) if c["verdict"] in FLAGGED]
    return sorted(found, key=lambda sc: (verdict_rank(sc[1]["verdict"]), sc[0]["stage_id"]))


def _changes_across(flagged: list[tuple[dict, dict]]) -> list[str]:
    """A line per change the run's stages flagged together, even on one stage (the rows
    below carry no note): the metric, the stages it was flagged on, what all the stages
    combined showed; and the fingerprint, where changes of several are told."""
    together = flagged_together([
        ((c["metric"], stage.get("fingerprint_hash"), c["detail"]["across"]["stages"],
          c["detail"]["across"]["change_pct"]), stage["stage_id"])
        for stage, c in flagged if flagged_across(c.get("detail") or {})], least=1)
    several = len({fp for (_, fp, _, _), _ in together}) > 1
    return [f"<p>One change across stages: <b>{escape(metric)}</b> flagged on "
            f"{escape(', '.join(ids))} (its {n} stages together {change:+.1f}%"
            + (f", fingerprint {escape(str(fp))}" if several else "") + ").</p>"
            for (metric, fp, n, change), ids in together]


def _began(detail: dict) -> str:
    shift = detail.get("change_point") or {}
    if shift.get("nights_ago") is None:
        return "–"
    ago = {0: "tonight", 1: "1 night ago"}.get(shift["nights_ago"], f"{shift['nights_ago']} nights ago")
    return f"{ago} ({shift.get('shift_pct', 0):+.1f}%)"


def attention(stages: list[dict], histories: Histories, status: str) -> str:
    """The box at the top: regressions and suspicions, each with baseline -> tonight, the
    change, the nights of evidence, where the shift began and a trend; or that none needs
    you. A run that did not end ok says so first."""
    notes = []
    if status not in ("ok", "running"):
        notes.append(f"<p class=\"status-{escape(status)}\">This run ended <b>{escape(status)}</b>"
                     ": its results do not feed baselines (see Invalid stages and the log).</p>")
    flagged = _flagged(stages)
    if not flagged:
        return ('<div id="attention" class="attention quiet"><h2>Needs a human</h2>'
                + "".join(notes) + "<p>Nothing tonight: no regression, no suspicion.</p></div>")
    notes += _changes_across(flagged)
    rows = []
    for stage, c in flagged:
        detail, metric = c.get("detail") or {}, c["metric"]
        nights, _ = nights_of(metric, histories.get(stage["stage_id"], []), stage)
        trend = sparkline([readable(metric, n.value) for n in nights],
                          color=VERDICT_COLORS[c["verdict"]])
        rows.append(
            f'<tr class="{escape(c["verdict"])}"><td class="l">{escape(c["verdict"])}</td>'
            f'<td class="l">{escape(stage["stage_id"])}</td><td class="l">{escape(metric)}</td>'
            f'<td>{show(c["baseline_value"], metric)} &rarr; {show(c["value"], metric)} '
            f'{escape(unit_of(metric))}</td><td>{show(c["change_pct"])}%</td>'
            f'<td>{detail.get("nights") or 1}</td><td class="l">{_began(detail)}</td>'
            f'<td><a href="#history-{escape(stage["stage_id"])}-{escape(metric)}">{trend}</a></td></tr>')
    return ('<div id="attention" class="attention"><h2>Needs a human</h2>' + "".join(notes)
            + '<table id="regressions"><tr><th class="l">verdict</th><th class="l">stage</th>'
            '<th class="l">metric</th><th>baseline &rarr; tonight</th><th>change</th>'
            '<th>nights of evidence</th><th class="l">shift began</th><th>trend</th></tr>'
            + "".join(rows) + "</table></div>")


def _figure(stage: dict, comparison: dict, earlier: list[dict]) -> str:
    metric, detail = comparison["metric"], comparison.get("detail") or {}
    nights, began = nights_of(metric, earlier, stage)
    if len(nights) < 2:  # tonight alone is no history
        return ""
    unit = unit_of(metric)
    chart = history_chart(nights, title=f"{stage['stage_id']}: {metric} night by night",
                          y_label=f"{metric} ({unit})" if unit else metric, change_at=began,
                          chart_id=f"history-{stage['stage_id']}-{metric}",
                          scale=lambda v: readable(metric, v))
    mde = f" · smallest step it can show {mde_text(detail)}" if detail.get("mde_pct") else ""
    note = verdict_note(comparison)
    return (f'<figure class="{escape(comparison["verdict"])}">{chart}<figcaption>'
            f'<b>{escape(metric)}</b>: tonight {escape(comparison["verdict"])}{escape(mde)}'
            + (f" · {escape(note)}" if note else "") + "</figcaption></figure>")


def history_section(stages: list[dict], histories: Histories) -> str:
    """Per stage, each judged metric night by night: flagged ones first, then the headline
    ones (rate, capacity, cost), open; the others folded under them."""
    parts = []
    for stage in stages:
        comparisons = sorted(stage.get("comparisons", []), key=lambda c: verdict_rank(c["verdict"]))
        earlier = histories.get(stage["stage_id"], [])
        shown = [(c, _figure(stage, c, earlier)) for c in comparisons]
        is_open = [c["verdict"] in FLAGGED or c["metric"] in HEADLINE for c, _ in shown]
        first = "".join(f for (_, f), o in zip(shown, is_open) if o)
        rest = [f for (_, f), o in zip(shown, is_open) if not o and f]
        if not (first or rest):
            continue
        folded = (f"<details><summary>{len(rest)} more judged metric(s), "
                  f"{len(earlier)} earlier night(s)</summary><div class=\"charts\">{''.join(rest)}"
                  "</div></details>") if rest else ""
        parts.append(f'<h3>{escape(stage["stage_id"])}</h3><div class="charts">{first}</div>{folded}')
    if not parts:
        return '<p id="history">No judged metric yet: the first night has no history.</p>'
    return ('<div id="history"><p>Each point a night, tonight last; dashed: the baseline each '
            f'night was judged against; grey band: its night-to-night noise (&plusmn;{BAND_SIGMAS} '
            'sigmas), not the alarm threshold, which is wider; '
            'red and orange: nights judged a regression or suspected; a red dashed line: where '
            'the level shift began.</p>' + "".join(parts) + "</div>")

"""Plain-text tables for the CLI and the Airflow log: pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from ..analysis.host_gates import gated_note
from ..metrics import VERDICTS, flagged_across, verdict_rank
from ..rundir import STAGE_METRICS
from .units import readable, unit_of

# How a metric not judged tonight because its host was far off its usual (its pace, its
# steal) is counted for a person (its verdict is no_baseline: `tasks.analysis.host_gates`)
HOST_OFF = "not judged (host off its usual)"
COUNTED = VERDICTS + (HOST_OFF,)  # verdicts as `verdict_counts` counts them, worst first


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3f}"
    return str(value)


def table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(none)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    numeric = [all(isinstance(row.get(c), (int, float)) or row.get(c) is None for row in rows)
               for c in columns]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(columns, widths, numeric))
    body = ["  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(r, widths, numeric))
            for r in cells]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def in_run_order(stages: list[dict]) -> list[dict]:
    """Stored stages in the order the run ran them (their plan index)."""
    return sorted(stages, key=lambda s: s["params"].get("index", 0))


NOTES_PER_STAGE = 5  # a stage's notes shown one by one, the rest counted (all are stored)


def invalid_reasons(stages: list[dict]) -> list[tuple[str, str]]:
    """(stage id, why) of every stage that is not valid, in the given order (one whose
    results were never recorded, as after a run that failed in load_metrics, says so)."""
    return [(s["stage_id"], s.get("reason") or ("not judged: no results recorded"
                                                 if s["validity"] is None else "no reason given"))
            for s in stages if s["validity"] != "valid"]


def noted(stages: list[dict]) -> list[tuple[str, str]]:
    """(whose, note) for what the aggregation noted of the stages (`stages.notes`): a note
    every one of several stages carries (the run's: its hosts' clocks, its broker's
    samples) once, as "every stage"; at most `NOTES_PER_STAGE` a stage, the rest counted."""
    notes = {s["stage_id"]: list(dict.fromkeys((s.get("notes") or "").splitlines()))
             for s in stages}
    # a search's own row (its outcome) has no aggregation of its own to be noted
    measured = [notes[s["stage_id"]] for s in stages if "search_outcome" not in s["params"]]
    shared = set.intersection(*map(set, measured)) if len(measured) > 1 else set()
    out = [("every stage", note) for note in (measured[0] if shared else []) if note in shared]
    for stage_id, lines in notes.items():
        own = [note for note in lines if note not in shared]
        out += [(stage_id, note) for note in own[:NOTES_PER_STAGE]]
        if len(own) > NOTES_PER_STAGE:
            out.append((stage_id, f"and {len(own) - NOTES_PER_STAGE} more (all of them: the "
                                  f"run folder's {STAGE_METRICS})"))
    return out


def broker_version_text(run: dict) -> str:
    """The run's broker version as the report and the summary say it: not known until the
    broker step read it."""
    return run.get("broker_version") or "(version not known yet)"


# metrics_rows' columns: heading (its unit the report's, `units.unit_of`) -> metric
_METRIC_COLUMNS = {"expected": "expected_delivery_rate", "delivered": "delivered_rate",
                   "e2e p50": "e2e_latency_p50", "e2e p99": "e2e_latency_p99",
                   "p99 w/o stalls": "e2e_latency_p99_no_stall", "stall": "e2e_stall_seconds"}


def metrics_rows(stages: list[dict]) -> list[dict]:
    """A stage a row, each figure in the unit the verdicts and the report show it in."""
    return [{
        "stage": s["stage_id"], "validity": s["validity"],
        **{f"{head} {unit_of(name)}": readable(name, s["metrics"].get(name))
           for head, name in _METRIC_COLUMNS.items()},
        "lost": s["metrics"].get("lost"), "errors": s["metrics"].get("errors"),
    } for s in stages]


def verdict_note(comparison: dict, *, short: bool = False) -> str:
    """What a person should know beside a verdict: the metric is too noisy to guard (and
    why, unless `short`), its history is still learning the noise, or why it has none
    (its setup or the fingerprint changed) or was not judged tonight (its host was far off
    its usual: its pace, its steal), or that its baseline is what its nights say it is at tonight's value
    of its covariate (`tasks.analysis.covariate`); first, that the run's stages together
    flagged it (`tasks.analysis.across`); then, that a release baseline ran on another
    fingerprint (`release_note`); last, that a capacity came with CPU to spare
    (`cpu_note`)."""
    detail = comparison.get("detail") or {}
    return "; ".join(n for n in (_judged_note(comparison, short=short),
                                 release_note(detail, short=short),
                                 cpu_note(detail, short=short)) if n)


def release_note(detail: dict, *, short: bool = False) -> str:
    """That the release baseline a verdict was judged against ran on other hosts, tuning,
    broker build or measurement version (its fingerprint differs from tonight's); else ''."""
    if not detail.get("fingerprint"):
        return ""
    if short:
        return "release baseline on other hosts"
    return (f"the release baseline (run {detail.get('baseline_run')}) ran on another "
            "fingerprint (hosts, tuning, broker kind or measurement version): part of the "
            "change may be theirs")


def _judged_note(comparison: dict, *, short: bool) -> str:
    detail = comparison.get("detail") or {}
    flagged = flagged_note(detail, short=short)
    if detail.get("too_noisy"):  # a step on every stage may still be seen: `flagged` says so
        return "; ".join(n for n in (flagged, "too noisy to guard" if short
                                     else detail["too_noisy"]) if n)
    if short and (gated := gated_note(detail)):
        return gated
    if comparison["verdict"] == "no_baseline":  # why: a history anew, or tonight not judged
        return detail.get("new_history") or detail.get("note") or ""
    if comparison["verdict"] == "learning":
        return detail.get("note") or ""
    return "; ".join(n for n in (flagged, covariate_note(detail, short=short)) if n)


def cpu_note(detail: dict, *, short: bool = False) -> str:
    """'CPU to spare: broker 78%, host 88%' for a capacity the broker kept up with while
    neither it nor its host used its CPU up (`tasks.analysis.capacity`); else ''."""
    spare = detail.get("cpu_to_spare")
    if not spare:
        return ""
    if short:
        return f"CPU to spare: broker {spare['broker_pct']:.0f}%, host {spare['host_pct']:.0f}%"
    return (f"CPU to spare: at the rate that held, the broker used {spare['broker_pct']:.0f}% "
            f"of the cores it can use and its host {spare['host_pct']:.0f}% of its own, so "
            f"something else stopped it above that rate (a lock, the disk, the network, or "
            f"a host that let it sleep while it fell behind)")


def flagged_note(detail: dict, *, short: bool = False) -> str:
    """`across_note` of a verdict the run's stages flagged together; '' for any other."""
    return across_note(detail, short=short) if flagged_across(detail) else ""


def across_note(detail: dict, *, short: bool = False) -> str:
    """What judging the metric across the run's stages on its fingerprint said
    (`tasks.analysis.across`): 'flagged with its 4 stages: together +6.9%' for a stage
    flagged by them, 'across 4 stages +0.3%' otherwise; '' for a metric not judged so."""
    across = detail.get("across")
    if not across:
        return ""
    head = (f"flagged with its {across['stages']} stages: together "
            if across.get("flagged") else f"across {across['stages']} stages ")
    return head + f"{across['change_pct']:+.1f}%" + (
        "" if short else f" (sd {across['sd_pct']:.2g}%; a step on every stage is caught from "
                         f"{across['mde_pct']:.1f}%)")


def flagged_together(entries: Iterable[tuple[tuple, str]], least: int = 2
                     ) -> list[tuple[tuple, list[str]]]:
    """(key, stage id) of verdicts the run's stages flagged together, the key saying which
    change (its metric, fingerprint and what they showed together, ...): per key, the
    stages, for the changes that `least` or more of the entries tell, so a change of the
    broker on every stage reads as one change."""
    groups: dict[tuple, list[str]] = {}
    for key, stage in entries:
        groups.setdefault(key, []).append(stage)
    return [(key, stages) for key, stages in groups.items() if len(stages) >= least]


def mde_text(detail: dict) -> str:
    """'7.6%', or '7.6% (4.2% on all 4 stages at once)' for a metric also judged across
    stages; '' without an MDE."""
    if detail.get("mde_pct") is None:
        return ""
    across = detail.get("across")
    return f"{detail['mde_pct']:.1f}%" + (
        f" ({across['mde_pct']:.1f}% on all {across['stages']} stages at once)" if across else "")


def verdict_counts(comparisons: Iterable[dict]) -> Counter:
    """Verdicts counted as a person reads them: a metric not judged as its host ran off its
    usual (`HOST_OFF`) apart from a history with no baseline yet."""
    return Counter(HOST_OFF if gated_note(c.get("detail") or {}) else c["verdict"]
                   for c in comparisons)


def said_counts(counts: Counter) -> str:
    """'1 regression, 30 learning, 2 no baseline' (`verdict_counts`), worst first, as the
    report, Slack and the CLI all say them; '' for none."""
    order = [*COUNTED, *sorted(set(counts) - set(COUNTED))]
    return ", ".join(f"{counts[v]} {v.replace('_', ' ')}" for v in order if counts.get(v))


def covariate_note(detail: dict, *, short: bool = False) -> str:
    """'at tonight's driver_cpu_s_per_10k' when the baseline is what the nights say the
    metric is at tonight's value of its covariate, not their level as measured; else ''."""
    adjusted = detail.get("adjusted")
    if not adjusted:
        return ""
    return f"at tonight's {adjusted['by']}" + (
        "" if short else f" (slope {adjusted['slope']:g} over {detail.get('history')} nights)")


def verdict_rows(stages: list[dict]) -> list[dict]:
    """One row a verdict, worst first (in run order within a verdict); its values in the
    unit the report shows them in (`units`)."""
    found = [(s, c) for s in stages for c in s.get("comparisons", [])]
    found.sort(key=lambda sc: verdict_rank(sc[1]["verdict"]))  # stable: run order kept
    return [{
        "stage": s["stage_id"], "metric": c["metric"], "verdict": c["verdict"],
        "baseline": readable(c["metric"], c["baseline_value"]),
        "tonight": readable(c["metric"], c["value"]), "unit": unit_of(c["metric"]),
        "change %": c["change_pct"],
        "MDE %": (c.get("detail") or {}).get("mde_pct"),
        "MDE all stages %": ((c.get("detail") or {}).get("across") or {}).get("mde_pct"),
        "note": verdict_note(c, short=True),
    } for s, c in found]

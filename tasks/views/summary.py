"""What a person reads after a run: measured metrics, verdicts and where the files are.
Pure: the run and its stages in, text out. `run_summary` lists every verdict (`perfpipe
run`, `perfpipe show`); `short_summary` only those that need a look, the others counted
(`perfpipe nightly`, which `make run` runs and whose output must stay short)."""

from __future__ import annotations

from pathlib import Path

from ..metrics import NOT_JUDGED, VERDICTS, compared_release
from .tables import (
    HOST_OFF,
    broker_version_text,
    in_run_order,
    invalid_reasons,
    metrics_rows,
    noted,
    said_counts,
    table,
    verdict_counts,
    verdict_rows,
)

# Verdicts the short summary lists one by one: regression, suspected, improvement
NOTABLE = VERDICTS[:VERDICTS.index("unchanged")]
NO_BASELINE = "no earlier valid run of these stages on this fingerprint, so nothing was compared"
NEXT_COMPARES = " (the next run compares against this one)"
NONE_VALID = ("no stage was valid, so nothing was compared; an invalid stage feeds no "
              "baseline (its reasons: {where})")


def _header(run: dict) -> list[str]:
    return [f"\nrun {run['run_id']} ({run['kind']}, suite {run['suite']}, {run['broker_kind']} "
            f"{broker_version_text(run)}): {run['status']}"] + (
        [f"warning: {run['warning']}"] if run.get("warning") else [])


def _files(run: dict, files: dict[str, Path]) -> list[str]:
    """Where the report and the Slack message are; why one is not there."""
    def why(path: Path) -> str:
        if not path.parent.is_dir():
            return "(not on this machine: the run's folder is elsewhere)"
        return {"running": "(not written yet: the run is still going)",
                "failed": "(not written: the run failed before it)"}.get(
            run["status"], "(not written)")
    return [f"{label}: {path if path.exists() else why(path)}" for label, path in files.items()]


def _no_baseline(run: dict, stages: list[dict], reasons_listed: bool = False) -> str:
    """Why nothing was compared: no stage valid, no earlier run, or (named) a history that
    starts anew. `reasons_listed`: the text has the invalid stages' reasons already."""
    comparisons = [c for s in stages for c in s.get("comparisons", [])]
    if comparisons and all(c["verdict"] == "invalid" for c in comparisons):
        return NONE_VALID.format(where="above" if reasons_listed
                                 else f"perfpipe show {run['run_id']}")
    details = [c.get("detail") or {} for c in comparisons]
    why = sorted({d.get("new_history") or d.get("note") or "" for d in details} - {""})
    if not why:
        return NO_BASELINE + _feeds(run)
    return why[0] + (f" (and {len(why) - 1} more: perfpipe show {run['run_id']})"
                     if len(why) > 1 else "")


def _feeds(run: dict) -> str:
    """Whether the next run compares against this one: a run that ended other than ok, or
    was set aside, feeds no baseline."""
    if run["status"] not in ("ok", "running"):
        return f"; this run ended {run['status']}, so it feeds no baseline"
    if run.get("excluded"):  # an ok run a person or a gate set aside
        why = f" ({run['excluded_reason']})" if run.get("excluded_reason") else ""
        return f"; this run was set aside{why}, so it feeds no baseline"
    return NEXT_COMPARES


def _no_verdicts(run: dict, stages: list[dict]) -> str:
    """Why a run has no verdict at all: it ended, or has not yet come, before compare."""
    step = "compare" if stages else "load_metrics"
    return (f"no verdicts: the run has not reached {step} yet" if run["status"] == "running"
            else f"no verdicts: the run ended before {step}")


def said_of_stages(stages: list[dict]) -> list[str]:
    """Why each invalid stage is invalid, and what the aggregation noted of the stages."""
    invalid = [f"  {stage_id}: {why}" for stage_id, why in invalid_reasons(stages)]
    notes = [f"  {whose}: {note}" for whose, note in noted(stages)]
    return ((["\ninvalid stages:", *invalid] if invalid else [])
            + (["\nnotes on the stages:", *notes] if notes else []))


def judged_against(stages: list[dict]) -> str:
    """What a run's verdicts were judged against: its pinned release baseline's run, or its
    stages' earlier nights."""
    pinned = sorted({(label, detail["baseline_run"])
                     for s in stages for c in s.get("comparisons", [])
                     if (label := compared_release(detail := c.get("detail") or {}))
                     and detail.get("baseline_run")})
    if pinned:
        return "; ".join(f"release {label}'s baseline (run {run_id})" for label, run_id in pinned)
    return "earlier runs of the same stage, fingerprint and setup"


def run_summary(run: dict, stages: list[dict], files: dict[str, Path]) -> str:
    """`files`: label -> path of the run's report and Slack message (shown when present)."""
    stages = in_run_order(stages)
    lines = [*_header(run),
             "\nmeasured per stage (measure window only):\n" + table(metrics_rows(stages)),
             *said_of_stages(stages)]
    verdicts = verdict_rows(stages)
    if any(v["verdict"] not in NOT_JUDGED for v in verdicts):
        lines.append(f"\nverdicts against {judged_against(stages)}:\n" + table(verdicts))
    elif not verdicts:
        lines.append("\n" + _no_verdicts(run, stages))
    else:
        lines.append(f"\nnothing compared: {_no_baseline(run, stages, reasons_listed=True)}")
    return "\n".join(lines + _files(run, files))


def short_summary(run: dict, stages: list[dict], files: dict[str, Path]) -> str:
    """The run, its stages' metrics, the verdicts that need a look (the others counted,
    with the command that lists them all) and where the report and Slack message are."""
    stages = in_run_order(stages)
    lines = _header(run)
    verdicts = verdict_rows(stages)
    counts = verdict_counts(c for s in stages for c in s.get("comparisons", []))
    if stages:
        lines.append(table(metrics_rows(stages)))
    if not verdicts:
        lines.append(_no_verdicts(run, stages))
    elif set(counts) <= {*NOT_JUDGED, HOST_OFF}:
        lines.append(f"verdicts: none, {_no_baseline(run, stages)}")
    else:
        lines.append(f"verdicts: {said_counts(counts)} (all of them: perfpipe show "
                     f"{run['run_id']})")
        notable = [v for v in verdicts if v["verdict"] in NOTABLE]
        if notable:
            lines.append(table(notable))
    return "\n".join(lines + _files(run, files))

"""What a person reads after a run: measured metrics, verdicts and where the files are.
Pure: the run and its stages in, text out."""

from __future__ import annotations

from pathlib import Path

from .tables import metrics_rows, table, verdict_rows


def run_summary(run: dict, stages: list[dict], files: dict[str, Path]) -> str:
    """`files`: label -> path of the run's report and Slack message (shown when present)."""
    stages = sorted(stages, key=lambda s: s["params"].get("index", 0))
    lines = [f"\nrun id: {run['run_id']}  ({run['kind']}, suite {run['suite']}, "
             f"{run['broker_kind']} {run.get('broker_version')}): {run['status']}"
             + (f"\nwarning: {run['warning']}" if run.get("warning") else ""),
             "\nmeasured per stage (measure window only):\n" + table(metrics_rows(stages))]
    verdicts = verdict_rows(stages)
    judged = [v for v in verdicts if v["verdict"] not in ("no_baseline", "invalid")]
    if judged:
        lines.append("\nverdicts against earlier runs of the same stage and fingerprint:\n"
                     + table(verdicts))
    else:
        lines.append("\nno baseline yet: no earlier valid run of these stages on this "
                     "fingerprint, so nothing was compared (the next run compares against "
                     "this one)")
    for label, path in files.items():
        lines.append(f"{label}: {path if path.exists() else '(not written: the run failed before it)'}")
    return "\n".join(lines)

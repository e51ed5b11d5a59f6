"""What a person reads after a run: measured metrics, verdicts and where the files are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sql import Store

from .alert import MESSAGE_FILE
from .report import REPORT_FILE
from .tables import metrics_rows, table, verdict_rows


def print_run(store: Store, run_id: str, say: Callable[[str], None] = print) -> None:
    run = store.run(run_id)
    stages = sorted(store.stages(run_id), key=lambda s: s["params"].get("index", 0))
    say(f"\nrun id: {run_id}  ({run['kind']}, suite {run['suite']}, {run['broker_kind']} "
        f"{run.get('broker_version')}): {run['status']}")
    say("\nmeasured per stage (measure window only):\n" + table(metrics_rows(stages)))
    verdicts = verdict_rows(stages)
    judged = [v for v in verdicts if v["verdict"] not in ("no_baseline", "invalid")]
    if judged:
        say("\nverdicts against earlier runs of the same stage and fingerprint:\n" + table(verdicts))
    else:
        say("\nno baseline yet: no earlier valid run of these stages on this fingerprint, "
            "so nothing was compared (the next run compares against this one)")
    run_dir = Path(run["artifact_dir"])
    for label, name in (("report", REPORT_FILE), ("slack message", MESSAGE_FILE)):
        path = run_dir / name
        say(f"{label}: {path if path.exists() else '(not written: the run failed before it)'}")

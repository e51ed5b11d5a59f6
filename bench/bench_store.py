"""How the compare step's store reads grow with the history: `Store.previous_verdicts` and
`Store.history` for 40 stages with 11 judged metrics each, at 30 and at 365 nights of
stored verdicts, on SQLite (one run; the ratio of the two is what to read: a read that
grows with the whole history costs every night more, for ever).

    .state/venv/bin/python bench/bench_store.py [--stages 40] [--nights 30 365]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import insert  # noqa: E402

from sql import Store  # noqa: E402
from sql.models import Comparison, Metric, Run, Stage  # noqa: E402
from tasks.analysis.policy import Policy, judged_metrics  # noqa: E402

T0 = datetime(2025, 1, 1, 2, 0, tzinfo=timezone.utc)
SETUP = {"qos": 1}
DETAIL = {"baseline": "rolling", "history": 30, "nights": 0, "noise_pct": 0.9, "hold": False}


def filled(path: Path, nights: int, stages: int) -> Store:
    """A store with `nights` ok nightly runs of `stages` stages, every judged metric
    recorded and judged unchanged, and tonight's run started after them."""
    store = Store(f"sqlite:///{path}")
    store.migrate()
    metrics = judged_metrics(Policy())
    runs, rows, values, verdicts = [], [], [], []
    for night in range(nights):
        run_id = f"n{night:04d}"
        runs.append({"run_id": run_id, "kind": "nightly", "suite": "s", "broker_kind": "mosquitto",
                     "artifact_dir": "/x", "status": "ok", "excluded": False,
                     "started_at": T0 + timedelta(days=night)})
        for k in range(stages):
            rows.append({"run_id": run_id, "stage_id": f"st{k}", "scenario": "f",
                         "stage_key": f"mosquitto|st{k}", "params": SETUP, "validity": "valid",
                         "fingerprint_hash": "fp1"})
            for m in metrics:
                values.append({"run_id": run_id, "stage_id": f"st{k}", "name": m, "value": 100.0,
                               "unit": "x"})
                verdicts.append({"run_id": run_id, "stage_id": f"st{k}", "metric": m,
                                 "verdict": "unchanged", "baseline_value": 100.0, "value": 100.0,
                                 "change_pct": 0.0, "confidence": None, "detail": DETAIL})
    with store._tx() as s:
        for model, batch in ((Run, runs), (Stage, rows), (Metric, values), (Comparison, verdicts)):
            s.execute(insert(model), batch)
    store.create_run("tonight", kind="nightly", suite="s", broker_kind="mosquitto",
                     artifact_dir="/x", started_at=T0 + timedelta(days=nights))
    return store


def timed(store: Store, stages: int) -> tuple[float, float]:
    """Seconds for every stage's previous verdicts, then for every stage's history, as
    the compare step reads them (`Policy.history_nights` nights of tonight's setup)."""
    started = time.perf_counter()
    for k in range(stages):
        store.previous_verdicts(f"mosquitto|st{k}", "fp1", before_run="tonight", setup=SETUP)
    middle = time.perf_counter()
    for k in range(stages):
        store.history(f"mosquitto|st{k}", "fp1", before_run="tonight",
                      limit=Policy().history_nights, setup=SETUP)
    return middle - started, time.perf_counter() - middle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=40)
    ap.add_argument("--nights", type=int, nargs=2, default=(30, 365))
    args = ap.parse_args()
    found = {}
    with tempfile.TemporaryDirectory() as folder:
        for nights in args.nights:
            store = filled(Path(folder) / f"{nights}.db", nights, args.stages)
            found[nights] = timed(store, args.stages)
            store.close()
            print(f"{nights:5d} nights: previous_verdicts x{args.stages} {found[nights][0]:.2f} s, "
                  f"history x{args.stages} {found[nights][1]:.2f} s")
    short, long_ = args.nights
    print(f"ratio {long_} / {short} nights: previous_verdicts "
          f"{found[long_][0] / found[short][0]:.1f}x, history {found[long_][1] / found[short][1]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

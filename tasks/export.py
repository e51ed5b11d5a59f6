"""`perfpipe export RUN_ID --format bencher|otava --out PATH`: a stored run as files other
tools read (what each holds: `tasks/views/export.py`).

    bencher  PATH is a JSON file (BMF): `bencher run --adapter json --file PATH --testbed FP`
    otava    PATH is a folder: a CSV per stage key and fingerprint (and one per metric
             some of its runs lack), with the comparable earlier runs of that stage since
             its setup last changed, and otava.yaml:
             `otava analyze --config-file PATH/otava.yaml TEST`
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import yaml

from sql import Store

from .fingerprint import measured_alike
from .metrics import feeds_baselines
from .views import export as views

FORMATS = ("bencher", "otava")
OTAVA_CONFIG = "otava.yaml"


def export_run(store: Store, run_id: str, fmt: str, out: Path,
               say: Callable[[str], None] = print, *, force: bool = False) -> int:
    """Write run `run_id` in format `fmt` to `out`; say what was written and how to use it.
    A run that did not finish ok, or is excluded from baselines, is refused unless `force`:
    Bencher takes every upload as a night of its history and Otava analyses the series
    whole, so a failed night would be a change point there that perfpipe never judged."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "bencher" and out.is_dir():
        raise ValueError(f"--out {out}: a folder; bencher writes one JSON file: give its path")
    if fmt == "otava" and out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: a file; otava writes a folder of CSVs: give a folder")
    run = store.run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id!r}; recent: "
                         f"{[r['run_id'] for r in store.latest_runs(5)]}")
    if not force and not feeds_baselines(run["status"], run["excluded"]):
        state = run["status"] + (", excluded from baselines" if run["excluded"] else "")
        raise ValueError(f"run {run_id} is {state}: other tools would take it for a good "
                         f"night; export it anyway with --force")
    stages = store.stages(run_id)
    if not views.exported(stages):
        raise ValueError(f"run {run_id} has no valid stage to export")
    if fmt == "bencher":
        write_bencher(stages, out, say)
    else:
        write_otava(store, run, stages, out, say)
    return 0


def write_bencher(stages: list[dict], out: Path, say: Callable[[str], None]) -> None:
    document = views.bencher_bmf(stages)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    testbeds = sorted({s["fingerprint_hash"] for s in views.exported(stages)
                       if s["fingerprint_hash"]})
    say(f"wrote {out}: {len(document)} benchmarks, "
        f"{sum(len(m) for m in document.values())} metrics")
    say(f"upload: bencher run --adapter json --file {out} --testbed "
        f"{testbeds[0] if len(testbeds) == 1 else 'HOST'} --project PROJECT --branch main")


def write_otava(store: Store, run: dict, stages: list[dict], out: Path,
                say: Callable[[str], None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tests = {}
    for stage in views.exported(stages):
        metrics = views.otava_metrics(stage)
        if not metrics:
            continue
        key, fp = stage["stage_key"], stage["fingerprint_hash"]
        every = store.full_history(key, fp, before_run=run["run_id"])
        kept = [night for night in every if measured_alike(night["params"], stage["params"] or {})]
        other = len(every) - len(kept)  # earlier runs that measured another setup
        history = [*kept, {"run_id": run["run_id"], "started_at": run["started_at"],
                           "kind": run["kind"], "broker_version": run["broker_version"],
                           "metrics": stage["metrics"]}]
        for suffix, columns in views.otava_files(history, metrics):
            rows, left_out = views.otava_rows(history, columns)
            name = views.otava_name(key, fp) + suffix
            path = (out / f"{name}.csv").resolve()
            with path.open("w", newline="") as f:
                csv.writer(f).writerows(rows)
            tests[name] = views.otava_test(str(path), columns)
            say(f"{path.name}: {len(rows) - 1} runs, {len(columns)} metrics"
                + (f" ({left_out} runs without it)" if left_out else "")
                + (f" ({other} earlier runs left out: another setup)" if other else ""))
    config = out / OTAVA_CONFIG
    config.write_text(f"# perfpipe export {run['run_id']} --format otava: one csv test per "
                      "stage key and fingerprint, and per metric some of its runs lack\n"
                      + yaml.safe_dump({"tests": tests}, sort_keys=False))
    say(f"wrote {config} ({len(tests)} tests); analyse one with: otava analyze "
        f"--config-file {config} {next(iter(tests), 'TEST')}")

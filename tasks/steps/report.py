"""Step report: the run's HTML report, rendered from the results store
(`tasks.views.report` draws it) and written into the run folder. Teardown writes it again
once the run's status is final (`write_report`)."""

from __future__ import annotations

import json
from pathlib import Path

from sql import Store

from .. import rundir
from ..analysis.policy import Policy
from ..run_context import RunContext, folder_of
from ..settings import load_settings
from ..views.history import Histories
from ..views.report import render
from . import Call
from .compare import setup_history


def stored_hosts(store: Store, run_id: str, run_dir: Path | None) -> list[dict]:
    """The hosts as the store has them, with what provisioning wrote beside them (roles,
    clock offset) when the run folder still has it."""
    files = {}
    if run_dir is not None:
        files = {p.stem: json.loads(p.read_text())
                 for p in (run_dir / rundir.HOSTS_DIR).glob("*.json")}
    return [{**files.get(h["host"], {}), **h} for h in store.fingerprints(run_id)]


def stored_histories(store: Store, run_id: str, stages: list[dict],
                     nights: int = Policy().history_nights) -> Histories:
    """stage id -> its comparable earlier nights (same stage key, fingerprint and setup),
    oldest first, each with its metrics and verdicts, for the stages that were judged: the
    nights the compare step judged them on, so a change point it names is among them."""
    return {stage["stage_id"]: setup_history(store, run_id, stage, nights)[0][::-1]
            for stage in stages if stage.get("comparisons")}


def render_stored(store: Store, run_id: str, run_dir: Path | None = None) -> str:
    """The report of a stored run: everything comes from the results store."""
    run = store.run(run_id)
    if run is None:
        raise ValueError(f"unknown run {run_id!r} in {store.url_for_display} "
                         "(see `perfpipe show` for recent runs)")
    stages = store.stages(run_id)
    return render(run, stages, stored_hosts(store, run_id, run_dir), store.tuning(run_id),
                  stored_histories(store, run_id, stages))


def write_report(ctx: RunContext) -> str:
    """Render the run's report from the store into its run folder; returns its path."""
    path = ctx.run_dir / rundir.REPORT
    path.write_text(render_stored(ctx.store(), ctx.run_id, ctx.run_dir), encoding="utf-8")
    return str(path)


def run(ctx: RunContext, call: Call) -> str:
    return write_report(ctx)


def rerender(store: Store, run_id: str, out: Path | None = None) -> str:
    """`perfpipe report RUN_ID`: the report of a stored run, from the results store, written
    to `out` (default: the run folder's report.html); returns its path."""
    run_dir = folder_of(store.run(run_id), load_settings().run_dir(run_id))
    if out is not None and out.is_dir():
        raise ValueError(f"--out {out}: a folder; the report is one HTML file: give its path")
    path = out or run_dir / rundir.REPORT
    html = render_stored(store, run_id, run_dir if run_dir.exists() else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return str(path)

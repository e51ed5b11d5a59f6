"""Step collect: fetch every host's raw files into the run directory, with checksums.

Local hosts already wrote into the run directory; SSH hosts are fetched file by file.
`raw/MANIFEST.json` lists every file with its size and SHA-256, and every process that
should have reported but has no summary (the aggregation reports those as missing).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .. import rundir
from ..driver.output import (
    COUNTERS_FILE,
    EVENTS_FILE,
    HISTOGRAMS_FILE,
    SAMPLER_FILE,
    STAGE_FILE,
    SUMMARY_FILE,
)
from ..driver.sampler import SYS_FILE
from ..run_context import RunContext
from . import Call

DRIVER_FILES = (COUNTERS_FILE, HISTOGRAMS_FILE, EVENTS_FILE, SUMMARY_FILE, "driver.log")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch(ctx: RunContext, host_name: str, rel_dir: str, names: tuple[str, ...]) -> None:
    host = ctx.host(host_name)
    remote_root = ctx.remote_run_dir(host)
    if remote_root == str(ctx.run_dir):
        return
    for name in names:
        remote = f"{remote_root}/{rel_dir}/{name}"
        if host.exists(remote):
            host.get(remote, ctx.run_dir / rel_dir / name)


def run(ctx: RunContext, call: Call) -> dict:
    missing = []
    for stage_file in sorted((ctx.run_dir / rundir.RAW_DIR).glob(f"*/{STAGE_FILE}")):
        stage = json.loads(stage_file.read_text())
        for proc in stage["processes"]:
            rel = rundir.process_dir(stage["stage_id"], proc["host"], proc["proc"])
            _fetch(ctx, proc["host"], rel, DRIVER_FILES)
            if not (ctx.run_dir / rel / SUMMARY_FILE).exists():
                missing.append(rel)
        if stage.get("broker_host"):
            rel = rundir.sampler_dir(stage["stage_id"], stage["broker_host"])
            _fetch(ctx, stage["broker_host"], rel, (SAMPLER_FILE, SYS_FILE))
    files = {
        str(path.relative_to(ctx.run_dir)): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted((ctx.run_dir / rundir.RAW_DIR).rglob("*"))
        if path.is_file() and path != ctx.run_dir / rundir.MANIFEST
    }
    ctx.write_json(rundir.MANIFEST, {"files": files, "missing": missing})
    return {"files": len(files), "missing": missing}

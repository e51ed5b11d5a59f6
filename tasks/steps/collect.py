"""Step collect: fetch every host's raw files into the run directory, with checksums.

Local hosts already wrote into the run directory; each SSH host's part of raw/ comes over
in one compressed archive (one SFTP transfer, not one per file).
`raw/MANIFEST.json` lists every file with its size and SHA-256 (`tasks.manifest`: the
Spark job checks the files against it), and every process that should have reported but
has no summary (the aggregation reports those as missing).
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from pathlib import Path

from .. import rundir
from ..driver.output import STAGE_FILE, SUMMARY_FILE
from ..manifest import entry
from ..run_context import RunContext
from . import Call


def fetch_raw(ctx: RunContext, host_name: str) -> int:
    """Everything a host wrote under the run's raw/ (its processes' and sampler's folders),
    in one archive made in a private temporary file on the host; returns the files."""
    host = ctx.host(host_name)
    remote_root = ctx.remote_run_dir(host)
    if remote_root == str(ctx.run_dir) or not host.exists(f"{remote_root}/{rundir.RAW_DIR}"):
        return 0
    archive = host.run(["mktemp", "-t", "perfpipe-collect.XXXXXXXX"]).stdout.strip()
    try:
        host.run(["tar", "-C", remote_root, "-czf", archive, rundir.RAW_DIR])
        with tempfile.TemporaryDirectory(prefix="perfpipe-collect-") as local:
            host.get(archive, Path(local) / "raw.tgz")
            with tarfile.open(Path(local) / "raw.tgz") as tar:
                members = [m for m in tar.getmembers() if m.isfile()]
                tar.extractall(ctx.run_dir, members=members, filter="data")
    finally:
        host.run(["rm", "-f", archive], check=False)
    return len(members)


def run(ctx: RunContext, call: Call) -> dict:
    stages = [json.loads(path.read_text())
              for path in sorted((ctx.run_dir / rundir.RAW_DIR).glob(f"*/{STAGE_FILE}"))]
    hosts = {p["host"] for stage in stages for p in stage["processes"]}
    hosts |= {stage["broker_host"] for stage in stages if stage.get("broker_host")}
    for host_name in sorted(hosts):
        fetch_raw(ctx, host_name)
    expected = [rundir.process_dir(stage["stage_id"], proc["host"], proc["proc"])
                for stage in stages for proc in stage["processes"]]
    missing = [rel for rel in expected if not (ctx.run_dir / rel / SUMMARY_FILE).exists()]
    files = {
        str(path.relative_to(ctx.run_dir)): entry(path)
        for path in sorted((ctx.run_dir / rundir.RAW_DIR).rglob("*"))
        if path.is_file() and path != ctx.run_dir / rundir.MANIFEST
    }
    ctx.write_json(rundir.MANIFEST, {"files": files, "missing": missing})
    return {"files": len(files), "missing": missing}

"""Step tune (per host): apply or check the inventory's tuning profile, record it.

In `check` mode (the embedded default: somebody's workstation) values are only read back
and drift is recorded. In `apply` mode the values this host allows are set, read back and
recorded with what they were before; teardown restores them when the inventory asks to.
The values read back are hashed into the host fingerprint, so a tuning change starts a new
comparison history.
"""

from __future__ import annotations

import json

from .. import rundir
from ..fingerprint import tuning_hash
from ..hosts import Host
from ..run_context import RunContext
from ..tuning.profile import load_profile
from ..tuning.runner import restore, tune
from . import Call


def run(ctx: RunContext, call: Call) -> dict:
    """Apply or check the profile on one host; returns a small summary (XCom-safe)."""
    host_name = call.host
    inventory = ctx.inventory
    if not inventory.tuning_profile:
        return {"host": host_name, "profile": None}
    profile = load_profile(ctx.settings.tuning_dir, inventory.tuning_profile)
    host = ctx.host(host_name)
    try:
        entries = [e.to_dict() for e in tune(
            host, profile, mode=inventory.tuning_mode,
            allow=inventory.host(host_name).tuning_allow, state_dir=ctx.settings.state_dir)]
    finally:
        host.close()
    snapshot = {"host": host_name, "profile": profile.name, "mode": inventory.tuning_mode,
                "entries": entries, "values_hash": tuning_hash(entries)}
    ctx.write_json(rundir.tuning_file(host_name), snapshot)
    ctx.store().record_tuning(ctx.run_id, host_name, profile.name, entries)
    return {"host": host_name, "profile": profile.name, "mode": inventory.tuning_mode,
            "drift": sum(not e["ok"] for e in entries),
            "applied": sum(e["action"] == "applied" for e in entries)}


def restore_run_tuning(ctx: RunContext) -> dict[str, int]:
    """At teardown: undo what this run's tune step applied, where the inventory asks to."""
    inventory = ctx.inventory
    if inventory.tuning_mode != "apply" or not inventory.tuning_restore:
        return {}
    restored = {}
    for path in sorted((ctx.run_dir / rundir.TUNING_DIR).glob("*.json")):
        name = json.loads(path.read_text())["host"]
        host: Host = ctx.host(name)
        try:
            restored[name] = len(restore(host, state_dir=ctx.settings.state_dir))
        finally:
            host.close()
    return restored

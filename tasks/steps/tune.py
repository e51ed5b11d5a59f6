"""Step tune (per host): apply or check the inventory's tuning profile, record it.

In `check` mode (the embedded default: somebody's workstation) values are only read back
and drift is recorded. In `apply` mode the values this host allows are set, read back and
recorded with what they were before; teardown restores them when the inventory asks to.
The values read back are hashed into the host fingerprint, so a tuning change starts a new
comparison history.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sql import StoreError

from .. import rundir
from ..fingerprint import tuning_hash
from ..hosts import Host
from ..run_context import RunContext
from ..tuning.profile import load_profile
from ..tuning.runner import HeldByOthers, restore, run_on_hosts, snapshot_path, tune
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
            allow=inventory.host(host_name).tuning_allow, state_dir=ctx.settings.state_dir,
            by=f"run {ctx.run_id}, step tune", holder=ctx.run_id,
            broker_host="broker" in inventory.host(host_name).roles)]
    finally:
        host.close()
    snapshot = {"host": host_name, "profile": profile.name, "mode": inventory.tuning_mode,
                "entries": entries, "values_hash": tuning_hash(entries)}
    ctx.write_json(rundir.tuning_file(host_name), snapshot)
    ctx.store().record_tuning(ctx.run_id, host_name, profile.name, entries)
    return {"host": host_name, "profile": profile.name, "mode": inventory.tuning_mode,
            "drift": sum(not e["ok"] for e in entries),
            "applied": sum(e["action"] == "applied" for e in entries)}


def restore_run_tuning(ctx: RunContext, problems: list[str],
                       say: Callable[[str], None] = print) -> dict[str, int]:
    """At teardown: undo what perfpipe applied on the inventory's hosts, where it asks to:
    every host with an undo record (`tasks.tuning.runner.snapshot_path`, written before
    each change), so a tune step that failed partway is undone too; but not while another
    run still open holds the record (an Airflow run of the other DAG between its tune and
    its teardown: it measures with the tuning applied, and puts it back itself). A host
    that cannot be reached is said in `problems`, naming it, and the others are still
    restored; returns host -> values restored."""
    inventory = ctx.inventory
    if inventory.tuning_mode != "apply" or not inventory.tuning_restore:
        return {}
    paths = {h.name: snapshot_path(ctx.settings.state_dir, h.name) for h in inventory.hosts}
    recorded = [ctx.host(name) for name, path in paths.items() if path.exists()]
    still_open = _open_holders(ctx, [paths[h.name] for h in recorded], say)
    left: dict[str, str] = {}

    def put_back(host: Host) -> list:
        try:
            return restore(host, state_dir=ctx.settings.state_dir,
                           by=f"run {ctx.run_id}, teardown", holder=ctx.run_id,
                           is_open=still_open.__contains__)
        except HeldByOthers as held:
            left[host.name] = str(held)
            return []

    restored = {}
    for result in run_on_hosts(recorded, put_back):
        if result.host in left:
            say(f"teardown: tuning on {result.host} {left[result.host]}")
        elif result.error is None:
            restored[result.host] = sum(e.ok for e in result.entries)
            problems.extend(f"tuning not put back on {result.host}: {e.kind} {e.key} reads "
                            f"{e.after!r}, not {e.wanted!r} (its record is kept for "
                            "`perfpipe tune --restore`)" for e in result.entries if not e.ok)
        else:
            problems.append(f"tuning not restored on {result.host} (its record is kept for "
                            f"`perfpipe tune --restore`): {result.error}")
    return restored


# A run still open this long after it started is taken for one that will never close (a
# CLI run killed, a teardown that never ran): it holds no host's tuning any more
HOLD_AT_MOST = timedelta(hours=24)


def _open_holders(ctx: RunContext, records: list[Path], say: Callable[[str], None]
                  ) -> set[str]:
    """The runs other than this one that the host records name as holding them and that
    are still open, started less than `HOLD_AT_MOST` ago (`tasks.tuning.runner.restore`);
    none when the store cannot say (the hosts are put back: their owners' state first)."""
    named = set()
    for path in records:
        try:
            named.update(json.loads(path.read_text()).get("held_by", []))
        except (OSError, ValueError, AttributeError):
            continue  # restore itself says what is wrong with a record
    named.discard(ctx.run_id)
    if not named:
        return set()
    try:
        runs = {run: ctx.store().run(run) for run in sorted(named)}
    except StoreError as exc:
        say(f"teardown: whether run(s) {', '.join(sorted(named))} still use the hosts' tuning "
            f"is unknown ({exc}): put back all the same")
        return set()
    open_runs = {r: found for r, found in runs.items() if found and found["status"] == "running"}
    since = datetime.now(timezone.utc) - HOLD_AT_MOST  # the store's times are aware, UTC
    stale = sorted(r for r, found in open_runs.items() if found["started_at"] < since)
    if stale:
        say(f"teardown: run(s) {', '.join(stale)} still open after {HOLD_AT_MOST} hold no "
            "host's tuning (close them: perfpipe step teardown RUN)")
    return set(open_runs) - set(stale)

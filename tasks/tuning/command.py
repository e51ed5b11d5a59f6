"""`perfpipe tune`: a per-host table of key, wanted, before, after, ok; a line per value's
note (how it was read back, the commands to run for one perfpipe cannot set); one line per
failed host."""

from __future__ import annotations

import sys
from pathlib import Path

from ..catalog.inventory import connect, load_inventory
from ..settings import Settings
from ..views.tables import table
from .profile import load_profile
from .runner import restore, run_on_hosts, tune


def tune_command(settings: Settings, *, inventory: Path, profile: str | None, mode: str,
                 hosts: list[str] | None = None) -> int:
    """Returns 0 when every host answered (drift is reported, not an error), 1 otherwise."""
    inv = load_inventory(inventory)
    names = hosts or [h.name for h in inv.hosts]
    unknown = sorted(set(names) - {h.name for h in inv.hosts})
    if unknown:
        raise ValueError(f"--host: {unknown} not in {inventory}")
    targets = [connect(inv, name, work_root=str(settings.state_dir)) for name in names]
    if mode == "restore":
        results = run_on_hosts(targets, lambda host: restore(
            host, state_dir=settings.state_dir, by="perfpipe tune --restore"))
    else:
        name = profile or inv.tuning_profile
        if not name:
            raise ValueError(f"--profile: {inventory} names no tuning_profile; pass one")
        chosen = load_profile(settings.tuning_dir, name)
        results = run_on_hosts(targets, lambda host: tune(
            host, chosen, mode=mode, allow=inv.host(host.name).tuning_allow,
            state_dir=settings.state_dir, by=f"perfpipe tune --{mode}",
            broker_host="broker" in inv.host(host.name).roles))
    rows = [{"host": r.host, "kind": e.kind, "key": e.key, "wanted": e.wanted,
             "before": e.before, "after": e.after, "ok": "yes" if e.ok else "NO",
             "action": e.action} for r in results for e in r.entries]
    print(table(rows))
    for r in results:  # what a value's row cannot hold: how it was read, what to run
        for e in r.entries:
            if e.note:
                print(f"{r.host} {e.kind} {e.key}: {e.note}")
    for r in results:
        if r.error:
            print(f"{r.host}: ERROR {r.error}", file=sys.stderr)
    drift = sum(1 for row in rows if row["ok"] == "NO")
    print(f"{mode}: {len(results)} hosts, {len(rows)} values, {drift} not as wanted, "
          f"{sum(1 for r in results if r.error)} hosts failed")
    # a restore that did not put a value back failed; a check's drift is its answer
    return 1 if any(r.error for r in results) or (mode == "restore" and drift) else 0

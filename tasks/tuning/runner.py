"""Check, apply or restore a tuning profile on many hosts at once, with per-host results.

What perfpipe changed on a host is recorded in ``<state>/tuning/<host>.json`` before it is
changed, so ``restore`` puts back exactly what was there, whichever run applied it.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..hosts import Host, HostError, HostUnreachable
from . import kinds
from .profile import TuningProfile

MODES = ("check", "apply", "restore")


@dataclass
class HostResult:
    host: str
    entries: list[kinds.Entry] = field(default_factory=list)
    error: str | None = None


def snapshot_path(state_dir: Path, host: str) -> Path:
    return Path(state_dir) / "tuning" / f"{host}.json"


class RecordError(ValueError):
    """A host's undo record that cannot be read: nothing is changed on that host."""


def _load_undo(path: Path, profile: str | None = None) -> kinds.Undo:
    """The host's undo record; with `profile`, saved on every new record (`_save_undo`)."""
    records = _read_records(path) if path.exists() else []
    if profile is None:
        return kinds.Undo(records)
    return kinds.Undo(records, persist=lambda grown: _save_undo(path, grown, profile))


def _read_records(path: Path) -> list[dict]:
    try:
        records = json.loads(path.read_text())["records"]
        if all(isinstance(r, dict) and {"kind", "key"} <= r.keys() for r in records):
            return records
        problem = "a record without its kind and key"
    except (ValueError, KeyError, TypeError) as exc:
        problem = f"not a tuning record ({type(exc).__name__}: {exc})"
    raise RecordError(f"{path}: {problem}; nothing was changed on its host: repair it from "
                      "the tuning table of the run that applied it, or move it away")


def _save_undo(path: Path, records: list[dict], profile: str) -> None:
    """Replace the record atomically and durably: a temporary file, fsync, rename, fsync
    of the folder. A reader sees the old record or the new one, never a torn one, and a
    crash of the machine after the change keeps the before-value that guards it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        json.dump({"profile": profile, "records": records}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def tune(host: Host, profile: TuningProfile, *, mode: str, allow: list[str],
         state_dir: Path) -> list[kinds.Entry]:
    """Check or apply one profile on one host; each before-value is saved to the undo
    record before the change it guards (`kinds.Undo`)."""
    apply = mode == "apply"
    undo = _load_undo(snapshot_path(state_dir, host.name), profile.name)
    entries = kinds.apply_sysctl(host, profile.sysctl, allow, undo, profile.name, apply)
    if profile.limits:
        entries += kinds.apply_limits(host, profile.limits, undo, profile.name, apply)
    if profile.tasks_max:
        entries += kinds.apply_tasks_max(host, profile.tasks_max, undo, profile.name, apply)
    if profile.qm_ini:
        entries += kinds.apply_qm_ini(host, profile.qm_ini, undo, apply)
    if profile.jvm_heap:
        entries += kinds.apply_jvm_heap(host, profile.jvm_heap, undo, apply)
    return entries


def restore(host: Host, *, state_dir: Path) -> list[kinds.Entry]:
    """Undo everything recorded for this host, newest first, then forget what was put
    back: a record whose read-back differs, whose command failed or whose kind this
    perfpipe does not know stays, so a second restore tries it again, and the records
    after it are still tried. A host that stops answering stops the restore, every record
    not yet put back kept."""
    path = snapshot_path(state_dir, host.name)
    undo = _load_undo(path)
    entries, left = [], []
    for record in reversed(undo.records):
        try:
            entry = _restore_one(host, record)
        except HostUnreachable:
            _keep(path, [*undo.records[:undo.records.index(record) + 1], *left])
            raise
        except HostError as exc:
            entry = kinds.Entry(record["kind"], record["key"], "(restored)", None,
                                f"(failed: {exc})", "restored")
        entries.append(entry)
        if not entry.ok:
            left.insert(0, record)
    _keep(path, left)
    return entries


def _restore_one(host: Host, record: dict) -> kinds.Entry:
    """Put one record back and read it back."""
    kind, key = record["kind"], record["key"]
    if kind == "sysctl" and record["before"] is not None:
        host.as_root(["sysctl", "-q", "-w", f"{key}={record['before']}"])
        return kinds.Entry(kind, key, record["before"], None, kinds.read_sysctl(host, key),
                           "restored")
    if kind == "sysctl":  # a key that was not there was never set: nothing to put back
        return kinds.Entry(kind, key, "(absent)", None, "(absent)", "restored")
    if kind == "file":
        kinds.restore_file(host, key, record["content"], record.get("made"))
        now = host.read_root_file(key)
        after = ("(removed)" if now is None else "(restored)" if now == record["content"]
                 else "(differs from the record)")
        wanted = "(removed)" if record["content"] is None else "(restored)"
        return kinds.Entry(kind, key, wanted, None, after, "restored")
    if kind == "tasks_max":
        kinds.restore_tasks_max(host, record)
        return kinds.Entry(kind, key, kinds.tasks_max_restored(record), None,
                           kinds.read_tasks_max(host, record["mode"], key), "restored")
    return kinds.Entry(kind, key, "(restored)", None, None, "restored",
                       "a record of a kind this perfpipe cannot restore: kept")


def _keep(path: Path, records: list[dict]) -> None:
    """Leave `records` in the host's undo record (none: remove it)."""
    if records:
        _save_undo(path, records, json.loads(path.read_text()).get("profile", ""))
    else:
        path.unlink(missing_ok=True)


def run_on_hosts(hosts: list[Host], action, max_workers: int = 16) -> list[HostResult]:
    """Run `action(host)` on every host in parallel; one host's failure never hides another's."""
    def one(host: Host) -> HostResult:
        try:
            return HostResult(host.name, action(host))
        except (HostError, RecordError) as exc:
            return HostResult(host.name, error=str(exc))
        finally:
            host.close()

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(hosts)))) as pool:
        return list(pool.map(one, hosts))

"""Check, apply or restore a tuning profile on many hosts at once, with per-host results.

What perfpipe changed on a host is recorded in ``<state>/tuning/<host>.json`` before it is
changed, so ``restore`` puts back exactly what was there, whichever run applied it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ..hosts import Host, HostError, HostUnreachable
from ..locks import LockBusy, held
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


def _load_undo(path: Path, where: str, profile: str | None = None,
               held_by: list[str] = ()) -> kinds.Undo:
    """The undo record of the host at `where` (`Host.where`); with `profile`, saved on
    every new record (`_save_undo`), with the runs that hold it (`held_by`)."""
    records = _read_record(path, where).get("records", [])
    if profile is None:
        return kinds.Undo(records)
    return kinds.Undo(records, persist=lambda grown: _save_undo(path, grown, profile, where,
                                                                held_by))


def _read_record(path: Path, where: str) -> dict:
    """The host's record file ({} when there is none), or a RecordError when it cannot be
    read or was written for another machine of the same name (another inventory's)."""
    if not path.exists():
        return {}
    fix = "repair it from the tuning table of the run that applied it, or move it away"
    try:
        document = json.loads(path.read_text())
        records = document["records"]
        problem = None if all(isinstance(r, dict) and {"kind", "key"} <= r.keys()
                              for r in records) else "a record without its kind and key"
    except (ValueError, KeyError, TypeError, OSError) as exc:
        problem = f"not a tuning record ({type(exc).__name__}: {exc})"
    if problem is None and document.get("host", where) != where:  # none: written before 12-04
        problem = f"written for {document['host']}, and this host is {where}"
        fix = "restore it with the inventory that applied it, or move it away"
    if problem is None:
        return document
    raise RecordError(f"{path}: {problem}; nothing was changed on this host: {fix}")


def _save_undo(path: Path, records: list[dict], profile: str, where: str,
               held_by: list[str] = ()) -> None:
    """Replace the record atomically and durably: a temporary file of its own, fsync,
    rename, fsync of the folder. A reader sees the old record or the new one, never a torn
    one, and a crash of the machine after the change keeps the before-value that guards
    it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.",
                                     suffix=".tmp", delete=False) as handle:
        json.dump({"profile": profile, "host": where, "records": records,
                   **({"held_by": sorted(set(held_by))} if held_by else {})}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


# how long a tune or restore of a host waits for another one of the same host to finish
RECORD_WAIT_S = 600.0


def _one_at_a_time(state_dir: Path, host: Host, by: str) -> AbstractContextManager[None]:
    """One apply or restore of a host's record at a time, whichever process asks (a
    nightly's tune step, `perfpipe tune --restore` typed beside it): each loads the record,
    changes the host and saves the record whole, so two at once would lose records. `by`:
    who holds it, as the one who waits is told."""
    record = snapshot_path(state_dir, host.name)
    return held(record.with_name(f"{record.name}.lock"), {"tuning": host.name, "by": by},
                wait_s=RECORD_WAIT_S, what=f"the tuning record of {host.name}")


def tune(host: Host, profile: TuningProfile, *, mode: str, allow: list[str],
         state_dir: Path, by: str = "perfpipe tune", holder: str | None = None,
         broker_host: bool = True) -> list[kinds.Entry]:
    """Check or apply one profile on one host; each before-value is saved to the undo
    record before the change it guards (`kinds.Undo`). A check reads no record. `holder`:
    the run that measures with the tuning applied, which the record then names among the
    runs that hold it (`restore`); an apply of a host tuned already names it too. A host
    that is not the broker's (`broker_host` False) gets the host's own kinds only: the
    broker's qm.ini and JVM heap are not on it."""
    profile = profile if broker_host else profile.model_copy(update=BROKER_ONLY)
    if mode != "apply":
        return _tune(host, profile, kinds.Undo(), allow, apply=False)
    with _one_at_a_time(state_dir, host, by):
        path = snapshot_path(state_dir, host.name)
        held_by = [*_read_record(path, host.where).get("held_by", []), *filter(None, [holder])]
        undo = _load_undo(path, host.where, profile.name, held_by)
        entries = _tune(host, profile, undo, allow, apply=True)
        if holder and undo.records:  # named even when this apply recorded nothing new
            _save_undo(path, undo.records, profile.name, host.where, held_by)
        return entries


BROKER_ONLY = {"qm_ini": None, "jvm_heap": None}  # a profile's kinds of the broker's own


def _tune(host: Host, profile: TuningProfile, undo: kinds.Undo, allow: list[str], *,
          apply: bool) -> list[kinds.Entry]:
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


class HeldByOthers(Exception):
    """A run's teardown left a host's tuning applied: other runs still open hold it."""

    def __init__(self, runs: list[str]) -> None:
        super().__init__(f"left applied for run(s) {', '.join(runs)}, still open, which "
                         "put it back at their own teardown")
        self.runs = runs


def restore(host: Host, *, state_dir: Path, by: str = "perfpipe tune",
            holder: str | None = None, is_open: Callable[[str], bool] = lambda _run: False
            ) -> list[kinds.Entry]:
    """Undo everything recorded for this host, newest first, then forget what was put
    back: a record whose read-back differs, whose command failed, that lacks what it needs
    or whose kind this perfpipe does not know stays, so a second restore tries it again,
    and the records after it are still tried. A host that stops answering stops the
    restore, every record not yet put back kept.

    Given `holder` (a run's teardown), the record drops that run from the runs that hold
    it; while another of them `is_open`, nothing is put back (`HeldByOthers`): that run
    measures with the tuning applied, and its own teardown restores it. `perfpipe tune
    --restore` (no holder) puts everything back."""
    with _one_at_a_time(state_dir, host, by):
        path = snapshot_path(state_dir, host.name)
        document = _read_record(path, host.where)
        others = [run for run in document.get("held_by", []) if run != holder and is_open(run)]
        if holder is not None and others:
            _save_undo(path, document["records"], document.get("profile", ""), host.where,
                       others)
            raise HeldByOthers(others)
        undo = _load_undo(path, host.where)
        entries, left = [], []
        for record in reversed(undo.records):
            try:
                entry = _restore_one(host, record)
            except HostUnreachable:
                _keep(path, [*undo.records[:undo.records.index(record) + 1], *left],
                      host.where)
                raise
            except HostError as exc:
                entry = _not_put_back(record, f"(failed: {exc})")
            except (KeyError, TypeError, ValueError) as exc:  # written by hand, or torn
                entry = _not_put_back(record, f"(record incomplete: {type(exc).__name__} "
                                              f"{exc})")
            entries.append(entry)
            if not entry.ok:
                left.insert(0, record)
        _keep(path, left, host.where)
        return entries


def _not_put_back(record: dict, why: str) -> kinds.Entry:
    return kinds.Entry(record["kind"], record["key"], "(restored)", None, why, "restored")


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


def _keep(path: Path, records: list[dict], where: str) -> None:
    """Leave `records` in the host's undo record (none: remove it)."""
    if records:
        _save_undo(path, records, json.loads(path.read_text()).get("profile", ""), where)
    else:
        path.unlink(missing_ok=True)


def run_on_hosts(hosts: list[Host], action, max_workers: int = 16) -> list[HostResult]:
    """Run `action(host)` on every host in parallel; one host's failure never hides another's."""
    def one(host: Host) -> HostResult:
        try:
            return HostResult(host.name, action(host))
        except (HostError, RecordError, LockBusy) as exc:
            return HostResult(host.name, error=str(exc))
        finally:
            host.close()

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(hosts)))) as pool:
        return list(pool.map(one, hosts))

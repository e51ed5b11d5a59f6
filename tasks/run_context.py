"""What every step needs to know about one run, rebuilt from the run directory.

Steps exchange only the run id (small enough for XCom); everything else lives in the run
directory (its layout is `tasks.rundir`) and in the store.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from sql import Store

from . import rundir
from .catalog.inventory import Inventory, connect
from .catalog.stages import Stage
from .hosts import Host
from .settings import Settings

MIN_FREE_BYTES = 1 << 20  # less room than this left for the run folder: the disk is full


def disk_full(path: Path) -> str | None:
    """Why the disk holding `path` cannot take a run's files any more, or None. What is
    free is what a user may write (root's reserve left out)."""
    free = shutil.disk_usage(path).free
    if free >= MIN_FREE_BYTES:
        return None
    return f"the disk of {path} is full ({free:,} bytes free)"


def folder_of(run: dict | None, default: Path) -> Path:
    """A stored run's folder: where it recorded it (`artifact_dir`, another state dir's,
    say), when that is on this machine; else `default`, this state dir's."""
    recorded = Path(run["artifact_dir"]) if run and run.get("artifact_dir") else None
    return recorded if recorded is not None and recorded.is_dir() else default


def replace_json(path: Path, document: dict) -> Path:
    """Write `document` to `path` whole or not at all (a temporary file, then a rename): a
    reader, or the next run, sees the old file or the new one, never one cut short."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(document, indent=1, sort_keys=True, default=str))
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: leave the file as it was, no stub
        raise
    tmp.replace(path)
    return path


@dataclass
class RunContext:
    settings: Settings
    run_id: str
    run_dir: Path
    plan: dict

    @classmethod
    def load(cls, settings: Settings, run_id: str) -> RunContext:
        run_dir = settings.run_dir(run_id)
        path = run_dir / rundir.PLAN
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: no run {run_id!r} was planned here; check the id against the run "
                f"folders in {settings.runs_dir} (PERFPIPE_STATE_DIR), or start "
                "one with `perfpipe run`")
        return cls(settings, run_id, run_dir, json.loads(path.read_text()))

    @property
    def inventory(self) -> Inventory:
        return Inventory.model_validate(self.plan["inventory"])

    @property
    def stages(self) -> list[Stage]:
        """The planned stages, in run order (a search template stands for its probes)."""
        return [Stage.from_dict(doc) for doc in self.plan["stages"]]

    def searches(self) -> dict:
        """{"probes": [stage docs], "outcomes": {template id: outcome}, "broker_cpus":
        {template id: the CPUs the broker was kept on through it, or None}} of this run so
        far (a run folder from before `broker_cpus` has none)."""
        path = self.run_dir / rundir.SEARCH
        return json.loads(path.read_text()) if path.exists() else {"probes": [], "outcomes": {}}

    @property
    def measured_stages(self) -> list[Stage]:
        """The stages that ran or run: planned ones, search templates replaced by their probes."""
        probes = [Stage.from_dict(doc) for doc in self.searches()["probes"]]
        return [s for s in self.stages if s.search is None] + probes

    def host(self, name: str) -> Host:
        """The host, over one connection reused until `close_hosts` (the end of the step
        for a DAG task or `perfpipe step`, of the run for `perfpipe run`)."""
        cache = self.__dict__.setdefault("_hosts", {})
        if name not in cache:
            cache[name] = connect(self.inventory, name, work_root=str(self.run_dir),
                                  keep_env=self.password_envs)
        return cache[name]

    def close_hosts(self) -> None:
        """Close the connections `host` opened. A process that runs several steps (the CLI,
        a DAG run in one process) otherwise keeps every SSH connection and its thread open
        until it exits; processes a step started on a host do not depend on them (they run
        in sessions of their own)."""
        for host in self.__dict__.pop("_hosts", {}).values():
            with contextlib.suppress(Exception):  # a host already gone has nothing to close
                host.close()

    @property
    def password_envs(self) -> tuple[str, ...]:
        """The variables the run's drivers read MQTT passwords from (`connection.password_env`)."""
        names = {(s.get("connection") or {}).get("password_env")
                 for s in self.plan.get("scenarios", [])}
        return tuple(sorted(n for n in names if n))

    def remote_run_dir(self, host: Host) -> str:
        """Where this run's files live on a host (the run directory itself for local hosts)."""
        if not host.work_root or host.work_root == str(self.run_dir):
            return str(self.run_dir)
        return f"{host.work_root}/{self.run_id}"

    def remote_dirs(self) -> list[tuple[Host, str]]:
        """(host, `remote_run_dir`) of every inventory host that keeps this run's files
        apart from its run directory (an SSH host)."""
        hosts = (self.host(h.name) for h in self.inventory.hosts)
        return [(host, folder) for host in hosts
                if (folder := self.remote_run_dir(host)) != str(self.run_dir)]

    def store(self) -> Store:
        return self.settings.store()

    def broker(self) -> dict:
        path = self.run_dir / rundir.BROKER
        if not path.exists():
            raise FileNotFoundError(f"{path}: the broker step has not run for {self.run_id!r}")
        return json.loads(path.read_text())

    def write_json(self, name: str, document: dict) -> Path:
        return replace_json(self.run_dir / name, document)

    def disk_full(self) -> str | None:
        return disk_full(self.run_dir)

    def mark_finished(self, step: str, host: str | None = None) -> None:
        """Record that a step (for one host, if per host) finished."""
        path = self.run_dir / rundir.step_mark(step, host)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def finished(self, step: str, host: str | None = None) -> bool:
        return (self.run_dir / rundir.step_mark(step, host)).exists()

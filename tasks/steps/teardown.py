"""Step teardown (always runs): stop leftover drivers and the broker, restore tuning, remove
the raw files collect brought over from the SSH hosts, and close the run with its status.

The status comes from the steps that finished (`tasks.steps.STEPS`, each marked in the run
folder when it finished): a run in which any step before teardown did not finish, for
every host where it runs per host, or in which a driver process or the broker died
mid-stage, or whose teardown could not stop or restore something, is `failed`; one whose
stages were all invalid is `invalid`. Neither ever feeds a baseline. A report the report
step wrote is written again with the final status.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from sql import StoreError

from .. import rundir
from ..hosts import HostError
from ..run_context import RunContext
from . import STEPS, Call
from .broker import stop_broker
from .load_metrics import stage_failures
from .report import write_report
from .tune import restore_run_tuning

T = TypeVar("T")


class TeardownIncomplete(RuntimeError):
    """Under Airflow: teardown closed the run but could not stop, restore or store
    something (each said). The task fails, so its failure alert tells the team (Airflow
    colours a DAG run by the tasks before its teardown: a run whose steps all passed stays
    green); `perfpipe` commands say it in their output and exit code."""


def stop_stage_processes(ctx: RunContext, problems: list[str] | None = None) -> int:
    """Stop every process group the run's stages launched (driver processes, the broker's
    sampler) still alive (its leader the process launched: a group id the kernel gave another process since, when teardown runs again
    days later, is left alone); a host that cannot be reached is noted in `problems`
    (once) and the others are still stopped."""
    stopped, unreachable = 0, set()
    for path in sorted((ctx.run_dir / rundir.PROCESSES_DIR).glob("*.json")):
        for proc in json.loads(path.read_text())["processes"]:
            if proc["host"] in unreachable:
                continue
            host = ctx.host(proc["host"])
            if "started" in proc and proc["started"] is None:
                continue  # gone already when it was recorded: no group of ours to stop
            try:
                if host.alive(proc["group_pid"], started=proc.get("started")):
                    host.kill_group(proc["group_pid"])
                    stopped += 1
            except HostError as exc:
                if problems is None:
                    raise
                unreachable.add(proc["host"])
                problems.append(f"drivers on {proc['host']} not stopped: {exc}")
    return stopped


def remove_collected(ctx: RunContext, say: Callable[[str], None]) -> list[str]:
    """Remove from each SSH host the run's raw files, which collect brought over with their
    checksums, and its discarded attempts (never read), so nightly runs do not fill the
    hosts' work_root; the broker's folder (its config and log) stays. Nothing is removed
    before collect finished (the hosts' files are then the only copy); a host that cannot
    be reached keeps them, said, without failing the run. Returns the hosts cleaned."""
    if not ctx.finished("collect"):
        return []
    cleaned = []
    for host, remote in ctx.remote_dirs():
        try:
            host.run(["rm", "-rf", "--", f"{remote}/{rundir.RAW_DIR}",
                      f"{remote}/{rundir.DISCARDED_DIR}"])
        except HostError as exc:
            say(f"teardown: the run's files on {host.name} not removed ({remote}): {exc}")
            continue
        cleaned.append(host.name)
    return cleaned


def unfinished_steps(ctx: RunContext) -> list[str]:
    """The steps before teardown that did not finish (`step@host` for per-host steps)."""
    hosts = [h.name for h in ctx.inventory.hosts]
    missing = []
    for step in STEPS:
        if step.always:
            continue
        for host in hosts if step.per_host else [None]:
            if not ctx.finished(step.name, host):
                missing.append(step.name + (f"@{host}" if host else ""))
    return missing


def final_status(ctx: RunContext) -> tuple[str, str | None]:
    """(status, why it is not ok)."""
    unfinished = unfinished_steps(ctx)
    if unfinished:
        return "failed", f"run failed: {', '.join(unfinished)} did not finish"
    failed = [f"{stage_id}: {line}" for stage_id, lines in stage_failures(ctx).items()
              for line in lines]
    if failed:
        return "failed", f"run failed: {'; '.join(failed)}"
    stages = ctx.store().stages(ctx.run_id)
    if not stages:
        return "failed", "run failed: no stage was recorded"
    if all(s["validity"] != "valid" for s in stages):
        return "invalid", "run invalid: no stage was valid"
    return "ok", None


def run(ctx: RunContext, call: Call) -> dict:
    """Each part runs whatever the one before it met (a host out of reach, a broker that
    will not stop); what a part could not do is said, and makes the run `failed`. Over a
    run already closed (an Airflow task cleared, `perfpipe step teardown` again) only what
    the run itself started is stopped: its status stands, and the hosts' tuning records,
    which a later run may hold by now, are left as they are."""
    problems: list[str] = []
    stopped = stop_stage_processes(ctx, problems)
    broker = _guarded(problems, "broker not stopped", lambda: stop_broker(ctx))
    closed = _closed(ctx)
    if closed is not None:
        for line in problems:
            call.say(f"teardown: {line}")
        call.say(f"teardown: run {ctx.run_id} was already closed ({closed['status']}): its "
                 "status stands and no tuning is restored (`perfpipe tune --restore` puts a "
                 "host back)")
        if call.airflow and problems:
            raise TeardownIncomplete(f"run {ctx.run_id} already closed {closed['status']}, "
                                     "teardown incomplete: " + "; ".join(problems))
        return {"status": closed["status"], "stored": True, "warning": closed.get("warning"),
                "processes_stopped": stopped, "broker": broker, "tuning_restored": {},
                "problems": problems, "already_closed": True}
    restored = _guarded(problems, "tuning not restored", lambda: restore_run_tuning(ctx, problems, call.say))
    unremoved: list[str] = []  # said, not a problem of the run: its files are collected
    cleaned = _guarded(unremoved, "the run's files on the hosts not removed",
                       lambda: remove_collected(ctx, call.say)) or []
    for line in problems + unremoved:
        call.say(f"teardown: {line}")
    warning = slack_warning(ctx)
    if warning:
        call.say(f"teardown: warning: {warning}")
    status, stored = _close(ctx, call, problems, warning)
    if stored and (ctx.run_dir / rundir.REPORT).exists():  # its header said "running"
        late: list[str] = []
        _guarded(late, "report not rewritten with the final status", lambda: write_report(ctx))
        for line in late:
            call.say(f"teardown: {line}")
    if call.airflow and (problems or not stored):  # its failure alert tells the team
        raise TeardownIncomplete(f"run {ctx.run_id} closed {status}, teardown incomplete: "
                                 + ("; ".join(problems) or "its status is not stored"))
    return {"status": status, "stored": stored, "warning": warning,
            "processes_stopped": stopped, "broker": broker, "tuning_restored": restored,
            "files_removed_on": cleaned, "problems": problems}


def _closed(ctx: RunContext) -> dict | None:
    """The run as stored when it is already closed; None while it runs, or when the store
    cannot say (then closing it says why it is not stored)."""
    try:
        run = ctx.store().run(ctx.run_id)
    except StoreError:
        return None
    return run if run is not None and run["status"] != "running" else None


def slack_warning(ctx: RunContext) -> str | None:
    """What the alert step could not tell Slack, from what it kept in the run folder: the
    run's results stay good, but nobody was told (its alerts wait for the next run)."""
    path = ctx.run_dir / rundir.SLACK_MESSAGE
    try:
        sent = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError) as exc:  # cut short (a full disk): teardown goes on
        return f"what was told to Slack is unknown: {path} unreadable ({exc})"
    if not sent.get("error"):
        return None
    return (f"Slack not told: {sent['error']}; {sent.get('kept', 0)} alert(s) kept for the "
            "next run")


def _close(ctx: RunContext, call: Call, problems: list[str],
           warning: str | None) -> tuple[str, bool]:
    """Decide and store the run's status: (status, stored). With the database out of
    reach the run is `failed` and not stored; teardown says how to store it later (run it
    again once the database is back: its other parts find nothing left to do)."""
    try:
        status, reason = final_status(ctx)
        full = ctx.disk_full()
        if full and status != "ok":  # the likely cause of what did not finish: say it
            reason = f"{reason}; {full}"
        if problems:
            status, reason = "failed", "; ".join(
                ([reason] if reason else ["run failed"]) + [f"teardown: {p}" for p in problems])
        ctx.store().finish_run(ctx.run_id, status, excluded=status != "ok", reason=reason,
                               warning=warning)
    except StoreError as exc:
        call.say(f"teardown: the run's status is not stored: {exc}; when the database is "
                 f"back: perfpipe step teardown {ctx.run_id}")
        return "failed", False
    return status, True


def _guarded(problems: list[str], what: str, part: Callable[[], T]) -> T | None:
    try:
        return part()
    except Exception as exc:  # noqa: BLE001 (any failure of a part is said; the rest still run)
        problems.append(f"{what}: {type(exc).__name__}: {exc}")
        return None

"""The whole run without Airflow: plan, then every step of `tasks.steps.STEPS` in order
(per-host steps once per host), and teardown whatever happened: a failed step, Ctrl-C, or
SIGTERM or SIGHUP (a CI job's timeout, `timeout`, a closed SSH session), which stop the
steps as Ctrl-C does. The run holds its lab from before its plan to its teardown, so
another run's steps never come between its own (its broker is up for it alone), and a run
that cannot get the lab leaves no run behind.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sql import StoreError

from . import rundir
from .catalog.inventory import load_inventory
from .config_files import ConfigError
from .manage import promote_release, show_run
from .metrics import RELEASE_LABEL_RULE, is_release_label
from .run_context import RunContext
from .settings import Settings
from .steps import STEPS, Call, execute, lab_lock
from .steps.plan import cli_option, plan_run


@dataclass
class RunOutcome:
    run_id: str
    status: str
    report: str | None
    message: str | None
    warning: str | None = None  # the run ended well but Slack was not told
    stored: bool = True  # False: the database was away at teardown (its status not stored)


def run_pipeline(settings: Settings, *, suite: str | None = None, inventory: Path | None = None,
                 kind: str = "manual", release_label: str | None = None,
                 options: dict | None = None, say: Callable[[str], None] = print) -> RunOutcome:
    """Every step once, as the DAGs run them; `release_label` and `options` as the
    release DAG's trigger gives them (`plan_run`), and with options["promote"] the run is
    pinned as its label's baseline when it ends ok (the release DAG's `promote` task)."""
    check_release_choices(kind, release_label, options or {})
    lab = load_inventory(Path(inventory or settings.inventory)).name
    with lab_lock(settings, lab, {"run": f"a {kind} run", "suite": suite or settings.suite},
                  say):
        run_id = plan_run(settings, suite=suite, inventory=inventory, kind=kind,
                          release_label=release_label, options=options)
        say(f"run id: {run_id}  (files: {settings.run_dir(run_id)})")
        ctx = RunContext.load(settings, run_id)
        results: dict[str, object] = {}
        try:
            with _stopped_as_by_ctrl_c(say) as shield:
                _run_steps(ctx, [h.name for h in ctx.inventory.hosts], results, say, shield)
        finally:
            ctx.close_hosts()
    closed = results["teardown"]
    if closed["stored"]:  # else teardown said why and how to store it later
        show_run(ctx.store(), run_id, say)
    if (options or {}).get("promote"):
        say(_promoted(settings, run_id, release_label or "", closed["stored"]))
    alert = results.get("alert") or {}
    return RunOutcome(run_id, closed["status"], results.get("report"), alert.get("message"),
                      closed["warning"], closed["stored"])


def check_release_choices(kind: str, release_label: str | None, options: dict) -> None:
    """A ConfigError before anything runs for a release run without its label, as the
    release DAG's Params require one, or a trigger choice only a release run can take
    (named as `perfpipe run` spells it). A baseline of another run's kind would judge it
    against a release while it still fed the rolling history, where a flagged value
    stayed held out under an alert filed against the release."""
    if kind == "release":
        if not release_label:  # the release DAG's Param requires one too
            raise ConfigError("--kind release: a release run is named by the release it "
                              "measures; add --release-label LABEL, e.g. 9.4.5")
        if not is_release_label(release_label):
            raise ConfigError(f"--release-label {release_label!r}: give a release such as "
                              f"9.4.5 ({RELEASE_LABEL_RULE})")
        return
    for name, given in (("release_label", release_label), ("baseline", options.get("baseline")),
                        ("promote", options.get("promote"))):
        if given:
            raise ConfigError(f"{cli_option(name)}: only a release run takes it; add --kind "
                              "release")


def _promoted(settings: Settings, run_id: str, label: str, stored: bool) -> str:
    """What pinning the run said; a run not stored, or a store that failed, is said with
    how to pin it later, never raised (the run's own outcome stands)."""
    later = f"pin it later: perfpipe baseline promote {run_id} --label {label}"
    if not stored:
        return f"not promoted: run {run_id} was not stored; once it is, {later}"
    try:
        return promote_release(run_id, label, settings=settings)
    except StoreError as exc:
        return f"not promoted: {exc}; {later}"


STOPPING = (signal.SIGTERM, signal.SIGHUP)  # stop a run as Ctrl-C does: teardown runs


class RunStopped(BaseException):
    """A signal stopped the run's steps. Not a KeyboardInterrupt: invoke (every host
    command's runner) takes one as meant for the command it runs, passes it on and goes on
    waiting, so a signal that came during a command was lost and the run went on."""


@contextmanager
def _stopped_as_by_ctrl_c(say: Callable[[str], None]) -> Iterator[Callable[[], None]]:
    """SIGTERM and SIGHUP raise RunStopped in the steps, once: Python's default
    for them ends the process at once, skipping teardown, and the broker, the drivers and
    the sampler (each in a session of its own) ran on, the tuning stayed and the run
    stayed `running`. Yields `shield`, which teardown calls first: from then on these and
    Ctrl-C are said, not obeyed (SIGKILL still ends it). Only the main thread can take
    signals: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def stop(signum: int, _frame: object) -> None:
        shield()
        raise RunStopped(f"stopped by {signal.Signals(signum).name}")

    def shield() -> None:
        """From here on (teardown) these are said, not obeyed: SIGKILL still ends it."""
        for sig in (*STOPPING, signal.SIGINT):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, lambda *_: say("already stopping: teardown runs first"))

    # a signal ignored already (`nohup` ignores SIGHUP) stays ignored
    before = {sig: signal.getsignal(sig) for sig in (*STOPPING, signal.SIGINT)}
    for sig in STOPPING:
        if before[sig] is not signal.SIG_IGN:
            signal.signal(sig, stop)
    try:
        yield shield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _run_steps(ctx: RunContext, hosts: list[str], results: dict[str, object],
               say: Callable[[str], None], shield: Callable[[], None] = lambda: None) -> None:
    try:
        for step in STEPS:
            if step.name == "plan" or step.always:
                continue
            for host in hosts if step.per_host else [None]:
                results[step.name] = result = execute(step.name, ctx, Call(host=host, say=say))
                # a step that returns a list said each item as it went: say how many
                said = f"{len(result)} done" if isinstance(result, list) else result
                say(f"{step.name}{' ' + host if host else ''}: {said}")
    except (Exception, KeyboardInterrupt, RunStopped) as exc:  # closed as failed below
        trace = ctx.run_dir / rundir.ERROR_LOG
        try:
            trace.write_text(traceback.format_exc())
            where = f"full trace: {trace}"
        except OSError as why:  # e.g. the disk is full
            where = f"full trace not written: {why}"
        say(f"FAILED: {type(exc).__name__}: {exc}\n({where})")
    finally:
        shield()  # a signal now would stop teardown halfway: the run left open
        for step in STEPS:
            if step.always:
                results[step.name] = execute(step.name, ctx, Call(say=say))
                say(f"{step.name}: {results[step.name]}")

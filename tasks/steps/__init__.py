"""The pipeline's steps, in order: the one list that the pipeline (`perfpipe run`), the CLI
(`perfpipe step`, its help), the DAG graph and the DAG test all read.

Each step is a module of this package named exactly as the step and its DAG task, whose
`run(ctx, call)` does the step for one run. A step that finished says so in the run folder
(`tasks.rundir.step_mark`); teardown decides the run's status from those marks. `plan`
creates the run, so it is called with the run's choices instead (`tasks.steps.plan`).

This module is plain data and the standard library: DAG files read it when they are
parsed, and a step's module is imported only when the step runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..run_context import RunContext
    from ..settings import Settings


@dataclass(frozen=True)
class Step:
    name: str  # the module, the DAG task id and the CLI's `perfpipe step NAME`
    doc: str  # one line: what it does
    per_host: bool = False  # runs once per inventory host (a mapped DAG task)
    retry: bool = False  # safe to retry with backoff; a measurement never is
    lab: bool = False  # loads the lab hosts or this machine: one such step at a time, for
    # every run on the inventory (the lab lock, `lab_lock`; under Airflow also its pool)
    always: bool = False  # runs whatever happened before it


# the Spark job's bound, from the CLI and under Airflow: a standalone master with no free
# worker would keep the lab lock, and every later run's lab steps, waiting for ever
AGGREGATE_TIMEOUT_S = 1800

STEPS: tuple[Step, ...] = (
    Step("plan", "validate suite + inventory, expand stages, create the run"),
    Step("provision", "check each host, ship the driver, record its fingerprint",
         per_host=True, retry=True, lab=True),
    Step("tune", "apply or check the tuning profile, read it back, record it",
         per_host=True, retry=True, lab=True),
    Step("broker", "start the broker under test (or check the running one)", lab=True),
    Step("stages", "every stage in plan order: drivers, barrier, common start, warm-up, "
         "measure window", lab=True),
    Step("collect", "fetch raw driver files with checksums", retry=True, lab=True),
    Step("aggregate", "spark-submit spark/aggregate.py over the raw files", lab=True),
    Step("load_metrics", "the Spark job's per-stage metrics and validity into SQL"),
    Step("compare", "verdicts per stage and metric against history"),
    Step("report", "write the HTML report"),
    Step("alert", "Slack: new regressions, thread replies for known ones, a release summary "
         "(written to the run folder without a token)", retry=True),
    Step("teardown", "stop drivers and broker, restore tuning, close the run with its status",
         lab=True, always=True),
)
BY_NAME: dict[str, Step] = {step.name: step for step in STEPS}


@dataclass(frozen=True)
class Call:
    """How a step is called: for which host (per-host steps), where its progress lines go,
    and whether from an Airflow task (then Slack comes from its Connection first)."""

    host: str | None = None
    say: Callable[[str], None] = print
    airflow: bool = False


class RunClosed(ValueError):
    """A step asked of a run that teardown already closed: its results stay as they are."""


def step(name: str) -> Step:
    if name not in BY_NAME:
        raise ValueError(f"unknown step {name!r}; steps: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def execute(name: str, ctx: RunContext, call: Call = Call()) -> Any:
    """Run one step of the run in `ctx`, then mark it finished (for `call.host`, per host)."""
    if step(name).name == "plan":
        raise ValueError("plan creates a run: use `perfpipe run` or tasks.steps.plan.plan_run")
    with as_step(name, ctx, call):
        return import_module(f"{__name__}.{name}").run(ctx, call)


@contextmanager
def as_step(name: str, ctx: RunContext, call: Call = Call()) -> Iterator[None]:
    """What every step runs inside, however it is run (`execute`, or the Spark provider's
    operator for `aggregate` under Airflow): its host checked, a closed run refused, the
    lab lock held for a step that loads the lab; marked finished when its body ends."""
    found = step(name)
    _check_host(found, ctx, call.host)
    if not found.always:
        _refuse_closed(ctx, found.name)
    holder = {"run": ctx.run_id, "step": found.name}
    with lab_lock(ctx.settings, ctx.inventory.name, holder, call.say) if found.lab \
            else nullcontext():
        yield
    ctx.mark_finished(found.name, call.host)


def _check_host(found: Step, ctx: RunContext, host: str | None) -> None:
    """A per-host step names one of the inventory's hosts; another step names none (it
    would be marked finished for that host only, and teardown would find it unfinished)."""
    if found.per_host and host not in (names := [h.name for h in ctx.inventory.hosts]):
        given = f"no host {host!r} in inventory {ctx.inventory.name!r}; " if host else ""
        raise ValueError(f"step {found.name!r} runs per host: {given}name one of {names} "
                         "(--host)")
    if not found.per_host and host:
        per_host = [s.name for s in STEPS if s.per_host]
        raise ValueError(f"step {found.name!r} runs once for the run, not per host: leave "
                         f"out --host {host} (it is for {', '.join(per_host)})")


def lab_lock(settings: Settings, inventory: str, holder: dict[str, str],
             say: Callable[[str], None]) -> AbstractContextManager[None]:
    """One step that loads the lab at a time, whichever run, CLI or Airflow, asks: two
    runs' windows never overlap and one's Spark job never runs inside another's window
    (`tasks.locks`; one lock per inventory name, in the state folder). A CLI run holds it
    from before its plan to its teardown; its steps, in the same thread, then pass."""
    from ..locks import held

    return held(settings.state_dir / "locks" / f"lab-{inventory}.lock", holder,
                wait_s=settings.lab_wait_s, say=say, what=f"the lab {inventory!r}")


def _refuse_closed(ctx: RunContext, name: str) -> None:
    """A closed run is never measured, loaded or judged again: a step re-run over it would
    overwrite the raw files and metrics its status and verdicts were decided on."""
    run = ctx.store().run(ctx.run_id)
    if run is not None and run["status"] != "running":
        raise RunClosed(f"run {ctx.run_id} is closed ({run['status']}): step {name} does not "
                        f"run over a finished run, whose files and results stay as they were; "
                        f"start a new run (perfpipe run)")


def context_of(run_id: str) -> RunContext:
    from ..run_context import RunContext
    from ..settings import load_settings

    return RunContext.load(load_settings(), run_id)


def run_step(name: str, run_id: str, call: Call = Call()) -> Any:
    """One step of an existing run, by its id: what a DAG task and `perfpipe step` call."""
    ctx = context_of(run_id)
    try:
        return execute(name, ctx, call)
    finally:
        ctx.close_hosts()

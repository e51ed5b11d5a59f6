"""perfpipe: the command line. Every command calls the same step functions as the DAGs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from sql import Store, StoreError, StoreUnavailable

from .config_files import ConfigError
from .export import FORMATS, export_run
from .locks import LockBusy
from .metrics import ALERT_ACTIONS, RUN_KINDS, exit_code
from .settings import load_settings
from .steps import STEPS


def epilog() -> str:
    width = max(len(step.name) for step in STEPS)
    lines = [f"  {step.name:<{width}}  {step.doc}"
             + (" (per host)" if step.per_host else "") + (" (always runs)" if step.always else "")
             for step in STEPS]
    return ("pipeline steps, in order (each but plan is also `perfpipe step NAME RUN_ID`):\n"
            + "\n".join(lines)
            + "\n\nexit codes: 0 done (a run, or `step teardown`: ended ok), 1 a run that did "
            "not end ok (tune: a "
            "host failed, or a restore left a value not put back; check-nightly: no recent "
            "nightly), 2 "
            "bad input, 3 the lab (or a host's tuning record) taken by another run, 4 the results "
            "database down or "
            "locked, 5 a run that ended ok but could not tell Slack"
            + "\n\nsettings come from PERFPIPE_* environment variables (see README).")


def _run(args: argparse.Namespace) -> int:
    from .pipeline import run_pipeline

    outcome = run_pipeline(load_settings(), suite=args.suite, inventory=args.inventory,
                           kind=args.kind, release_label=args.release_label,
                           options=run_options(args))
    return exit_code(outcome.status, outcome.warning, stored=outcome.stored)


def run_options(args: argparse.Namespace) -> dict:
    """The release DAG's trigger choices from `perfpipe run`'s options, as plan.json's
    options; `run_pipeline` refuses those that cannot apply."""
    from .steps.plan import release_choices

    return release_choices(args.baseline, args.promote, args.broker_version)


def _nightly(args: argparse.Namespace) -> int:
    from .nightly import run_nightly

    settings = load_settings()
    return run_nightly(settings, args.suite or settings.suite)


def _tune(args: argparse.Namespace) -> int:
    from .tuning.command import tune_command

    settings = load_settings()
    return tune_command(settings, inventory=args.inventory or settings.inventory,
                        profile=args.profile, mode=args.mode, hosts=args.host)


def _plan(args: argparse.Namespace) -> int:
    from .catalog.stages import stage_rows
    from .steps.plan import suite_stages
    from .views.tables import table

    settings = load_settings()
    print(table(stage_rows(suite_stages(settings, args.suite or settings.suite))))
    return 0


def _with_store(call: Callable[[Store, argparse.Namespace], int]
                ) -> Callable[[argparse.Namespace], int]:
    """A command that works on the results store: made if new, never migrated
    (`Store.open_for_commands`), closed after (a StoreError or a ValueError is said in one
    line by `main`)."""
    def run(args: argparse.Namespace) -> int:
        store = load_settings().store()
        try:
            store.open_for_commands()
            return call(store, args)
        finally:
            store.close()
    return run


_export = _with_store(lambda store, args: export_run(store, args.run_id, args.format, args.out,
                                                    force=args.force))


@_with_store
def _show(store: Store, args: argparse.Namespace) -> int:
    from .manage import show_run

    if store.run(args.run_id) is None:
        print(f"no run {args.run_id!r}; recent: {[r['run_id'] for r in store.latest_runs(5)]}",
              file=sys.stderr)
        return 2
    show_run(store, args.run_id)
    return 0


@_with_store
def _report(store: Store, args: argparse.Namespace) -> int:
    from .steps.report import rerender

    print(rerender(store, args.run_id, args.out))
    return 0


def _check_nightly(args: argparse.Namespace) -> int:
    from .notify.watchdog import check_nightly

    verdict = check_nightly()
    print(verdict["text"])
    if verdict.get("slack_error"):  # its alert is in the state dir only
        print(f"perfpipe: Slack not told: {verdict['slack_error']}", file=sys.stderr)
    return 1 if verdict["missing"] else 0


def _step(args: argparse.Namespace) -> int:
    from .steps import Call, run_step

    result = run_step(args.name, args.run_id, Call(host=args.host))
    print(result)
    if args.name != "teardown":
        return 0
    if result["stored"] and result.get("already_closed") and result["problems"]:
        return 1  # what it could not stop is said; the run's status stands
    # not stored (the database down): 4, and run it again once it is back
    return exit_code(result["status"], result["warning"], stored=result["stored"])


# Texts that several options share: one definition each.
SUITE_HELP = ("a suite of the scenarios dir's suites.yml (PERFPIPE_SCENARIOS_DIR, default "
              "scenarios/; default suite: PERFPIPE_SUITE, else smoke)")
INVENTORY_HELP = ("inventory YAML: hosts and broker (default: PERFPIPE_INVENTORY, else "
                  "infra/inventories/local.yml)")
RUN_ID_HELP = "a run id, as runs print it (e.g. nightly-d8eca9c3)"


def _command(sub: argparse._SubParsersAction, name: str, summary: str, description: str,
             func) -> argparse.ArgumentParser:
    """A subcommand: `summary` in `perfpipe --help`, `description` in its own --help."""
    command = sub.add_parser(name, help=summary, description=description)
    command.set_defaults(func=func)
    return command


def _baseline_and_alert_commands(sub: argparse._SubParsersAction) -> None:
    """`perfpipe baseline promote|list` and `perfpipe alerts list|ack|accept|false-positive|fixed`."""

    from . import manage

    handler = _with_store

    baseline = sub.add_parser(
        "baseline", help="pin a run as a release baseline, list them",
        description="Release baselines: a release run triggered with baseline=LABEL is "
        "compared with the run pinned as LABEL for its broker kind instead of the rolling "
        "history.")
    bsub = baseline.add_subparsers(dest="action", required=True, metavar="ACTION",
                                   help="promote or list")
    promote = _command(bsub, "promote", "pin an ok run as the release baseline LABEL",
                       "Pin a run that ended ok as the release baseline LABEL (a run that "
                       "did not end ok is refused).",
                       handler(lambda st, a: manage.promote(st, a.run_id, a.label)))
    promote.add_argument("run_id", help=RUN_ID_HELP)
    promote.add_argument("--label", required=True, help="release label, e.g. 9.4.5")
    _command(bsub, "list", "the pinned release baselines",
             "Print the pinned release baselines: label, run, when pinned.",
             handler(lambda st, a: manage.list_baselines(st)))
    alerts = sub.add_parser(
        "alerts", help="list alerts; ack, accept, call a false positive, fixed",
        description="Alerts: a suspected change opens one, and its confirmation as a "
        "regression is posted to Slack once; what a person decides about it changes what "
        "later nights do.")
    asub = alerts.add_subparsers(dest="action", required=True, metavar="ACTION",
                                 help=f"list, {', '.join(ALERT_ACTIONS)}")
    alist = _command(asub, "list", "open alerts", "Print the open alerts (with --all, the "
                     "closed ones too): id, status, stage, metric, change, runs, told Slack.",
                     handler(lambda st, a: manage.list_alerts(st, include_closed=a.all)))
    alist.add_argument("--all", action="store_true", help="closed alerts too")
    for action in ALERT_ACTIONS:
        effect = manage.EFFECT[ALERT_ACTIONS[action]].format(
            key="the stage", run="the alert's first run", metric="its metric")
        one = _command(asub, action, effect, f"Mark an alert {effect}.", handler(
            lambda st, a, action=action: manage.set_status(st, a.alert_id, action,
                                                            together=a.together)))
        one.add_argument("alert_id", type=int,
                         help="an alert id, as `perfpipe alerts list` shows it")
        one.add_argument("--together", action="store_true",
                         help="also the alerts the run's stages flagged together with it (one "
                         "change of the broker seen on every stage; without it they are "
                         "named, not changed)")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="perfpipe", description=__doc__, epilog=epilog(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND",
                              help="one of these (`perfpipe COMMAND --help` says more):")
    nightly = _command(
        sub, "nightly", "run the nightly DAG once through Airflow (dag.test)",
        "Run the DAG mqtt_perf_nightly once in this process through Airflow's dag.test() "
        "(what `make run` does). Prints a line per step as it ends, a summary and the Airflow "
        "run's state; Airflow's own log lines go to dag_test/mqtt_perf_nightly/<UTC "
        "time>.log in Airflow's log folder ($AIRFLOW_HOME/logs unless [logging] "
        "base_log_folder says otherwise).", _nightly)
    nightly.add_argument("--suite", help=SUITE_HELP)
    run = _command(sub, "run", "run the whole pipeline once, without Airflow",
                   "Run every step of the pipeline once in this process, without Airflow: "
                   "plan, then the steps listed below, teardown whatever happens (a failed "
                   "step, Ctrl-C, SIGTERM or SIGHUP: the run is closed failed, exit 1; 4 when "
                   "its status could not be stored).", _run)
    run.add_argument("--suite", help=SUITE_HELP)
    run.add_argument("--inventory", type=Path, help=INVENTORY_HELP)
    run.add_argument("--kind", default="manual", choices=RUN_KINDS,
                     help="what the run is stored as: a release run stays out of the rolling "
                     "history and always posts a Slack summary (default: manual)")
    run.add_argument("--release-label", metavar="LABEL",
                     help="required with --kind release: the release the run measures, e.g. 9.4.5")
    run.add_argument("--baseline", metavar="LABEL",
                     help="with --kind release: compare with 'rolling' history or a release "
                     "label pinned for this broker kind (refused at plan otherwise); default: "
                     "the release pinned most recently for this broker kind (rolling if none)")
    run.add_argument("--broker-version", metavar="VERSION",
                     help="the version the broker must report (default: not checked)")
    run.add_argument("--promote", action="store_true",
                     help="with --kind release: pin the run as its "
                     "label's baseline if it ends ok")
    tune = _command(sub, "tune", "check, apply or restore a tuning profile on the hosts",
                    "Host tuning (PERFPIPE_TUNING_DIR, default infra/tuning/): check a "
                    "profile's values on each host, "
                    "apply them (recording what they were), or restore what was applied. "
                    "Prints a table of each value wanted, before and after, and under it "
                    "each value's note: how it was read back, or the commands to run for "
                    "one perfpipe does not set (IBM MQ's MQXR heap).",
                    _tune)
    tune.add_argument("--inventory", type=Path, help=INVENTORY_HELP)
    tune.add_argument("--profile", help="a profile's name, NAME for <tuning dir>/NAME.yml "
                      "(default: the inventory's)")
    modes = tune.add_mutually_exclusive_group(required=True)
    for mode, text in (("check", "read each value back and report the drift; change nothing"),
                       ("apply", "set the profile's values, read them back, record what "
                        "they were in the state dir"),
                       ("restore", "put back what --apply recorded")):
        modes.add_argument(f"--{mode}", dest="mode", action="store_const", const=mode,
                           help=text)
    tune.add_argument("--host", action="append", help="only this host (repeatable)")
    plan = _command(sub, "plan", "print the stage table of a suite",
                    "Print every stage a run of the suite would have, in run order, with "
                    "its clients, rates, windows and expected message counts; runs nothing.",
                    _plan)
    plan.add_argument("--suite", help=SUITE_HELP)
    show = _command(sub, "show", "print a stored run's metrics and verdicts",
                    "Print a stored run's metrics per stage, every verdict and the paths of "
                    "its report and Slack message (an unknown id lists the recent ones).",
                    _show)
    show.add_argument("run_id", help=RUN_ID_HELP)
    report = _command(sub, "report", "re-render a stored run's HTML report from the store",
                      "Write a stored run's HTML report again from the results store, and "
                      "print its path.", _report)
    report.add_argument("run_id", help=RUN_ID_HELP)
    report.add_argument("--out", type=Path, help="file to write (default: the run folder's report.html)")
    export = _command(sub, "export", "write a stored run for other tools: Bencher, Apache Otava",
                      "Write a stored run's valid stages for other tools: Bencher's metric "
                      "format (BMF JSON), or a CSV per stage key and fingerprint with its "
                      "comparable history and an otava.yaml for Apache Otava.", _export)
    export.add_argument("run_id", help=RUN_ID_HELP)
    export.add_argument("--format", required=True, choices=FORMATS,
                        help="bencher: one BMF JSON file for `bencher run --adapter json`; "
                        "otava: a CSV per stage key and fingerprint (and per metric some "
                        "of its runs lack), and otava.yaml")
    export.add_argument("--out", type=Path, required=True,
                        help="bencher: the JSON file to write; otava: the folder to write into")
    export.add_argument("--force", action="store_true",
                        help="export a run that did not finish ok or is excluded from "
                        "baselines too (refused without it: Bencher and Otava would take "
                        "it for a good night)")
    _command(sub, "check-nightly", "exit 1 and alert when no nightly ran recently "
             "(PERFPIPE_NIGHTLY_MAX_AGE_H, default 26 h)",
             "What the watchdog DAG does: when no nightly run started within "
             "PERFPIPE_NIGHTLY_MAX_AGE_H hours (default 26), write the alert under the "
             "state dir's watchdog/, post it to Slack where PERFPIPE_SLACK_TOKEN is set (the "
             "DAG: or its Slack Connection), and exit 1; else exit 0.",
             _check_nightly)
    step = _command(sub, "step", "run one step of a run not yet closed by teardown "
                    "(see the list below)",
                    "Run one step of a run again, as its DAG task does; a run that "
                    "teardown closed is refused (its results stay as they were), but for "
                    "teardown itself.", _step)
    step.add_argument("name", help="the step: one of the steps listed by "
                      "`perfpipe --help`, but plan")
    step.add_argument("run_id", help=RUN_ID_HELP)
    step.add_argument("--host", help="the host, for per-host steps (provision, tune)")
    _baseline_and_alert_commands(sub)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"perfpipe: {exc}", file=sys.stderr)
        return 2
    except (PermissionError, NotADirectoryError, FileExistsError) as exc:  # e.g. a bad --out
        print(f"perfpipe: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except LockBusy as exc:  # another run has the lab: nothing was started
        print(f"perfpipe: {exc}", file=sys.stderr)
        return 3
    except StoreUnavailable as exc:  # the database down or locked past PERFPIPE_DB_RETRY_S
        print(f"perfpipe: {exc}", file=sys.stderr)
        return 4
    except StoreError as exc:  # e.g. an unknown run
        print(f"perfpipe: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

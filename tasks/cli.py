"""perfpipe: the command line. Every command calls the same step functions as the DAGs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sql import StoreError, StoreUnavailable

from .config_files import ConfigError
from .locks import LockBusy
from .metrics import ALERT_ACTIONS, RUN_KINDS
from .settings import load_settings
from .steps import STEPS


def epilog() -> str:
    width = max(len(step.name) for step in STEPS)
    lines = [f"  {step.name:<{width}}  {step.doc}"
             + (" (per host)" if step.per_host else "") + (" (always runs)" if step.always else "")
             for step in STEPS]
    return ("pipeline steps, in order (each but plan is also `perfpipe step NAME RUN_ID`):\n"
            + "\n".join(lines)
            + "\n\nexit codes: 0 done (a run: ended ok), 1 a run that did not end ok, 2 bad "
            "input, 3 the lab taken by another run, 4 the results database down or locked, "
            "5 a run that ended ok but could not tell Slack"
            + "\n\nsettings come from PERFPIPE_* environment variables (see README).")


def _run(args: argparse.Namespace) -> int:
    from .pipeline import run_pipeline

    outcome = run_pipeline(load_settings(), suite=args.suite, inventory=args.inventory,
                           kind=args.kind)
    return exit_code(outcome.status, outcome.warning)


def exit_code(status: str, warning: str | None) -> int:
    """0 ok, 1 not ok, 5 ok with a warning (Slack not told): a script or a scheduler sees
    a night nobody heard of, though its results are good."""
    return 1 if status != "ok" else 5 if warning else 0


def _nightly(args: argparse.Namespace) -> int:
    import time

    from .airflow_glue.dag_test import test_dag
    from .manage import show_run
    from .notify.failure import latest_message
    from .rundir import FAILURES_DIR
    from .steps.plan import check_plan, new_run_id

    settings = load_settings()
    # a suite or inventory no run can use: one line before Airflow starts, not a task trace
    check_plan(settings, args.suite or settings.suite, Path(settings.inventory))
    conf = {"suite": args.suite or settings.suite}
    started = time.time()
    airflow_run_id, state = test_dag("mqtt_perf_nightly", conf)
    failed_plan = latest_message(settings.state_dir / FAILURES_DIR, "plan", started)
    if failed_plan is not None:  # no run was planned: say why, not what the store lacks
        print(f"perfpipe: {failed_plan['text']} (Airflow run {airflow_run_id}: {state})",
              file=sys.stderr)
        return 1
    store = settings.store()
    run = store.run(new_run_id("nightly", f"mqtt_perf_nightly/{airflow_run_id}"))
    if run is None:
        print(f"Airflow run {airflow_run_id} ended {state} before perfpipe planned a run",
              file=sys.stderr)
        return 1
    show_run(store, run["run_id"])
    print(f"Airflow run {airflow_run_id}: {state}")
    return exit_code(run["status"], run["warning"]) if state == "success" else 1


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


def _show(args: argparse.Namespace) -> int:
    from .manage import show_run

    store = load_settings().store()
    if store.run(args.run_id) is None:
        print(f"no run {args.run_id!r}; recent: {[r['run_id'] for r in store.latest_runs(5)]}",
              file=sys.stderr)
        return 2
    show_run(store, args.run_id)
    return 0


def _report(args: argparse.Namespace) -> int:
    from .steps.report import rerender

    print(rerender(args.run_id, args.out))
    return 0


def _check_nightly(args: argparse.Namespace) -> int:
    from .notify.watchdog import check_nightly

    verdict = check_nightly()
    print(verdict["text"])
    return 1 if verdict["missing"] else 0


def _step(args: argparse.Namespace) -> int:
    from .steps import Call, run_step

    result = run_step(args.name, args.run_id, Call(host=args.host))
    print(result)
    return 0


def _baseline_and_alert_commands(sub: argparse._SubParsersAction) -> None:
    """`perfpipe baseline promote|list` and `perfpipe alerts list|ack|accept|false-positive|fixed`."""

    def handler(call):
        def run(args: argparse.Namespace) -> int:
            store = load_settings().store()
            try:  # a StoreError is said in one line by `main`
                store.migrate()
                return call(store, args)
            finally:
                store.close()
        return run

    from . import manage

    baseline = sub.add_parser("baseline", help="pin a run as a release baseline, list them")
    bsub = baseline.add_subparsers(dest="action", required=True)
    promote = bsub.add_parser("promote", help="pin an ok run as the release baseline LABEL")
    promote.add_argument("run_id")
    promote.add_argument("--label", required=True, help="release label, e.g. 9.4.5")
    promote.set_defaults(func=handler(lambda st, a: manage.promote(st, a.run_id, a.label)))
    blist = bsub.add_parser("list", help="the pinned release baselines")
    blist.set_defaults(func=handler(lambda st, a: manage.list_baselines(st)))
    alerts = sub.add_parser("alerts", help="list alerts; ack, accept, call a false positive, fixed")
    asub = alerts.add_subparsers(dest="action", required=True)
    alist = asub.add_parser("list", help="open alerts")
    alist.add_argument("--all", action="store_true", help="closed alerts too")
    alist.set_defaults(func=handler(lambda st, a: manage.list_alerts(st, include_closed=a.all)))
    for action in ALERT_ACTIONS:
        effect = manage.EFFECT[ALERT_ACTIONS[action]]
        one = asub.add_parser(action, help=effect.format(key="the stage", run="the alert's first run"))
        one.add_argument("alert_id", type=int)
        one.set_defaults(func=handler(
            lambda st, a, action=action: manage.set_status(st, a.alert_id, action)))


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="perfpipe", description=__doc__, epilog=epilog(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = root.add_subparsers(dest="command", required=True)
    nightly = sub.add_parser("nightly", help="run the nightly DAG once through Airflow (dag.test)")
    nightly.add_argument("--suite", help="suite from scenarios/suites.yml (default: "
                         "PERFPIPE_SUITE, else smoke)")
    nightly.set_defaults(func=_nightly)
    run = sub.add_parser("run", help="run the whole pipeline once, without Airflow")
    run.add_argument("--suite", help="suite from scenarios/suites.yml (default: smoke)")
    run.add_argument("--inventory", type=Path, help="inventory YAML (default: infra/inventories/local.yml)")
    run.add_argument("--kind", default="manual", choices=RUN_KINDS)
    run.set_defaults(func=_run)
    tune = sub.add_parser("tune", help="check, apply or restore a tuning profile on the hosts")
    tune.add_argument("--inventory", type=Path)
    tune.add_argument("--profile", help="infra/tuning/<name>.yml (default: the inventory's)")
    modes = tune.add_mutually_exclusive_group(required=True)
    for mode in ("check", "apply", "restore"):
        modes.add_argument(f"--{mode}", dest="mode", action="store_const", const=mode)
    tune.add_argument("--host", action="append", help="only this host (repeatable)")
    tune.set_defaults(func=_tune)
    plan = sub.add_parser("plan", help="print the stage table of a suite")
    plan.add_argument("--suite")
    plan.set_defaults(func=_plan)
    show = sub.add_parser("show", help="print a stored run's metrics and verdicts")
    show.add_argument("run_id")
    show.set_defaults(func=_show)
    report = sub.add_parser("report", help="re-render a stored run's HTML report from the store")
    report.add_argument("run_id")
    report.add_argument("--out", type=Path, help="file to write (default: the run folder's report.html)")
    report.set_defaults(func=_report)
    check = sub.add_parser("check-nightly", help="exit 1 and alert when no nightly ran recently "
                           "(PERFPIPE_NIGHTLY_MAX_AGE_H, default 26 h)")
    check.set_defaults(func=_check_nightly)
    step = sub.add_parser("step", help="run one step of a run not yet closed by teardown "
                          "(see the list below)")
    step.add_argument("name")
    step.add_argument("run_id")
    step.add_argument("--host", help="the host, for per-host steps (provision, tune)")
    step.set_defaults(func=_step)
    _baseline_and_alert_commands(sub)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"perfpipe: {exc}", file=sys.stderr)
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

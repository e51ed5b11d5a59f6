"""What a person does by hand, and what the maintenance DAG does for them: read a stored run,
pin a release baseline, move an alert through its lifecycle.

    perfpipe show RUN_ID                             a stored run's metrics and verdicts
    perfpipe baseline promote RUN_ID --label 9.4.5   pin an ok run as release baseline 9.4.5
    perfpipe baseline list                           the pinned release baselines
    perfpipe alerts list [--all]                     open alerts (--all: closed ones too)
    perfpipe alerts ack ID                           seen; the same regression stays quiet
    perfpipe alerts accept ID                        the new normal: its metric's history restarts there
    perfpipe alerts false-positive ID                not a regression: its nights rejoin the baseline
    perfpipe alerts fixed ID                         fixed; its nights stay out of the baseline
    perfpipe alerts ACTION ID --together             and the alerts flagged with it across stages
"""

from __future__ import annotations

from collections.abc import Callable

from sql import Store
from sql.alerts import release_of

from . import rundir
from .metrics import ALERT_ACTIONS, feeds_baselines
from .run_context import folder_of
from .settings import Settings, load_settings
from .views.summary import run_summary
from .views.tables import table

EFFECT = {
    "acked": "acknowledged: the same regression is not posted again",
    "accepted": ("accepted as the new normal: {metric}'s rolling history of {key} restarts at "
                 "{run} (its history on that run's fingerprint and setup; any other, and the "
                 "stage's other metrics, go on)"),
    "false_positive": "a false positive: its nights feed the baseline again",
    "fixed": "fixed: its nights stay out of the baseline",
}
EFFECT_VS_RELEASE = ("accepted and closed; release runs are still compared with release "
                     "{release}'s run (pin another with perfpipe baseline promote)")
EFFECT_OF_RELEASE_RUN = ("accepted and closed; it was opened by release {run}, which feeds "
                         "no rolling history: none restarts")


def show_run(store: Store, run_id: str, say: Callable[[str], None] = print) -> None:
    run = store.run(run_id)
    run_dir = folder_of(run, load_settings().run_dir(run_id))
    say(run_summary(run, store.stages(run_id), {
        "report": run_dir / rundir.REPORT, "slack message": run_dir / rundir.SLACK_MESSAGE}))


def promote(store: Store, run_id: str, label: str, say: Callable[[str], None] = print) -> int:
    """Pin a run as the release baseline `label` of its broker kind (the store refuses a
    run that is not ok)."""
    before = store.pin_release_baseline(label, run_id)
    moved = (f" (was run {before}: verdicts and alerts against {label} so far were judged "
             "on that run)") if before not in (None, run_id) else ""
    say(f"release baseline {label}: run {run_id}{moved}; release runs triggered from now on "
        "are compared with it")
    return 0


def list_baselines(store: Store, say: Callable[[str], None] = print) -> int:
    say(table([{"broker": b["broker_kind"], "label": b["label"], "run": b["run_id"],
                "pinned at": str(b["created_at"])[:19]} for b in store.release_baselines()]))
    return 0


def list_alerts(store: Store, *, include_closed: bool, say: Callable[[str], None] = print) -> int:
    rows = [{"id": a["id"], "status": a["status"], "stage key": a["stage_key"],
             "metric": a["metric"], "change %": a["change_pct"], "first run": a["first_run_id"],
             "last run": a["last_run_id"], "told": "yes" if a["delivered"] else "no"}
            for a in store.alerts(open_only=not include_closed)]
    say(table(rows) if rows else "no alerts" if include_closed else "no open alerts")
    return 0


def set_status(store: Store, alert_id: int, action: str, say: Callable[[str], None] = print,
               *, together: bool = False) -> int:
    """Carry out `action` (one of ALERT_ACTIONS) on an alert and say what it changes; with
    `together`, also on the alerts the run's stages flagged with it (one change seen on
    every stage: `store.alerts_flagged_with`), which are otherwise named, not changed."""
    status = ALERT_ACTIONS[action]
    siblings = store.alerts_flagged_with(alert_id)
    for one in [alert_id, *(siblings if together else [])]:
        store.set_alert_status(one, status)
        alert = store.alert(one)
        release = release_of(alert["stage_key"])
        effect = EFFECT[status]
        if status == "accepted" and release:
            effect = EFFECT_VS_RELEASE
        elif status == "accepted" and store.run(alert["first_run_id"])["kind"] == "release":
            effect = EFFECT_OF_RELEASE_RUN
        say(f"alert {one} ({alert['stage_key']} {alert['metric']}): "
            + effect.format(key=alert["stage_key"], run=f"run {alert['first_run_id']}",
                            release=release, metric=alert["metric"]))
    if siblings and not together:
        say(f"alerts {', '.join(map(str, siblings))} were flagged with it by the same test "
            f"across stages (one change on {len(siblings) + 1} stages), and are left as they "
            f"are: --together marks them {action} too")
    return 0


def promote_release(run_id: str, label: str, asked: bool = True,
                    settings: Settings | None = None) -> str:
    """The release DAG's `promote` task (and `perfpipe run --promote`): pin the run when
    `asked` (its `promote` Param) and it ended ok; a run that did not is said, not raised
    (its failure was told already: the task failing too would post a second alert saying
    nothing new)."""
    if not asked:
        return "not asked to promote"
    said: list[str] = []
    store = (settings or load_settings()).store()  # migrated already: the run's plan stored it
    try:
        run = store.run(run_id)
        if run is None or not feeds_baselines(run["status"], run["excluded"]):
            status = run["status"] if run else "not stored"
            return f"not promoted: run {run_id} is {status}; only an ok run becomes a baseline"
        promote(store, run_id, label, said.append)
    finally:
        store.close()
    return "\n".join(said)


def maintenance(action: str, *, run_id: str = "", label: str = "", alert_id: int = 0,
                together: bool = False) -> str:
    """What the maintenance DAG (and the release DAG's promote task) does: `promote` a run
    to a release baseline, or one of ALERT_ACTIONS on an alert (`together`: and on those
    flagged with it, `set_status`); returns what changed."""
    if action == "promote":
        if not run_id or not label:
            raise ValueError("promote needs run_id and label")
    elif action not in ALERT_ACTIONS:
        raise ValueError(f"action: {action!r} is not one of promote, {', '.join(ALERT_ACTIONS)}")
    elif alert_id <= 0:
        raise ValueError(f"{action} needs alert_id (see `perfpipe alerts list`)")
    said: list[str] = []
    store = load_settings().store()
    try:
        store.migrate()
        if action == "promote":
            promote(store, run_id, label, said.append)
        else:
            set_status(store, alert_id, action, said.append, together=together)
    finally:
        store.close()
    return "\n".join(said)

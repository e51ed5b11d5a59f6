"""Baselines and alerts by hand: what `perfpipe baseline ...` and `perfpipe alerts ...` call.

    perfpipe baseline promote RUN_ID --label 9.4.5   pin an ok run as release baseline 9.4.5
    perfpipe baseline list                           the pinned release baselines
    perfpipe alerts list [--all]                     open alerts (--all: closed ones too)
    perfpipe alerts ack ID                           seen; the same regression stays quiet
    perfpipe alerts accept ID                        the new normal: history restarts there
    perfpipe alerts false-positive ID                not a regression: its nights rejoin the baseline
    perfpipe alerts fixed ID                         fixed; its nights stay out of the baseline
"""

from __future__ import annotations

from collections.abc import Callable

from sql import Store

from .tables import table

ACTIONS = {"ack": "acked", "accept": "accepted", "false-positive": "false_positive",
           "fixed": "fixed"}
EFFECT = {
    "acked": "acknowledged: the same regression is not posted again",
    "accepted": "accepted as the new normal: the rolling history of {key} restarts at run {run}",
    "false_positive": "a false positive: its nights feed the baseline again",
    "fixed": "fixed: its nights stay out of the baseline",
}


def promote(store: Store, run_id: str, label: str, say: Callable[[str], None] = print) -> int:
    store.pin_release_baseline(label, run_id)
    say(f"release baseline {label}: run {run_id}; release runs triggered from now on are "
        "compared with it")
    return 0


def list_baselines(store: Store, say: Callable[[str], None] = print) -> int:
    say(table([{"label": b["label"], "run": b["run_id"], "pinned at": str(b["created_at"])[:19]}
               for b in store.release_baselines()]))
    return 0


def list_alerts(store: Store, *, include_closed: bool, say: Callable[[str], None] = print) -> int:
    rows = [{"id": a["id"], "status": a["status"], "stage key": a["stage_key"],
             "metric": a["metric"], "change %": a["change_pct"], "first run": a["first_run_id"],
             "last run": a["last_run_id"], "told": "yes" if a["delivered"] else "no"}
            for a in store.alerts(open_only=not include_closed)]
    say(table(rows) if rows else "no alerts" if include_closed else "no open alerts")
    return 0


def set_status(store: Store, alert_id: int, action: str, say: Callable[[str], None] = print) -> int:
    status = ACTIONS[action]
    store.set_alert_status(alert_id, status)
    alert = store.alert(alert_id)
    say(f"alert {alert_id} ({alert['stage_key']} {alert['metric']}): "
        + EFFECT[status].format(key=alert["stage_key"], run=alert["first_run_id"]))
    return 0

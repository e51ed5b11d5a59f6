"""The nightly watchdog: a nightly that did not run is news too.

Run by the `mqtt_perf_watchdog` DAG each morning (and `perfpipe check-nightly`): when no
nightly run started within `nightly_max_age_h` hours, a short message goes to Slack (and
to `<state>/watchdog/` as a file). `nightly_missing` is the pure rule.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ..settings import Settings, load_settings
from .failure import write_message
from .messages import missing_nightly_message
from .slack import SlackError, notifier_for

WATCHDOG_DIR = "watchdog"


def nightly_missing(last: dict | None, now: datetime, max_age_h: float) -> bool:
    return last is None or now - last["started_at"] > timedelta(hours=max_age_h)


def check_nightly(settings: Settings | None = None, *, airflow: bool = False,
                  now: datetime | None = None) -> dict:
    """{"missing", "text"}; alerts when the last nightly is too old. `airflow`: called from
    the watchdog DAG (Slack from its Connection first)."""
    settings = settings or load_settings()
    store = settings.store()
    if airflow:  # the deployed perfpipe's own DAG; a command never migrates a shared store
        store.migrate()
    else:
        store.open_for_commands()
    last = next(iter(store.latest_runs(1, kind="nightly")), None)
    now = now or datetime.now(timezone.utc)
    if not nightly_missing(last, now, settings.nightly_max_age_h):
        return {"missing": False, "text": f"nightly ok: {last['run_id']} started "
                                          f"{last['started_at']:%Y-%m-%d %H:%M} UTC"}
    message = missing_nightly_message(last, settings.nightly_max_age_h)
    write_message(settings.state_dir / WATCHDOG_DIR, "nightly", message)
    notifier = notifier_for(settings, airflow=airflow)
    if notifier.enabled:
        try:
            notifier.post(message)
        except SlackError as exc:
            if airflow:  # the watchdog task fails: its DAG run is not green
                raise
            return {"missing": True, "text": message["text"], "slack_error": str(exc)}
    return {"missing": True, "text": message["text"]}

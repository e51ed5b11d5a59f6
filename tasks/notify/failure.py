"""The Airflow `on_failure_callback`: a short Slack message naming the task, the host or
stage (a mapped task's rendered index) and the error's first line, with the log link.

The message (built by `tasks.notify.messages.failure_message`) is written to the run folder, or
to the state folder before a run exists, and posted when Slack is configured (`post_kept`):
the file then says what Slack answered, its `ts` or the `error`, and a message of a run that
Slack did not take is sent by a later run's alert step (`tasks.steps.alert.resend`).
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone
from pathlib import Path

from ..rundir import FAILURES_DIR


def write_message(directory: Path, task_id: str, message: dict) -> Path:
    """A new file `<time>-<random>-<task id>.json`: two instances of a mapped task that
    fail in the same second (two hosts' provision) each keep theirs."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = directory / f"{stamp}-{secrets.token_hex(4)}-{task_id}.json"
    with open(path, "x") as handle:  # never another's
        handle.write(json.dumps(message, indent=1))
    return path


def post_kept(notifier, path: Path, message: dict) -> str:
    """Post a failure message written at `path` and write what Slack answered beside it:
    its `ts`, or the `error` (re-raised) that leaves it for a later run to send."""
    from ..run_context import replace_json
    from .slack import SlackError

    try:
        ts = notifier.post(message)
    except SlackError as exc:
        replace_json(path, {**message, "error": str(exc)})
        raise
    replace_json(path, {**message, "ts": ts})
    return ts


def untaken_failure(doc: dict) -> bool:
    """A failure message Slack was asked to take and did not (`post_kept`), nor refused
    for itself when sent late."""
    return bool(doc.get("error")) and not doc.get("ts") and not doc.get("refused")


def latest_message(directory: Path, task_id: str, since: float) -> dict | None:
    """The newest failure message of `task_id` written in `directory` at or after `since`
    (a Unix time), or None."""
    written = {path: path.stat().st_mtime for path in directory.glob(f"*-{task_id}.json")}
    newest = max((path for path, mtime in written.items() if mtime >= since),
                 key=written.__getitem__, default=None)
    return json.loads(newest.read_text()) if newest else None


def notify_failure(context) -> None:
    """Never raises: a failing callback would hide the task's own failure."""
    from ..settings import load_settings
    from .messages import failure_message
    from .slack import notifier_for

    try:
        ti = context["ti"]
        settings = load_settings()
        run_id = ti.xcom_pull(task_ids="plan") if ti.task_id != "plan" else None
        message = failure_message(
            dag_id=ti.dag_id, task_id=ti.task_id, item=getattr(ti, "rendered_map_index", None),
            error=str(context.get("exception") or "unknown error"),
            log_url=getattr(ti, "log_url", None), run_id=run_id)
        directory = (settings.run_dir(run_id) if run_id else settings.state_dir) / FAILURES_DIR
        path = write_message(directory, ti.task_id, message)
        print(f"failure alert: {message['text']} ({path})")
        notifier = notifier_for(settings, airflow=True)
        if notifier.enabled:
            post_kept(notifier, path, message)
    except Exception as exc:  # report, never mask the task's own failure
        print(f"failure alert could not be sent: {type(exc).__name__}: {exc}")

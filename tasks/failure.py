"""The short message for a pipeline failure: which task, which host, the error's first line.

`failure_message` is pure; `notify_failure` is the Airflow `on_failure_callback`. The
message is written to the run folder (or the state folder before a run exists) and posted
to Slack when a token is configured.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

FAILURES_DIR = "failures"


def failure_message(*, dag_id: str, task_id: str, item: str | None, error: str,
                    log_url: str | None, run_id: str | None) -> dict:
    """`item` is the mapped task's host or stage (the map index's rendered name)."""
    first = (error.strip().splitlines() or ["(no message)"])[0][:300]
    where = f"{task_id}[{item}]" if item else task_id
    text = f"perfpipe {dag_id}: {where} failed: {first}"
    fields = [f"*task* {where}", f"*run* {run_id or '-'}"]
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": f":x: {text}"}},
              {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(fields)}]}]
    if log_url:
        blocks[1]["elements"].append({"type": "mrkdwn", "text": f"<{log_url}|log>"})
    return {"text": text, "blocks": blocks, "needs_attention": True}


def write_message(directory: Path, task_id: str, message: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    path = directory / f"{stamp}-{task_id}.json"
    path.write_text(json.dumps(message, indent=1))
    return path


def notify_failure(context) -> None:
    """Airflow on_failure_callback: never raises (a failing callback would hide the failure)."""
    from .alert import SlackNotifier
    from .settings import load_settings

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
        token = settings.slack_token.get_secret_value() if settings.slack_token else None
        notifier = SlackNotifier.from_token(token, settings.slack_channel, settings.slack_base_url)
        if notifier.client is not None:
            notifier.client.chat_postMessage(channel=settings.slack_channel, text=message["text"],
                                             blocks=message["blocks"])
    except Exception as exc:  # report, never mask the task's own failure
        print(f"failure alert could not be sent: {type(exc).__name__}: {exc}")

"""Step 10, alert: tell the team in Slack when a run regressed (or broke).

`build_message` is pure. `SlackNotifier` is handed its slack-sdk `WebClient` (or none: then
the message is written to the run directory and printed). The token never leaves the
client: it is not logged, written or returned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler, ServerErrorRetryHandler

from sql.alerts import alert_key

from .run_context import RunContext

MESSAGE_FILE = "slack_message.json"
MAX_ROWS = 10


class AlertError(RuntimeError):
    """Slack refused the message; the text names the Slack error code, never the token."""


@dataclass(frozen=True)
class Outcome:
    posted: bool
    path: str | None
    text: str
    ts: str | None = None  # the Slack message ts, when posted


def _row(v: dict) -> str:
    return (f"*{v['stage_id']}* `{v['metric']}`: {v['baseline_value']:.4g} -> {v['value']:.4g} "
            f"({v['change_pct']:+.1f}%, confidence {v['confidence'] if v['confidence'] is not None else 'n/a'})")


def build_message(run: dict, verdicts: list[dict], report_path: str) -> dict:
    """The Slack message for a run: regressions first, capped at MAX_ROWS rows."""
    regressions = [v for v in verdicts if v["verdict"] == "regression"]
    counts = {k: sum(v["verdict"] == k for v in verdicts)
              for k in ("regression", "improvement", "unchanged", "no_baseline", "invalid")}
    head = (f"perfpipe {run['kind']} run {run['run_id']} ({run['broker_kind']} "
            f"{run.get('broker_version')}, suite {run['suite']}): "
            + (f"{len(regressions)} regression(s)" if regressions else "no regressions"))
    summary = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items() if n)
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
              {"type": "section", "text": {"type": "mrkdwn", "text": summary or "no verdicts"}}]
    if regressions:
        lines = [_row(v) for v in regressions[:MAX_ROWS]]
        if len(regressions) > MAX_ROWS:
            lines.append(f"... and {len(regressions) - MAX_ROWS} more in the report")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"report: {report_path}"}]})
    return {"text": head, "blocks": blocks, "needs_attention": bool(regressions)}


class SlackNotifier:
    def __init__(self, client: WebClient | None, channel: str) -> None:
        self.client = client
        self.channel = channel

    @classmethod
    def from_token(cls, token: str | None, channel: str, base_url: str | None = None) -> SlackNotifier:
        if not token:
            return cls(None, channel)
        client = WebClient(token=token, base_url=base_url or WebClient.BASE_URL,
                           retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=3),
                                           ServerErrorRetryHandler(max_retry_count=2)])
        return cls(client, channel)

    def send(self, message: dict, run_dir: Path) -> Outcome:
        """Post when a human is needed and a client is configured; always keep a copy."""
        path = run_dir / MESSAGE_FILE
        path.write_text(json.dumps({"channel": self.channel, **message}, indent=1))
        if self.client is None or not message["needs_attention"]:
            return Outcome(False, str(path), message["text"])
        try:
            response = self.client.chat_postMessage(channel=self.channel, text=message["text"],
                                                    blocks=message["blocks"])
        except SlackApiError as exc:
            raise AlertError(f"Slack refused the message: {exc.response.get('error')}") from None
        return Outcome(True, str(path), message["text"], response.get("ts"))


def news(verdicts: list[dict], undelivered: list[dict]) -> tuple[list[dict], list[int], list[int]]:
    """What tonight's message may call a regression: the verdicts whose alert is new or
    changed and confirmed (a regression already told is not told again), their alert ids,
    and the ids of undelivered alerts no human needs to hear of (suspected, cleared).
    Recovered alerts stay undelivered for a thread reply (not in this format yet)."""
    fresh = {(a["stage_key"], a["metric"]): a for a in undelivered}
    told = [v for v in verdicts if v["verdict"] == "regression"
            and fresh.get((v["alert_key"], v["metric"]), {}).get("status") == "confirmed"]
    told_ids = [fresh[(v["alert_key"], v["metric"])]["id"] for v in told]
    quiet = [a["id"] for a in undelivered if a["status"] in ("suspected", "cleared")]
    return told, told_ids, quiet


def alert(ctx: RunContext, report_path: str) -> dict:
    store = ctx.store()
    run = store.run(ctx.run_id)
    verdicts = [{**c, "stage_id": s["stage_id"], "alert_key": alert_key(s["stage_key"], c["detail"])}
                for s in store.stages(ctx.run_id) for c in s.get("comparisons", [])]
    told, told_ids, quiet = news(verdicts, store.undelivered_alerts())
    shown = [v for v in verdicts if v["verdict"] != "regression" or v in told]
    settings = ctx.settings
    token = settings.slack_token.get_secret_value() if settings.slack_token else None
    notifier = SlackNotifier.from_token(token, settings.slack_channel, settings.slack_base_url)
    outcome = notifier.send(build_message(run, shown, report_path), ctx.run_dir)
    for alert_id in told_ids:
        store.mark_alert_delivered(alert_id, outcome.ts)
    for alert_id in quiet:
        store.mark_alert_delivered(alert_id, None)
    return {"posted": outcome.posted, "message": outcome.path, "text": outcome.text,
            "alerts_told": len(told_ids)}

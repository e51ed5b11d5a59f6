"""Step alert: tell the team in Slack what a run found, once.

What is told comes from the alert lifecycle (sql/alerts.py), not from tonight's verdicts
alone: the compare step leaves an alert *undelivered* only when it is new or changed.
`plan_delivery` (pure) sorts the undelivered alerts:
- confirmed and never posted: rows of the run's message (also when the evidence is from
  an earlier run whose message could not be sent: the alert was kept for tonight);
- already posted and changed (grown, recovered): a reply in the thread of the message
  that first told it;
- anything else (suspected, cleared, recovered before anyone heard of it): delivered
  quietly, no message.
A nightly posts a message only when it has rows; a release run always posts its summary;
a run whose stages were mostly invalid gets a short message of its own.

Everything sent is also written to `slack_message.json` in the run folder (with no Slack
client that file is the delivery), each message as soon as Slack took it. A retried alert
step (after the database failed under it, say) updates the messages and thread replies it
posted (`chat.update`) instead of posting them again. When Slack stays unreachable after the
SDK's retries, the alerts stay undelivered and the next run sends them; a release summary
or an invalid-run message it did not take, and a task's failure alert it did not take, are
sent by the next run's alert step (`resend`, marked as late, once), and the alerts a summary
so sent tells are delivered with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote

from sql import Store
from sql.alerts import alert_key

from .. import rundir
from ..airflow_glue.dag_runs import split_dag_run_key
from ..catalog.stages import is_probe, is_search
from ..metrics import CAPACITY_AND_COST, FLAGGED
from ..notify.messages import (
    Links,
    Row,
    blind_spots,
    invalid_run_message,
    run_message,
    sent_late,
    thread_reply,
)
from ..notify.failure import untaken_failure
from ..notify.slack import MESSAGE_REFUSED, SlackError, SlackNotifier, notifier_for
from ..run_context import RunContext, folder_of, replace_json
from ..settings import Settings
from ..views.history import Histories
from ..views.tables import (
    covariate_note,
    cpu_note,
    flagged_note,
    mde_text,
    release_note,
    verdict_counts,
)
from . import Call
from .load_metrics import stage_failures
from .report import stored_histories

TOLD_STATUSES = ("new", "confirmed")  # an alert with one of these is told at top level
QUIET_FOR_LATER = ("suspected", "cleared")


@dataclass
class Delivery:
    headline: list[Row] = field(default_factory=list)
    replies: dict[str, list[Row]] = field(default_factory=dict)  # thread ts -> rows
    quiet: list[int] = field(default_factory=list)  # alert ids delivered without a message


Evidence = dict[tuple[str, str], Row]  # (alert key, metric) -> the verdict as a row


def evidence_of(stages: list[dict], run_id: str, histories: Histories | None = None) -> Evidence:
    """Every comparison of a run as a Row, keyed like the alert it belongs to; `histories`
    (stage id -> earlier nights, oldest first) gives capacity and cost rows their earlier
    values."""
    out = {}
    for stage in stages:
        earlier = (histories or {}).get(stage["stage_id"], [])
        for c in stage.get("comparisons", []):
            nights = [e["metrics"].get(c["metric"]) for e in earlier] \
                if c["metric"] in CAPACITY_AND_COST else []
            key = (alert_key(stage["stage_key"], c["detail"]), c["metric"])
            out[key] = Row(alert_id=0, status=c["verdict"], verdict=c["verdict"],
                           scenario=stage["scenario"], stage_id=stage["stage_id"],
                           params=stage.get("params") or {}, metric=c["metric"],
                           baseline_value=c["baseline_value"], value=c["value"],
                           change_pct=c["change_pct"], confidence=c["confidence"],
                           nights=int(c["detail"].get("nights") or 1),
                           fingerprint=stage.get("fingerprint_hash"), run_id=run_id,
                           history=tuple(v for v in nights if v is not None),
                           mde_text=mde_text(c["detail"]),
                           across_note=flagged_note(c["detail"], short=True),
                           baseline_note=covariate_note(c["detail"], short=True),
                           release_note=release_note(c["detail"], short=True),
                           cpu_note=cpu_note(c["detail"], short=True))
    return out


def plan_delivery(undelivered: list[dict], evidence: dict[str, Evidence]) -> Delivery:
    """Sort undelivered alerts into message rows, thread replies and quiet deliveries.
    `evidence`: run id -> that run's rows; an alert's row comes from its last run."""
    plan = Delivery()
    for a in undelivered:
        row = evidence.get(a["last_run_id"], {}).get((a["stage_key"], a["metric"]))
        row = row and replace(row, alert_id=a["id"], status=a["status"])
        if row is None or a["status"] in QUIET_FOR_LATER:
            plan.quiet.append(a["id"])
        elif a["slack_ts"]:
            plan.replies.setdefault(a["slack_ts"], []).append(row)
        elif a["status"] in TOLD_STATUSES:
            plan.headline.append(row)
        else:  # recovered or acked before it was ever posted: nobody is waiting for it
            plan.quiet.append(a["id"])
    return plan


def links_for(settings: Settings, run: dict, report_path: str) -> Links:
    report = (f"{settings.report_base_url.rstrip('/')}/{quote(run['run_id'])}/{rundir.REPORT}"
              if settings.report_base_url else report_path)
    airflow = None
    made_by = split_dag_run_key(run.get("dag_run_id"))
    if settings.airflow_base_url and made_by:
        dag_id, airflow_run = made_by
        airflow = (f"{settings.airflow_base_url.rstrip('/')}/dags/{quote(dag_id)}"
                   f"/runs/{quote(airflow_run, safe='')}")
    return Links(report, airflow)


def invalid_to_tell(stages: list[dict], broken: frozenset[str] = frozenset()
                    ) -> tuple[dict[str, str], int]:
    """(stage id -> reason of the invalid stages, of how many), when more than half the
    stages with results are invalid, or one of them is `broken` (a driver process died in
    it) or a max-rate search's own (no capacity measured: a broker far below its last
    capacity would otherwise never be told); ({}, 0) otherwise. A search's probes and holds
    are not counted: one falls behind wherever the search passes the broker's limit, as it
    is meant to, and the search's own stage says whether it found one (a probe in which a
    driver died is told)."""
    judged = [s for s in stages if s.get("validity") is not None]
    counted = [s for s in judged if not is_probe(s) or s["stage_id"] in broken]
    invalid = {s["stage_id"]: s.get("reason") or s["validity"] for s in counted
               if s["validity"] != "valid"}
    mostly = counted and 2 * len(invalid) > len(counted)
    unmeasured = {s["stage_id"] for s in counted if is_search(s)} & set(invalid)
    return (invalid, len(counted)) if mostly or (broken | unmeasured) & set(invalid) \
        else ({}, 0)


class Courier:
    """Sends one run's messages and keeps what was sent in the run folder; a message sent
    by an earlier attempt of this step is updated in place."""

    def __init__(self, notifier: SlackNotifier, run_dir: Path) -> None:
        self.notifier = notifier
        self.path = run_dir / rundir.SLACK_MESSAGE
        self.sent: dict = kept_messages(self.path) or {}  # unreadable: sent anew
        self.record: dict = {"channel": notifier.channel, "replies": []}

    def send(self, slot: str, message: dict, alerts: list[int] = ()) -> str | None:
        """`alerts`: the ids of the alerts the message tells (a resent one delivers them)."""
        earlier = (self.sent.get(slot) or {}).get("ts")
        self.keep(slot, message, earlier, alerts)  # kept whatever Slack answers: for the next run
        ts = None
        if self.notifier.enabled:
            ts = self.notifier.update(earlier, message) if earlier else self.notifier.post(message)
        self.keep(slot, message, ts, alerts)
        self.save()  # on disk before anything else can fail: a retried step updates it
        return ts

    def keep(self, slot: str, message: dict, ts: str | None = None,
             alerts: list[int] = ()) -> None:
        self.record[slot] = {**message, "ts": ts, **({"alerts": list(alerts)} if alerts else {})}

    def reply(self, thread_ts: str, message: dict) -> None:
        earlier = next((r.get("ts") for r in self.sent.get("replies", [])
                        if r["thread_ts"] == thread_ts), None)
        ts = None
        if self.notifier.enabled:
            ts = (self.notifier.update(earlier, message) if earlier
                  else self.notifier.post(message, thread_ts=thread_ts))
        self.record["replies"].append({**message, "thread_ts": thread_ts, "ts": ts})
        self.save()

    def save(self, **extra) -> str:
        run_message_doc = self.record.get("run") or {}
        return str(replace_json(self.path, {**run_message_doc, **self.record, **extra}))


def _rows_to_tell(run: dict, plan: Delivery, tonight: Evidence) -> list[Row]:
    """The run message's rows: the new alerts; a release summary adds every bad verdict of
    tonight against its baseline, told before or not."""
    if run["kind"] != "release":
        return plan.headline
    shown = {(r.stage_id, r.metric) for r in plan.headline if r.run_id == run["run_id"]}
    return plan.headline + [r for r in tonight.values()
                            if r.verdict in FLAGGED and (r.stage_id, r.metric) not in shown]


def deliver(store: Store, run_id: str, notifier: SlackNotifier, links: Links,
            run_dir: Path, broken: frozenset[str] = frozenset()) -> dict:
    """Send what run `run_id` has to tell; mark what was delivered; keep the rest.
    `broken`: the stages in which a driver process or the broker died (always told)."""
    run, stages = store.run(run_id), store.stages(run_id)
    if notifier.enabled:  # first: a release summary sent late delivers the alerts it tells
        resend(store, notifier, run_dir.parent, run_id)
    undelivered = store.undelivered_alerts()
    evidence = {r: evidence_of(store.stages(r), r)
                for r in {a["last_run_id"] for a in undelivered} - {run_id}}
    evidence[run_id] = evidence_of(stages, run_id, stored_histories(store, run_id, stages))
    plan = plan_delivery(undelivered, evidence)
    counts = verdict_counts(c for s in stages for c in s.get("comparisons", []))
    message = run_message(run, _rows_to_tell(run, plan, evidence[run_id]), dict(counts), links,
                          blind_spots(stages))
    needs_attention = bool(plan.headline) or run["kind"] == "release"
    courier = Courier(notifier, run_dir)
    invalid, counted = invalid_to_tell(stages, broken)
    invalid_message = invalid and invalid_run_message(run, invalid, counted, links)
    if invalid_message:  # kept whatever Slack answers, like the run's message
        courier.keep("invalid", invalid_message)
    delivered: list[tuple[int, str | None]] = [(i, None) for i in plan.quiet]
    error = None
    try:
        if needs_attention:
            ts = courier.send("run", message, [r.alert_id for r in plan.headline])
            delivered += [(r.alert_id, ts) for r in plan.headline]
        else:
            courier.keep("run", message)
        for thread_ts, rows in plan.replies.items():
            courier.reply(thread_ts, thread_reply(run, rows, links))
            delivered += [(r.alert_id, thread_ts) for r in rows]
        if invalid_message:
            courier.send("invalid", invalid_message)
    except SlackError as exc:
        error = str(exc)
        print(f"alert: {error}; undelivered alerts are kept for the next run")
    for alert_id, ts in delivered:
        store.mark_alert_delivered(alert_id, ts)
    kept = len(undelivered) - len(delivered)
    posted = notifier.enabled and error is None and needs_attention
    path = courier.save(needs_attention=needs_attention, posted=posted, error=error, kept=kept)
    print(f"alert: {message['text']}" + ("" if notifier.enabled else f" (written to {path})"))
    return {"posted": posted, "message": path, "text": message["text"],
            "alerts_told": len({i for i, _ in delivered} & {r.alert_id for r in plan.headline}),
            "replies": len(plan.replies), "kept": kept, "error": error}


RESEND_LOOKBACK = 20  # earlier runs whose untaken messages a run's alert step sends


def untaken(doc: dict, kind: str) -> list[str]:
    """The slots of an earlier run's slack_message.json that Slack never took and that no
    later message repeats: a release summary, an invalid-run message. (A nightly's alerts
    stay undelivered, so the next run's own message tells them.)"""
    if not doc.get("error"):
        return []
    return [slot for slot in ("run", "invalid")
            if isinstance(doc.get(slot), dict) and not doc[slot].get("ts")
            and not doc[slot].get("refused") and (slot == "invalid" or kind == "release")]


def resend(store: Store, notifier: SlackNotifier, runs_dir: Path, run_id: str) -> int:
    """Send the messages runs kept because Slack did not take them, oldest run first, each
    once (its ts is written back to its file); returns how many. The alerts a release
    summary sent so tells are delivered in its thread (tonight's message does not tell them
    again). A message Slack refuses is said and left for the next run (tonight's still go);
    when Slack cannot be reached, the rest are left too."""
    sent = 0
    try:
        for earlier in reversed(store.latest_runs(RESEND_LOOKBACK)):
            folder = folder_of(earlier, runs_dir / earlier["run_id"])
            for path, slot in _untaken_in(folder, earlier, run_id):
                sent += _send_late(store, notifier, path, slot, earlier["run_id"], run_id)
    except SlackError as exc:
        print(f"alert: messages kept by earlier runs not sent late ({exc}); kept for the next run")
    return sent


def _untaken_in(folder: Path, run: dict, tonight: str) -> list[tuple[Path, str | None]]:
    """(file, slot) of the messages in a run's folder that Slack did not take: its failure
    alerts (slot None: the file is the message; tonight's too), then, for an earlier run,
    the slots of its slack_message.json that `untaken` names."""
    found: list[tuple[Path, str | None]] = [
        (path, None) for path in sorted((folder / rundir.FAILURES_DIR).glob("*.json"))
        if untaken_failure(kept_messages(path) or {})]
    doc = kept_messages(folder / rundir.SLACK_MESSAGE) if run["run_id"] != tonight else None
    return found + [(folder / rundir.SLACK_MESSAGE, slot) for slot in untaken(doc or {}, run["kind"])]


def _send_late(store: Store, notifier: SlackNotifier, path: Path, slot: str | None,
               earlier: str, tonight: str) -> int:
    """Send one kept message late (1), or say Slack refused it (0); raises `SlackError`
    when Slack cannot be reached."""
    doc = kept_messages(path) or {}
    message = doc if slot is None else doc[slot]
    try:
        ts = notifier.post(sent_late(message, earlier, ended=slot is not None))
    except SlackError as exc:
        if not exc.refused:
            raise
        if exc.code in MESSAGE_REFUSED:  # refused for itself: no later run tries it again
            message = {**message, "refused": str(exc)}
            replace_json(path, message if slot is None else {**doc, slot: message})
            print(f"alert: {path} of run {earlier}: Slack refuses this message itself ({exc}); "
                  "kept there, not sent again")
        else:
            print(f"alert: {path.name} of run {earlier} not sent late ({exc}); kept for the "
                  "next run")
        return 0
    message = {**message, "ts": ts, "sent_late_by": tonight}
    replace_json(path, message if slot is None else {**doc, slot: message})
    waiting = {a["id"] for a in store.undelivered_alerts()}
    for alert_id in set(message.get("alerts", [])) & waiting:
        store.mark_alert_delivered(alert_id, ts)
    return 1


def kept_messages(path: Path) -> dict | None:
    """A run's slack_message.json, or None, said, when it cannot be read (one cut short by
    a full disk before it was written whole): what it kept is lost, and neither this run's
    alert step nor a later one's resend may fail for it."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"alert: {path} unreadable, its messages not sent again ({exc})")
        return None


def run(ctx: RunContext, call: Call) -> dict:
    """Under Airflow, a Slack that did not take the run's messages fails the task once
    everything is kept, so the DAG run is not green (`perfpipe run` exits 5); teardown still
    closes the run `ok` with the warning, and the next run sends what was kept."""
    store = ctx.store()
    links = links_for(ctx.settings, store.run(ctx.run_id), str(ctx.run_dir / rundir.REPORT))
    broken = frozenset(stage_failures(ctx))
    told = deliver(store, ctx.run_id, notifier_for(ctx.settings, airflow=call.airflow), links,
                   ctx.run_dir, broken)
    if call.airflow and told["error"]:
        # the step did its part (everything kept for the next run): teardown must not call
        # the run failed for it, only warn; the task still fails, for the DAG run's colour
        ctx.mark_finished("alert")
        raise SlackError(f"Slack not told: {told['error']}; the run's results are stored and "
                         f"{told['kept']} alert(s) kept for the next run ({told['message']})")
    return told

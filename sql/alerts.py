"""Alert lifecycle rows: one open alert per (stage_key, metric) and history (an alert of
another setup or host fingerprint stays open beside tonight's, for its own history's nights
or a person; `follow_verdict`, `sql.histories`), never re-posted for the same change.
Functions take the caller's session so each store call is one transaction.

Open statuses: new, suspected, confirmed (set by the pipeline) and acked (set by a human,
and kept when the pipeline reports the same regression again). Closing statuses: fixed,
accepted, false_positive (human), recovered (pipeline: a confirmed regression is gone) and
cleared (pipeline: the night after a suspicion did not confirm it).

An alert is *changed* (undelivered again, so the next Slack delivery carries it) when its
status changes or its change grows to `GROWTH` times the size last reported; one more
night of the same evidence only moves last_run_id.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Select, delete, or_, select
from sqlalchemy.orm import Session

from tasks.metrics import NOT_JUDGED, OPEN_ALERT_STATUSES, compared_release, flagged_across

from .common import StoreError, check, finite, row_dict
from .histories import History, holds
from .models import Alert, Comparison, Run, Stage

_PIPELINE_OPEN = ("new", "suspected", "confirmed")
GROWTH = 1.5  # a regression that grows to 1.5x its reported size is news again
VERDICT_STATUS = {"suspected": "suspected", "regression": "confirmed"}


def alert_key(stage_key: str, detail: dict | None) -> str:
    """The lifecycle a verdict belongs to: its stage key, or `<stage key> vs release <label>`
    for a comparison with a pinned release baseline (`compared_release`)."""
    label = compared_release(detail)
    return f"{stage_key}{_VS}{label}" if label is not None else stage_key


_VS = " vs release "


def release_of(key: str) -> str | None:
    """The release label of an `alert_key` that compares with a pinned release; None for a
    stage key's own (rolling) lifecycle."""
    return key.split(_VS, 1)[1] if _VS in key else None


def drop_opened(s: Session, run_id: str, stage_keys: set[str]) -> None:
    """Delete the alerts `run_id` opened of these stage keys, their own and against a
    release (`alert_key`): the run's stages of those keys are gone (`Store.keep_stages`)."""
    for key in stage_keys:
        s.execute(delete(Alert).where(
            Alert.first_run_id == run_id,
            or_(Alert.stage_key == key, Alert.stage_key.startswith(key + _VS, autoescape=True))))


def _grown(new: float | None, reported: float | None) -> bool:
    if new is None or reported is None:
        return new is not None and reported is None
    return abs(new) >= GROWTH * abs(reported) and not math.isclose(new, reported)


def _newest_first(stage_key: str, metric: str, *, open_only: bool) -> Select:
    q = select(Alert).where(Alert.stage_key == stage_key, Alert.metric == metric)
    if open_only:
        q = q.where(Alert.status.in_(OPEN_ALERT_STATUSES))
    return q.order_by(Alert.id.desc())


def _latest(s: Session, stage_key: str, metric: str, *, open_only: bool) -> Alert | None:
    return s.scalars(_newest_first(stage_key, metric, open_only=open_only).limit(1)).first()


def upsert_alert(s: Session, *, stage_key: str, metric: str, run_id: str, status: str,
                 change_pct: float | None) -> tuple[int, bool]:
    """Open, update or close the newest open alert of stage_key+metric; (alert id, changed).

    `changed` is False when nothing worth telling happened: the open alert already has this
    status and about this change (a retry, or one more night of the same evidence: only
    last_run_id moves), or a closing status arrives when nothing is open. A changed alert
    is marked undelivered and keeps the new change as the one reported.
    """
    check("alerts.status", status)
    _check_run(s, run_id)
    alert = _latest(s, stage_key, metric, open_only=True)
    if alert is not None:
        return _update(alert, run_id, status, change_pct)
    if status in OPEN_ALERT_STATUSES:
        return _open(s, stage_key, metric, run_id, status, change_pct)
    closed = _latest(s, stage_key, metric, open_only=False)
    if closed is None:
        raise StoreError(f"no alert for {stage_key} {metric} to set to {status!r}")
    return closed.id, False


def follow_verdict(s: Session, *, stage_key: str, metric: str, run_id: str, verdict: str,
                   change_pct: float | None, judged_on: History | None = None
                   ) -> tuple[int, bool] | None:
    """Keep the open alert of tonight's history in step with tonight's verdict; (id,
    changed), or None when there is none and none is needed. suspected / regression open or
    update it; any other judged verdict closes it: `cleared` if it was only suspected (acked
    or not), else `recovered`. invalid and no_baseline say nothing about the change: no-op.
    A verdict of a night older than the one an alert of its history last followed (its
    compare run again) leaves the alerts as they are (`_judged_since`).

    Given `judged_on` (tonight's history), an alert opened on a night of another history
    (another host fingerprint or setup; a release run's, for a nightly judged against the
    rolling history, and the other way round) is left as it is: tonight's verdict neither
    closes nor updates it (it stays open, for its own history's next night or a person),
    and a change tonight opens an alert of its own."""
    if verdict in NOT_JUDGED:
        return None
    _check_run(s, run_id)
    if _judged_since(s, stage_key, metric, run_id, judged_on):
        return None  # an older night judged again: its verdict is stored, the alerts are not its
    alert = _open_of_history(s, stage_key, metric, judged_on)
    if verdict in VERDICT_STATUS:
        if alert is None:
            return _open(s, stage_key, metric, run_id, VERDICT_STATUS[verdict], change_pct)
        return _update(alert, run_id, VERDICT_STATUS[verdict], change_pct)
    if alert is None:
        return None
    closing = "recovered" if _ever_confirmed(s, alert, judged_on) else "cleared"
    return _update(alert, run_id, closing, change_pct)


def _ever_confirmed(s: Session, alert: Alert, judged_on: History | None) -> bool:
    """Whether the alert's change was ever confirmed: its status says so, or, acked (a
    person saw it), a night of its history (`judged_on`) was judged a regression (an alert
    acked while only suspected that the next night does not repeat is cleared, not
    recovered)."""
    if alert.status != "acked":
        return alert.status != "suspected"  # confirmed (or new, told as confirmed)
    base = alert.stage_key.split(_VS, 1)[0]
    first, last = s.get(Run, alert.first_run_id), s.get(Run, alert.last_run_id)
    nights = s.execute(
        select(Comparison.detail, Run.run_id)
        .join(Stage, (Stage.run_id == Comparison.run_id) & (Stage.stage_id == Comparison.stage_id))
        .join(Run, Run.run_id == Stage.run_id)
        .where(Stage.stage_key == base, Comparison.metric == alert.metric,
               Comparison.verdict == "regression",
               Run.started_at.between(first.started_at, last.started_at)))
    return any(alert_key(base, detail) == alert.stage_key
               and (judged_on is None or holds(s, run_id, judged_on))
               for detail, run_id in nights)


def _judged_since(s: Session, stage_key: str, metric: str, run_id: str,
                  judged_on: History | None) -> bool:
    """Whether an alert of stage_key+metric of tonight's history (`judged_on`, as
    `_open_of_history` tells it) last followed a night that started after run `run_id`:
    an earlier night's compare run again (a cleared DAG task, a new detector)."""
    started = s.get(Run, run_id).started_at
    later = s.scalars(select(Alert).join(Run, Alert.last_run_id == Run.run_id).where(
        Alert.stage_key == stage_key, Alert.metric == metric, Run.started_at > started))
    return any(_of_history(s, alert, judged_on) for alert in later)


def _of_history(s: Session, alert: Alert, judged_on: History | None) -> bool:
    """Whether `alert` was opened on a night of history `judged_on` (any, when None)."""
    return judged_on is None or holds(s, alert.first_run_id, judged_on)


def _check_run(s: Session, run_id: str) -> None:
    if s.get(Run, run_id) is None:
        raise StoreError(f"unknown run {run_id!r}")


def _open(s: Session, stage_key: str, metric: str, run_id: str, status: str,
          change_pct: float | None) -> tuple[int, bool]:
    # This run may already have opened an alert that a human closed since: keep it closed.
    done = s.scalars(select(Alert).where(
        Alert.stage_key == stage_key, Alert.metric == metric,
        Alert.first_run_id == run_id)).first()
    if done is not None:
        return done.id, False
    alert = Alert(stage_key=stage_key, metric=metric, status=status, first_run_id=run_id,
                  last_run_id=run_id, change_pct=finite(change_pct), delivered=False)
    s.add(alert)
    s.flush()
    return alert.id, True


def _update(alert: Alert, run_id: str, status: str,
            change_pct: float | None) -> tuple[int, bool]:
    change_pct = finite(change_pct)
    if alert.status == "acked" and status in _PIPELINE_OPEN:
        status = "acked"  # a human has seen it: the same regression again is no news
    elif alert.status == "confirmed" and status == "suspected":
        status = "confirmed"  # once confirmed, a weaker night does not downgrade it
    changed = status != alert.status or _grown(change_pct, alert.change_pct)
    alert.last_run_id = run_id
    if changed:
        alert.status, alert.change_pct, alert.delivered = status, change_pct, False
    return alert.id, changed


def _open_of_history(s: Session, stage_key: str, metric: str,
                     judged_on: History | None) -> Alert | None:
    """The newest open alert of stage_key+metric that tonight's history opened (see
    `follow_verdict`)."""
    for alert in s.scalars(_newest_first(stage_key, metric, open_only=True)):
        if _of_history(s, alert, judged_on):
            return alert
    return None


def get(s: Session, alert_id: int) -> dict[str, Any]:
    alert = s.get(Alert, alert_id)
    if alert is None:
        raise StoreError(f"unknown alert {alert_id}")
    return row_dict(alert, skip=())


def set_status(s: Session, alert_id: int, status: str) -> Alert:
    check("alerts.status", status)
    alert = s.get(Alert, alert_id)
    if alert is None:
        raise StoreError(f"unknown alert {alert_id}")
    if status in OPEN_ALERT_STATUSES and alert.status not in OPEN_ALERT_STATUSES:
        # an acked alert absorbs the pipeline's next regression of the stage and metric
        raise StoreError(f"alert {alert_id} is closed ({alert.status}): it cannot be set "
                         f"{status}; a regression seen again opens an alert of its own")
    alert.status = status
    return alert


def flagged_with(s: Session, alert_id: int) -> list[int]:
    """The other open alerts of the same metric that the run's stages flagged together with
    this one on its last run (`tasks.analysis.across`: one change of the broker, told on
    every stage it was seen on), on the same fingerprint; [] for an alert its own stage
    flagged."""
    alert = s.get(Alert, alert_id)
    if alert is None:
        raise StoreError(f"unknown alert {alert_id}")
    rows = s.execute(select(Stage.stage_key, Stage.fingerprint_hash, Comparison.detail)
                     .join(Comparison, (Comparison.run_id == Stage.run_id)
                           & (Comparison.stage_id == Stage.stage_id))
                     .where(Stage.run_id == alert.last_run_id,
                            Comparison.metric == alert.metric)).all()
    together = {alert_key(key, detail): fp for key, fp, detail in rows
                if flagged_across(detail or {})}
    if alert.stage_key not in together:
        return []
    fp = together[alert.stage_key]
    keys = [k for k, f in together.items() if f == fp and k != alert.stage_key]
    return list(s.scalars(select(Alert.id).where(
        Alert.stage_key.in_(keys), Alert.metric == alert.metric,
        Alert.last_run_id == alert.last_run_id,
        Alert.status.in_(OPEN_ALERT_STATUSES)).order_by(Alert.id)))


def listing(s: Session, *, open_only: bool = False, undelivered: bool = False) -> list[dict[str, Any]]:
    q = select(Alert).order_by(Alert.id)
    if open_only:
        q = q.where(Alert.status.in_(OPEN_ALERT_STATUSES))
    if undelivered:
        q = q.where(Alert.delivered.is_(False))
    return [row_dict(a, skip=()) for a in s.scalars(q)]


def mark_delivered(s: Session, alert_id: int, slack_ts: str | None) -> None:
    """Delivered; the first Slack ts is kept, so later nights reply in the same thread."""
    alert = s.get(Alert, alert_id)
    if alert is None:
        raise StoreError(f"unknown alert {alert_id}")
    alert.delivered = True
    alert.slack_ts = alert.slack_ts or slack_ts

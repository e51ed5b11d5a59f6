"""Read queries behind `Store.stages`, `Store.history` and the comparison's look-backs; they
take the caller's session."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tasks.fingerprint import measured_alike
from tasks.metrics import FLAGGED, NOT_JUDGED

from .alerts import alert_key
from .common import row_dict
from .histories import History, holds, reset_of
from .models import Alert, Baseline, Comparison, Metric, Run, Series, Stage

# A value flagged by its own night's comparison stays out of baselines (a regression never
# silently becomes the baseline) unless a human accepted it as the new normal or called it a
# false positive, or the next night cleared the suspicion. A comparison's detail "hold" says
# whether its value is held out (the detector holds every flagged value; a row without the
# key is held when its verdict is flagged).
RELEASED_ALERTS = ("accepted", "false_positive", "cleared")


def stages(s: Session, run_id: str) -> list[dict[str, Any]]:
    out = {st.stage_id: {**row_dict(st), "metrics": {}, "units": {}, "series": {},
                         "comparisons": []}
           for st in s.scalars(select(Stage).where(Stage.run_id == run_id).order_by(Stage.id))}
    for m in s.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.id)):
        out[m.stage_id]["metrics"][m.name] = m.value
        out[m.stage_id]["units"][m.name] = m.unit
    for sr in s.scalars(select(Series).where(Series.run_id == run_id).order_by(Series.id)):
        out[sr.stage_id]["series"][sr.name] = sr.values
    for c in s.scalars(select(Comparison).where(Comparison.run_id == run_id)
                       .order_by(Comparison.id)):
        out[c.stage_id]["comparisons"].append(row_dict(c, skip=("id", "run_id", "stage_id")))
    return list(out.values())


def reset_starts(s: Session, history: History, before: datetime) -> dict[str | None, datetime]:
    """When the history starts: for every metric (None) and for each metric a person
    accepted a change of, its newest reset marker's run's start (`histories.reset_label`),
    of the markers on nights before `before` (an accepted change does not reach back to
    the nights judged before it)."""
    markers = s.execute(select(Baseline.label, Baseline.run_id, Run.started_at)
                        .join(Run, Run.run_id == Baseline.run_id)
                        .where(Baseline.kind == "reset", Run.started_at < before,
                               Baseline.label.startswith(history.stage_key, autoescape=True)))
    starts: dict[str | None, datetime] = {}
    for m in markers:
        ours, metric = reset_of(m.label, history.stage_key, m.run_id)
        if ours and (m.label == history.stage_key or holds(s, m.run_id, history)):
            starts[metric] = max(starts.get(metric, m.started_at), m.started_at)
    return starts


def _comparable(stage_key: str, fingerprint_hash: str | None, before: datetime) -> Any:
    """Runs with a valid stage of this key (and fingerprint) that may feed a rolling baseline:
    finished ok, not excluded, not a release run (those are compared with their release
    baseline), started before `before`."""
    q = (select(Run.run_id, Run.started_at, Stage.stage_id, Stage.params)
         .join(Stage, Stage.run_id == Run.run_id)
         .where(Stage.stage_key == stage_key, Stage.validity == "valid", Run.status == "ok",
                Run.excluded.is_(False), Run.kind != "release", Run.started_at < before))
    if fingerprint_hash is not None:
        q = q.where(Stage.fingerprint_hash == fingerprint_hash)
    return q


def _held_out(s: Session, history: History, rows: list[Any]) -> dict[tuple[str, str], set[str]]:
    """(run_id, stage_id) -> metrics whose values stay out of the baseline: flagged, and
    not released by an alert of this history (`histories.holds`)."""
    flagged = [(c.run_id, c.stage_id, c.metric) for c in s.scalars(
        select(Comparison).where(Comparison.run_id.in_([r.run_id for r in rows]),
                                 Comparison.verdict.in_(FLAGGED)))
        if (c.detail or {}).get("hold", True)]
    if not flagged:
        return {}
    started = {r.run_id: r.started_at for r in rows}
    spans = _alert_spans(s, history.stage_key, history, RELEASED_ALERTS)
    out: dict[tuple[str, str], set[str]] = {}
    for run_id, stage_id, metric in flagged:
        when = started[run_id]
        if not any(lo <= when <= hi for lo, hi in spans.get(metric, [])):
            out.setdefault((run_id, stage_id), set()).add(metric)
    return out


def _with_unflagged(rows: list[Any], held: dict[tuple[str, str], set[str]],
                    limit: int) -> list[Any]:
    """The newest `rows` up to the `limit`-th whose values no flag holds out (all of them
    when fewer): a change flagged night after night (an acked regression) must not push
    the nights before it out of the window, or its own values would soon be all that is
    left, the metric learning again, its regressed level the baseline."""
    unflagged = 0
    for i, r in enumerate(rows):
        unflagged += not held.get((r.run_id, r.stage_id))
        if unflagged == limit:
            return rows[:i + 1]
    return rows


def history(s: Session, stage_key: str, fingerprint_hash: str | None, *, before: datetime,
            limit: int, setup: dict | None = None) -> list[dict[str, Any]]:
    """One entry per comparable run (a run is assumed to have one stage per stage key),
    the newest that measured `setup` when given (`measured_alike`), up to the `limit`-th
    of them none of whose values a flag holds out (`_with_unflagged`): its metrics, the
    metrics held out of baselines, its verdicts by metric and the stage's params."""
    q = _comparable(stage_key, fingerprint_hash, before)
    of = History(stage_key, fingerprint_hash, setup)
    starts = reset_starts(s, of, before)
    if None in starts:
        q = q.where(Run.started_at >= starts.pop(None))
    q = q.order_by(Run.started_at.desc(), Run.run_id.desc())
    if setup is None:
        def newest(n: int) -> list[Any]:
            return s.execute(q.limit(n)).all()
    else:  # the setup is Python's rule: read every night's params (one small row each)
        alike = [r for r in s.execute(q) if measured_alike(r.params, setup)]

        def newest(n: int) -> list[Any]:
            return alike[:n]
    fetched = limit
    while True:  # more nights only while flagged ones crowd the newest out
        rows = newest(fetched)
        held = _held_out(s, of, rows)
        kept = _with_unflagged(rows, held, limit)
        if len(kept) < len(rows) or len(rows) < fetched:
            rows = kept
            break
        fetched *= 2
    for r in rows:  # a metric's nights before its accepted change stay out of its baseline
        held.setdefault((r.run_id, r.stage_id), set()).update(
            metric for metric, start in starts.items() if r.started_at < start)
    found = {(r.run_id, r.stage_id): {"run_id": r.run_id, "started_at": r.started_at,
                                      "metrics": {}, "verdicts": {},
                                      "held_out": sorted(held.get((r.run_id, r.stage_id), ())),
                                      "params": r.params}
             for r in rows}
    run_ids = [r.run_id for r in rows]
    for m in s.scalars(_of_stage(Metric, stage_key, run_ids)):
        if (entry := found.get((m.run_id, m.stage_id))) is not None:
            entry["metrics"][m.name] = m.value
    for c in s.scalars(_of_stage(Comparison, stage_key, run_ids)):
        if (entry := found.get((c.run_id, c.stage_id))) is not None:
            # what that night was judged, for the report's history
            entry["verdicts"][c.metric] = row_dict(c, skip=("id", "run_id", "stage_id"))
    return list(found.values())


def _of_stage(model: type[Metric] | type[Comparison], stage_key: str, run_ids: list[str]) -> Any:
    """`model`'s rows of these runs' stages of this stage key only (a run has many stages)."""
    return (select(model).join(Stage, (Stage.run_id == model.run_id)
                               & (Stage.stage_id == model.stage_id))
            .where(Stage.stage_key == stage_key, model.run_id.in_(run_ids)))


def last_fingerprint(s: Session, stage_key: str, *, before: datetime) -> str | None:
    """The fingerprint hash of the newest earlier comparable run of this stage key, any
    fingerprint (to say when a changed fingerprint is why a history is empty)."""
    q = _comparable(stage_key, None, before).add_columns(Stage.fingerprint_hash)
    row = s.execute(q.order_by(Run.started_at.desc()).limit(1)).first()
    return None if row is None else row.fingerprint_hash


def previous_verdicts(s: Session, stage_key: str, fingerprint_hash: str | None, *,
                      before: datetime, baseline: str, setup: dict | None = None,
                      release_runs: bool = False, runs: int = 5) -> dict[str, dict[str, Any]]:
    """metric -> the newest earlier verdict of this stage key (and fingerprint, and setup:
    `measured_alike`) that a night can confirm or clear, of a run that ended ok and is not
    excluded (as `_comparable` asks of a baseline's nights), made against the same baseline
    ("rolling", "release:<label>"), looking back at most `runs` such runs that have
    verdicts; with that run's start and the stage's params that night. Against the rolling
    history, of release runs' only when `release_runs` (tonight is one) and of the others'
    only when not: a release run feeds no rolling history, though its trigger may have
    compared it with one (`histories.History.release_runs`)."""
    q = (select(Comparison, Run.run_id, Run.started_at, Run.kind, Stage.params,
                Stage.fingerprint_hash)
         .join(Stage, (Stage.run_id == Comparison.run_id)
               & (Stage.stage_id == Comparison.stage_id))
         .join(Run, Run.run_id == Stage.run_id)
         .where(Stage.stage_key == stage_key, Run.started_at < before,
                # a night that failed or was excluded is no evidence, as it is no baseline
                Run.status == "ok", Run.excluded.is_(False),
                Comparison.verdict.not_in(NOT_JUDGED)))
    if fingerprint_hash is not None:
        q = q.where(Stage.fingerprint_hash == fingerprint_hash)
    of = History(stage_key, fingerprint_hash, setup,
                 release_runs if baseline == "rolling" else None)
    out: dict[str, dict[str, Any]] = {}
    seen_runs: list[str] = []
    # the flagged nights of an alert a person called a false positive or accepted as the
    # new normal are no evidence of a change since: tonight's own bad night is its first
    decided = _alert_spans(s, stage_key if baseline == "rolling" else
                           alert_key(stage_key, {"baseline": baseline}), of,
                           ("false_positive", "accepted"))
    # in batches, newest first: the loop stops after `runs` runs, and a year of nightly
    # verdicts read whole took 4 s a night for 40 stages
    rows = s.execute(q.order_by(Run.started_at.desc(), Comparison.id)
                     .execution_options(yield_per=256))
    for comp, run_id, started_at, kind, params, fp in rows:
        if not of.admits(fp, params, kind) \
                or (comp.detail or {}).get("baseline", "rolling") != baseline:
            continue  # runs judged against another baseline are not counted either
        if comp.verdict in FLAGGED and any(lo <= started_at <= hi
                                           for lo, hi in decided.get(comp.metric, ())):
            continue  # a person said what this night was: no evidence for tonight's
        if run_id not in seen_runs:
            if len(seen_runs) == runs:
                rows.close()  # the rest is never read
                break
            seen_runs.append(run_id)
        if comp.metric not in out:
            out[comp.metric] = {"run_id": run_id, "verdict": comp.verdict,
                                "change_pct": comp.change_pct, "detail": comp.detail,
                                "started_at": started_at, "params": params}
    return out


def _alert_spans(s: Session, key: str, history: History, statuses: tuple[str, ...]
                 ) -> dict[str, list[tuple[datetime, datetime]]]:
    """metric -> (first, last) night of each alert of lifecycle `key` with one of
    `statuses` that this history opened (`histories.holds`)."""
    spans: dict[str, list[tuple[datetime, datetime]]] = {}
    for alert in s.scalars(select(Alert).where(Alert.stage_key == key,
                                               Alert.status.in_(statuses))):
        if holds(s, alert.first_run_id, history):
            first, last = s.get(Run, alert.first_run_id), s.get(Run, alert.last_run_id)
            spans.setdefault(alert.metric, []).append((first.started_at, last.started_at))
    return spans


def release_baseline_at(s: Session, when: datetime, broker_kind: str) -> tuple[str, str] | None:
    """(label, run_id) of the release baseline of this broker kind pinned most recently at
    `when` (another broker's stages share none of its stage keys)."""
    row = s.execute(select(Baseline.label, Baseline.run_id)
                    .where(Baseline.kind == "release", Baseline.created_at <= when,
                           Baseline.broker_kind == broker_kind)
                    .order_by(Baseline.created_at.desc(), Baseline.id.desc()).limit(1)).first()
    return None if row is None else (row.label, row.run_id)


def full_history(s: Session, stage_key: str, fingerprint_hash: str | None, *,
                 before: datetime) -> list[dict[str, Any]]:
    """Every comparable earlier run of this stage key (and fingerprint), oldest first, with
    its metrics and params: no window, no reset marker, no value held out. For tools that
    look for change points themselves (Otava): an accepted change or a regression is what
    they must see."""
    q = _comparable(stage_key, fingerprint_hash, before).add_columns(Run.kind,
                                                                     Run.broker_version)
    rows = s.execute(q.order_by(Run.started_at, Run.run_id)).all()
    found = {(r.run_id, r.stage_id): {"run_id": r.run_id, "started_at": r.started_at,
                                      "kind": r.kind, "broker_version": r.broker_version,
                                      "metrics": {}, "params": r.params} for r in rows}
    for m in s.scalars(_of_stage(Metric, stage_key, [r.run_id for r in rows])):
        if (entry := found.get((m.run_id, m.stage_id))) is not None:
            entry["metrics"][m.name] = m.value
    return list(found.values())

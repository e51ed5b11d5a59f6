"""Read queries behind `Store.stages` and `Store.history`; they take the caller's session."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .common import row_dict
from .models import Baseline, Comparison, Metric, Run, Series, Stage


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


def reset_start(s: Session, stage_key: str) -> datetime | None:
    """When the stage key's history starts (its reset marker run's start), if it has one."""
    return s.scalar(select(Run.started_at).join(Baseline, Baseline.run_id == Run.run_id)
                    .where(Baseline.kind == "reset", Baseline.label == stage_key))


def history(s: Session, stage_key: str, fingerprint_hash: str | None, *, before: datetime,
            limit: int) -> list[dict[str, Any]]:
    """One entry per comparable run (a run is assumed to have one stage per stage key)."""
    q = (select(Run.run_id, Run.started_at, Stage.stage_id)
         .join(Stage, Stage.run_id == Run.run_id)
         .where(Stage.stage_key == stage_key, Stage.validity == "valid",
                Run.status == "ok", Run.excluded.is_(False), Run.started_at < before))
    if fingerprint_hash is not None:
        q = q.where(Stage.fingerprint_hash == fingerprint_hash)
    start = reset_start(s, stage_key)
    if start is not None:
        q = q.where(Run.started_at >= start)
    rows = s.execute(q.order_by(Run.started_at.desc(), Run.run_id.desc()).limit(limit)).all()
    found = {(r.run_id, r.stage_id): {"run_id": r.run_id, "started_at": r.started_at,
                                      "metrics": {}, "series": {}} for r in rows}
    run_ids = [r.run_id for r in rows]
    for model, field, attr in ((Metric, "metrics", "value"), (Series, "series", "values")):
        for row in s.scalars(select(model).where(model.run_id.in_(run_ids))):
            entry = found.get((row.run_id, row.stage_id))
            if entry is not None:
                entry[field][row.name] = getattr(row, attr)
    return list(found.values())

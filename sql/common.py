"""Helpers shared by the store modules: the error type, enum checks, portable upserts."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from .models import ALLOWED, Base, Baseline, utcnow


class StoreError(Exception):
    """A results-store call that cannot be honoured. Messages never carry the DB password."""


class StoreUnavailable(StoreError):
    """The database could not be reached, or stayed locked, for as long as it was waited for."""


def check(field: str, value: str, allowed: tuple[str, ...] | None = None) -> str:
    """`value` if it is one of the allowed values of `field` ("table.column"), else StoreError."""
    allowed = allowed or ALLOWED[field]
    if value not in allowed:
        raise StoreError(f"{field} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def finite(value: float | None) -> float | None:
    """None for None, NaN and infinities: PostgreSQL JSON rejects them, SQLite turns NaN into
    NULL anyway, so every backend stores "no number" the same way."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def sample(value: float | int | None) -> float | int | None:
    """A series value as stored: integers stay integers (e.g. Unix seconds), other numbers
    go through `finite`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return finite(value)


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None, recursively."""
    if isinstance(obj, float):
        return finite(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def upsert(session: Session, model: type[Base], values: dict[str, Any], keys: tuple[str, ...],
           *, keep: tuple[str, ...] = (), keep_if_none: tuple[str, ...] = ()) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE every other value, except the `keep` columns
    and the `keep_if_none` ones whose new value is None."""
    ins = _INSERTS[session.get_bind().dialect.name](model).values(**values)
    set_ = {k: func.coalesce(ins.excluded[k], getattr(model, k)) if k in keep_if_none
            else ins.excluded[k] for k in values if k not in keys and k not in keep}
    session.execute(ins.on_conflict_do_update(index_elements=list(keys), set_=set_))


def upsert_baseline(session: Session, kind: str, label: str, run_id: str,
                    broker_kind: str = "") -> None:
    """A reset marker, or a release pin (`broker_kind`: its run's; a label is pinned once
    per broker kind). The same run pinned again keeps its pin's time: a release run
    started since resolves its baseline by that time, and would lose it."""
    check("baselines.kind", kind)
    same = session.scalar(select(Baseline.run_id).where(
        Baseline.kind == kind, Baseline.broker_kind == broker_kind, Baseline.label == label))
    if same == run_id:
        return
    upsert(session, Baseline, {"kind": kind, "broker_kind": broker_kind, "label": label,
                               "run_id": run_id, "created_at": utcnow()},
           ("kind", "broker_kind", "label"))


def row_dict(row: Base, *, skip: tuple[str, ...] = ("id",)) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in row.__table__.columns if c.key not in skip}

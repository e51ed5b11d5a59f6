"""Which nights are one history of a stage: the same stage key, host fingerprint and setup
(`tasks.fingerprint.measured_alike`), and the runs that feed the rolling history apart from
release runs judged against it. Histories of one stage key are kept side by side; what
belongs to one (an alert it opened, an accepted change, a flagged value a person released)
does not reach the others. Takes the caller's session."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from tasks.fingerprint import measured_alike

from .models import Run, Stage


class History(NamedTuple):
    """A stage's history: its key, host fingerprint (None: any) and recorded params (the
    setup; None: any), and whether it is the release runs' judged against the rolling
    history (True), the rolling history's own runs' (False) or either (None: a history of
    comparisons with a pinned release, whose runs may be of any kind)."""
    stage_key: str
    fingerprint_hash: str | None
    setup: dict | None
    release_runs: bool | None = False

    def admits(self, fingerprint_hash: str | None, params: dict | None, kind: str) -> bool:
        """Whether a night of this stage key, with that fingerprint, recorded params and
        run kind, is a night of this history."""
        return (self.fingerprint_hash in (None, fingerprint_hash)
                and (self.setup is None or measured_alike(params, self.setup))
                and self.release_runs in (None, kind == "release"))


def reset_label(stage_key: str, run_id: str, metric: str | None = None) -> str:
    """A reset marker's label (baselines kind 'reset'): the history of `stage_key` that
    `run_id` is a night of starts there, for `metric` alone when given (a person accepted
    that metric's change) or for every metric (`Store.reset_history`). A marker
    labelled with the stage key alone (written before histories were kept apart) starts
    every one of them."""
    return f"{stage_key}@{run_id}" + (f"#{metric}" if metric else "")


def reset_of(label: str, stage_key: str, run_id: str) -> tuple[bool, str | None]:
    """Whether a reset marker of `run_id` is one of `stage_key`'s (`reset_label`), and the
    metric it starts anew (None: every metric)."""
    whole = reset_label(stage_key, run_id)
    if label in (stage_key, whole):
        return True, None
    if label.startswith(whole + "#"):
        return True, label[len(whole) + 1:]
    return False, None


def holds(s: Session, run_id: str, history: History) -> bool:
    """Whether the run's stage of the history's key is a night of it."""
    row = s.execute(select(Stage.fingerprint_hash, Stage.params, Run.kind)
                    .join(Run, Run.run_id == Stage.run_id)
                    .where(Stage.run_id == run_id, Stage.stage_key == history.stage_key)
                    .limit(1)).first()
    if row is None:
        return history.fingerprint_hash is None and history.setup is None
    return history.admits(row.fingerprint_hash, row.params, row.kind)

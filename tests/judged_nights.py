"""Nights written to a real SQLite store and judged as the pipeline judges them, the compare
step then the alert step: the scaffolding under the detector's tests (`test_detector.Lab`,
one stage) and the test across stages' (`test_across.Suite`, four), which say what a night
records."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sql import Store
from tasks.run_context import RunContext
from tasks.settings import Settings
from tasks.steps import execute

START = datetime.now(timezone.utc) - timedelta(days=60)  # night 1 starts a day after it


class JudgedNights:
    """A store under `state` (migrated) and the nights run on it, one a day."""

    def __init__(self, state: Path, seed: int) -> None:
        self.settings = Settings(state_dir=state)
        self.store = Store(self.settings.database_url())
        self.store.migrate()
        self.rng = random.Random(seed)
        self.day = 0

    def open_run(self, kind: str = "nightly", started: datetime | None = None) -> str:
        """The next night's run (`<kind>-<day>`), created in the store with its folder."""
        self.day += 1
        run_id = f"{kind}-{self.day:02d}"
        run_dir = self.settings.run_dir(run_id)
        run_dir.mkdir(parents=True)
        self.store.create_run(run_id, kind=kind, suite="smoke", broker_kind="mosquitto",
                              artifact_dir=str(run_dir),
                              started_at=started or START + timedelta(days=self.day))
        return run_id

    def judge(self, run_id: str, plan: dict | None = None) -> tuple[dict, dict]:
        """The compare and alert steps on the run's recorded stages, then the run finished:
        what each step returned."""
        ctx = RunContext(self.settings, run_id, self.settings.run_dir(run_id), plan or {})
        counts = execute("compare", ctx)
        told = execute("alert", ctx)
        self.store.finish_run(run_id, "ok")
        return counts, told

    def message(self, run_id: str) -> dict:
        """What the alert step sent Slack for the run."""
        return json.loads((self.settings.run_dir(run_id) / "slack_message.json").read_text())

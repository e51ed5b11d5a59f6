"""make test's workers: a test marked `alone` runs with no other test beside it, and one
waiting for its turn is not overtaken by tests that start after it (tests/parallel.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.parallel import _turn


def _enter(folder: Path, name: str, exclusive: bool, hold_s: float, log: list) -> threading.Thread:
    def run() -> None:
        with _turn(folder, exclusive):
            log.append(f"{name} in")
            time.sleep(hold_s)
            log.append(f"{name} out")
    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.alone
def test_an_alone_test_waits_for_the_running_ones_and_runs_before_later_ones(tmp_path: Path):
    log: list[str] = []
    first = _enter(tmp_path, "shared1", False, 0.6, log)
    time.sleep(0.1)
    second = _enter(tmp_path, "shared2", False, 0.6, log)  # two shared tests at once
    time.sleep(0.1)
    alone = _enter(tmp_path, "alone", True, 0.3, log)
    time.sleep(0.1)
    later = _enter(tmp_path, "shared3", False, 0.1, log)  # starts while alone waits
    for thread in (first, second, alone, later):
        thread.join(10)
    assert log[:2] == ["shared1 in", "shared2 in"]
    assert log.index("alone in") > max(log.index("shared1 out"), log.index("shared2 out"))
    assert log.index("alone out") + 1 == log.index("shared3 in"), log

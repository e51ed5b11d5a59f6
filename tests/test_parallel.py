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


def test_the_tests_of_one_xdist_group_run_on_one_worker(pytester: pytest.Pytester):
    """What keeps the lab's tests on one worker: pytest-xdist's loadgroup, which a pytest
    that keeps node IDs structured silently breaks (pyproject.toml's pin)."""
    group = "import pytest\npytestmark = pytest.mark.xdist_group('g')\n"
    pytester.makepyfile(test_grouped=group + "def test_a(): pass\ndef test_b(): pass\n",
                        test_grouped_too=group + "def test_c(): pass\n",
                        test_free="import pytest\n@pytest.mark.parametrize('i', range(6))\n"
                                  "def test_free(i): pass\n")
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-v",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    grouped = [line.split()[0] for line in result.outlines
               if "PASSED" in line and "test_grouped" in line]
    assert len(grouped) == 3 and len(set(grouped)) == 1, result.outlines

"""Two tests at a time, except the ones that measure.

`make test` runs the suite on two pytest-xdist workers: most tests spend their time waiting
(a stage's window, an SSH round trip, a broker's start), so two of them overlap well on two
cores. A test marked `alone` asserts on timing, rates, CPU cost or a stage's validity,
which a busy neighbour would move; it runs with no other test beside it, its fixtures'
setup and teardown included. Tests that share state (the lab, the tests' Airflow metadata
DB) are pinned to one worker with `xdist_group` instead (`--dist loadgroup`).

The rule is a readers-writer lock over two files shared by the run's workers: every test
takes the room shared, an `alone` test takes it exclusive; both pass a gate first, which an
`alone` test holds while it waits, so the other worker cannot keep the room by starting
test after test. Without workers (a plain `pytest`), tests run one at a time anyway and no
lock is taken.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MARK = "alone"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}: asserts on timing, rates, CPU cost or a stage's validity; runs "
                   "with no other test beside it under make test's workers (tests/parallel.py)")


def _lock_dir(config: pytest.Config) -> Path | None:
    """The run's lock files' folder, shared by its workers only (None outside xdist): in
    the run's base temporary folder, which holds each worker's own and which pytest removes
    with the old runs' folders."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return Path(config.option.basetemp).parent / "parallel-locks"


@contextmanager
def _turn(folder: Path, exclusive: bool) -> Iterator[None]:
    folder.mkdir(exist_ok=True)
    with open(folder / "gate", "a") as gate, open(folder / "room", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `--dist loadgroup`, xdist tells the scheduler a test's group by appending it to
    the test's ID; where that does not take, groups split silently (two workers bringing
    the lab up at once, say): fail such a test, saying why."""
    config = item.config
    if (_lock_dir(config) and getattr(config.option, "loadgroup", False)
            and item.get_closest_marker("xdist_group") and "@" not in item.nodeid):
        pytest.fail("xdist_group did not take under this pytest: its tests may run on both "
                    "workers (see pytest-dev/pytest-xdist#1386 and pyproject.toml's pytest "
                    "pin)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    folder = _lock_dir(item.config)
    if folder is None:
        return (yield)
    exclusive = item.get_closest_marker(MARK) is not None
    with _turn(folder, exclusive):
        began = time.time()
        try:
            return (yield)
        finally:
            _journal(folder, began, exclusive, item.nodeid)


def _journal(folder: Path, began: float, exclusive: bool, nodeid: str) -> None:
    """One line per test in the run's journal (start, end, worker, alone or not, test): which
    tests ran beside which, when a result needs explaining."""
    line = (f"{began:.3f} {time.time():.3f} {os.environ['PYTEST_XDIST_WORKER']} "
            f"{MARK if exclusive else 'shared'} {nodeid}\n")
    with open(folder / "journal", "a") as journal:
        journal.write(line)


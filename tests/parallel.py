"""Two tests at a time, except while one measures.

`make test` runs the suite on two pytest-xdist workers: most tests spend their time waiting
(a stage's window, an SSH round trip, a broker's start), so two of them overlap well on two
cores. A test marked `alone` asserts on timing, rates, CPU cost or a stage's validity,
which a busy neighbour would move: its call (the test function) runs with no other test
beside it. Its fixtures' setup and teardown measure nothing (they start and stop brokers,
Airflow, a RabbitMQ node), so they run beside the other worker's tests; but only one
`alone` test at a time is anywhere between its setup and its teardown, so no other one's
fixtures (a busy process, a scheduler) run while it measures. Tests that share state (the
lab, the tests' Airflow metadata DB) are pinned to one worker with `xdist_group` instead
(`--dist loadgroup`).

The rule is a readers-writer lock over files shared by the run's workers: an unmarked test
takes the room shared for its whole run; an `alone` test first takes its own lock (one
`alone` test at a time), then the room shared for its setup, exclusive for its call and
shared again for its teardown. Each turn at the room passes a gate first, which a test
waiting for the room exclusive holds, so the other worker cannot keep the room by starting
test after test. Without workers (a plain `pytest`), tests run one at a time anyway and no
lock is taken. Under workers the `alone` tests are collected after the others, and
`make test` hands the tests and groups out in that order (pytest-xdist's
`--no-loadscope-reorder`: by default it sends the largest groups first, `alone` tests or
not), so they seldom wait for a running one. An `alone` test's fixtures must outlive such
a wait.
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
        "markers", f"{MARK}: asserts on timing, rates, CPU cost or a stage's validity; its call "
                   "runs with no other test beside it under make test's workers "
                   "(tests/parallel.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under workers, the unmarked tests first, the `alone` ones after them (a stable sort,
    the same on every worker, which xdist requires; a group's tests stay in one unit, sent
    where its first test falls). An `alone` call among the others waits for the other
    worker's running test with its own worker idle (114 s of 1087 in a clean clone's run
    at 27c7160); after them, one `alone` test follows another, and waiting costs nothing
    the other worker could have done."""
    if _lock_dir(config) is not None:
        items.sort(key=_is_alone)


def _lock_dir(config: pytest.Config) -> Path | None:
    """The run's lock files' folder, shared by its workers only (None outside xdist): in
    the run's base temporary folder, which holds each worker's own and which pytest removes
    with the old runs' folders."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return Path(config.option.basetemp).parent / "parallel-locks"


@contextmanager
def _turn(folder: Path, exclusive: bool) -> Iterator[None]:
    """A turn at the room: shared, or exclusive (no other turn at once)."""
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


@contextmanager
def _one_alone(folder: Path) -> Iterator[None]:
    """One `alone` test at a time between its setup and its teardown. Taken before any turn
    at the room and never while holding one, so the two locks cannot deadlock."""
    folder.mkdir(exist_ok=True)
    with open(folder / "alone", "a") as alone:
        fcntl.flock(alone, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(alone, fcntl.LOCK_UN)


def _is_alone(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARK) is not None


@contextmanager
def _journaled(folder: Path, exclusive: bool, phase: str, nodeid: str) -> Iterator[None]:
    """A turn at the room, and one line for it in the run's journal (start, end, worker,
    alone or shared, phase, test): which tests ran beside which, when a result needs
    explaining. An unmarked test's phase is `test` (one turn for all of it)."""
    with _turn(folder, exclusive):
        began = time.time()
        try:
            yield
        finally:
            line = (f"{began:.3f} {time.time():.3f} {os.environ['PYTEST_XDIST_WORKER']} "
                    f"{MARK if exclusive else 'shared'} {phase} {nodeid}\n")
            with open(folder / "journal", "a") as journal:
                journal.write(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    folder = _lock_dir(item.config)
    if folder is None:
        return (yield)
    if _is_alone(item):
        with _one_alone(folder):  # its phases take their turns below
            return (yield)
    with _journaled(folder, False, "test", item.nodeid):
        return (yield)


def _phase(item: pytest.Item, phase: str):
    """An `alone` test's phase, in its turn: exclusive for the call, shared otherwise."""
    folder = _lock_dir(item.config)
    if folder is None or not _is_alone(item):
        return (yield)
    with _journaled(folder, phase == "call", phase, item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """Under `--dist loadgroup`, xdist tells the scheduler a test's group by appending it to
    the test's ID; where that does not take, groups split silently (two workers bringing
    the lab up at once, say): fail such a test, saying why."""
    config = item.config
    if (_lock_dir(config) and getattr(config.option, "loadgroup", False)
            and item.get_closest_marker("xdist_group") and "@" not in item.nodeid):
        pytest.fail("xdist_group did not take under this pytest: its tests may run on both "
                    "workers (see pytest-dev/pytest-xdist#1386 and pyproject.toml's pytest "
                    "pin)", pytrace=False)
    return (yield from _phase(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _phase(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    return (yield from _phase(item, "teardown"))

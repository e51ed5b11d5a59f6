"""make test's workers: a test marked `alone` measures with no other test beside it, one
waiting for its turn is not overtaken by tests that start after it, and its fixtures'
setup runs beside the other worker's tests (tests/parallel.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.parallel import _turn

REPO = Path(__file__).resolve().parent.parent


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


MEETING = """
import pathlib, time, pytest

HERE = pathlib.Path(__file__).parent


def wait_for(name):
    deadline = time.time() + 10
    while not (HERE / name).exists():
        if time.time() > deadline:
            return False
        time.sleep(0.02)
    return True
"""
ALONE = MEETING + """

@pytest.fixture
def meets_a_neighbour():
    (HERE / "setup-began").touch()
    assert wait_for("neighbour-ran"), "no test ran beside this alone test's setup"
    yield
    time.sleep(1.0)  # longer than test_later: without the alone lock, test_alone_too's
    # setup would run beside it


@pytest.mark.alone
@pytest.mark.xdist_group("a")
def test_measures(meets_a_neighbour):
    time.sleep(0.5)
"""
NEIGHBOURS = MEETING + """
pytestmark = pytest.mark.xdist_group("n")


def test_neighbour():
    assert wait_for("setup-began"), "the alone test's setup never began"
    (HERE / "neighbour-ran").touch()
    time.sleep(0.3)


@pytest.fixture
def slow_fixture():
    time.sleep(0.5)
    yield
    time.sleep(0.2)


@pytest.mark.alone
def test_alone_too(slow_fixture):
    time.sleep(0.3)


def test_later():
    time.sleep(0.3)
"""


def test_an_alone_tests_setup_runs_beside_others_and_its_call_beside_none(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """The other worker's test runs while an `alone` test's fixture waits for it (it would
    wait in vain if the whole test ran alone); no test runs beside an `alone` call, and a
    second `alone` test's fixtures run only once the first one's teardown is over."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(test_alone=ALONE, test_neighbours=NEIGHBOURS)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p",
                                           "tests.parallel", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    journal = [line.split() for line in
               next(pytester.path.glob("runpytest-*/parallel-locks/journal")).read_text()
               .splitlines()]
    turns = [(float(start), float(end), mode, phase, test.split("@")[0].split("::")[1])
             for start, end, _, mode, phase, test in journal]
    assert sorted((t[4], t[3]) for t in turns) == sorted(
        [("test_neighbour", "test"), ("test_later", "test")]
        + [(name, phase) for name in ("test_measures", "test_alone_too")
           for phase in ("setup", "call", "teardown")])

    def overlap(a, b) -> bool:
        return a[0] < b[1] and b[0] < a[1]

    for call in (t for t in turns if t[2] == "alone"):
        assert call[3] == "call"
        assert not [t for t in turns if t is not call and overlap(call, t)], turns
    spans = {name: (min(t[0] for t in turns if t[4] == name),
                    max(t[1] for t in turns if t[4] == name))
             for name in ("test_measures", "test_alone_too")}
    assert not overlap(*spans.values()), spans


def test_under_workers_the_alone_tests_are_collected_after_the_others(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this test's own worker's
    pytester.makepyfile(test_order="import pytest\n"
                        "@pytest.mark.alone\ndef test_a1(): pass\n"
                        "def test_s1(): pass\n"
                        "@pytest.mark.alone\ndef test_a2(): pass\n"
                        "def test_s2(): pass\n")

    def order() -> list[str]:
        result = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "tests.parallel")
        return [line.split("::")[1] for line in result.outlines if "::" in line]
    assert order() == ["test_a1", "test_s1", "test_a2", "test_s2"]  # one at a time: as written
    pytester.makeconftest("import os\nos.environ['PYTEST_XDIST_WORKER'] = 'gw0'\n")  # a worker
    assert order() == ["test_s1", "test_s2", "test_a1", "test_a2"]

"""The results database down or locked, for real: a PostgreSQL server stopped (`pg_ctl
stop`) before or during a run, a SQLite file held by another writer. The run waits for it
within PERFPIPE_DB_RETRY_S, then fails in one line naming the database; it leaves no run
folder without a run, stores nothing twice, and its status can be stored once it is back."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.pg import PostgresUnavailable, Server, create_database, start_server
from tests.sqlite_lock import locked_by_another_process

INVENTORY = ("hosts: [{name: localhost, transport: local, roles: [broker, driver]}]\n"
             "broker: {kind: mosquitto, host: localhost, address: 127.0.0.1}\n")


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    """A PostgreSQL server of this module's own (its tests take it down)."""
    try:
        server = start_server(tmp_path_factory.mktemp("pg"))
    except PostgresUnavailable as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()


@pytest.fixture
def pg(pg_server: Server, perfpipe_env: Path, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The module's server, up, with a new empty database in use."""
    if not pg_server.running:
        pg_server.up()
    monkeypatch.setenv("PERFPIPE_DB_URL", create_database(pg_server.url, f"t_{uuid.uuid4().hex[:12]}"))
    return pg_server


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_a_database_down_before_the_run_fails_in_one_line_and_leaves_no_run_folder(
        pg: Server, tiny_suite: Path, tmp_path: Path, monkeypatch):
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    monkeypatch.setenv("PERFPIPE_DB_RETRY_S", "3")
    pg.down()
    started = time.monotonic()
    done = _cli("run", "--suite", "tiny", "--inventory", str(tmp_path / "inventory.yml"))
    took = time.monotonic() - started
    assert done.returncode == 4, done.stderr
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert line.startswith("perfpipe: database postgresql+psycopg://perfpipe:***@127.0.0.1:")
    assert "unreachable" in line and "PERFPIPE_DB_RETRY_S" in line, line
    assert 3 <= took <= 30, took  # tried for the 3 s asked, not the default minute
    runs = tiny_suite / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # no folder without a run


@pytest.mark.parametrize("name, value, why", [
    ("PERFPIPE_DB_RETRY_S", "nan", "finite number"), ("PERFPIPE_DB_RETRY_S", "inf", "finite number"),
    ("PERFPIPE_DB_RETRY_S", "-1", "greater than or equal to 0"),
    # the watchdog's age: inf crashed (OverflowError), -1 alerted of "the last -1 h"
    ("PERFPIPE_NIGHTLY_MAX_AGE_H", "inf", "finite number"),
    ("PERFPIPE_NIGHTLY_MAX_AGE_H", "-1", "greater than 0"),
    ("PERFPIPE_LAB_WAIT_S", "nan", "finite number")])  # waited on the lab for ever
def test_a_time_setting_that_is_no_number_of_seconds_is_refused_naming_it(
        perfpipe_env: Path, monkeypatch, name: str, value: str, why: str):
    """nan would never reach the window's end (every comparison with it is false): the
    store would try again every 8 s without end."""
    monkeypatch.setenv(name, value)
    done = _cli("check-nightly") if "NIGHTLY" in name else _cli("show", "nightly-none")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"{name}={value!r}: " in done.stderr and why in done.stderr, done.stderr


@pytest.mark.alone
@pytest.mark.slow  # about 35 s
def test_a_database_outage_mid_run_is_waited_out_and_nothing_is_stored_twice(
        pg: Server, tiny_suite: Path, tmp_path: Path, monkeypatch, caplog, spark_connect):
    """Two outages in one run: a short one when the metrics are about to be loaded (waited
    out: the run goes on), a long one from the report step on (the step fails in one line,
    teardown says the status is not stored and how to store it; once the database is back,
    that command closes the run `failed`)."""
    from tasks.pipeline import run_pipeline
    from tasks.settings import load_settings
    from tasks.steps import run_step

    monkeypatch.setenv("PERFPIPE_DB_RETRY_S", "5")  # the short outage (3 s), the server back up
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    caplog.set_level(logging.WARNING, logger="sql.store")
    lines: list[str] = []
    back: list[threading.Thread] = []

    def say(line: str) -> None:
        lines.append(line)
        if line.startswith("aggregate:"):  # load_metrics is next: a 3 s outage
            pg.down()
            back.append(threading.Thread(target=lambda: (time.sleep(3), pg.up())))
            back[-1].start()
        elif line.startswith("compare:"):  # report is next: down for good
            back[-1].join()
            pg.down()

    outcome = run_pipeline(load_settings(), suite="tiny", inventory=tmp_path / "inventory.yml",
                           say=say)
    waits = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert waits, "the database was never seen down"
    (failed,) = [line for line in lines if line.startswith("FAILED")]
    assert "StoreUnavailable: database postgresql+psycopg://perfpipe:***@" in failed
    assert "unreachable" in failed and "tried" in failed, failed
    (unstored,) = [line for line in lines if "is not stored" in line]
    assert f"perfpipe step teardown {outcome.run_id}" in unstored, unstored
    assert outcome.status == "failed" and outcome.stored is False

    pg.up()
    closed = run_step("teardown", outcome.run_id)
    assert closed["stored"] and closed["status"] == "failed"
    engine = create_engine(load_settings().database_url())
    with engine.connect() as conn:
        status, reason = conn.execute(text("SELECT status, excluded_reason FROM runs WHERE "
                                           "run_id = :r"), {"r": outcome.run_id}).one()
        metrics = conn.execute(text("SELECT count(*) FROM metrics WHERE run_id = :r"),
                               {"r": outcome.run_id}).scalar_one()
        runs = conn.execute(text("SELECT count(*) FROM runs")).scalar_one()
    engine.dispose()
    assert status == "failed" and "report, alert did not finish" in reason, reason
    assert metrics > 0, "the metrics loaded after the first outage are stored"
    assert runs == 1  # the run waited for its database: it was never planned twice


def test_a_sqlite_file_locked_by_another_writer_is_waited_for_then_one_line(
        perfpipe_env: Path, monkeypatch):
    """Another process holds the results file (BEGIN EXCLUSIVE): a wait shorter than
    PERFPIPE_DB_RETRY_S is waited out, a longer one fails in one line saying so."""
    from tasks.settings import load_settings

    monkeypatch.setenv("PERFPIPE_DB_RETRY_S", "4")
    load_settings().store().migrate()
    database = make_url(load_settings().database_url()).database
    for hold_s, ok in ((1.5, True), (30, False)):
        with locked_by_another_process(database, hold_s):
            done = _cli("alerts", "list")
        if ok:
            assert done.returncode == 0, done.stderr
        else:
            assert done.returncode == 4 and "Traceback" not in done.stderr
            assert done.stderr.strip().splitlines() == [(
                f"perfpipe: database error on sqlite:///{database}: database is locked "
                "(waited 4 s; PERFPIPE_DB_RETRY_S sets how long)")]

"""`perfpipe nightly` when no run can be planned: one line saying why, never a trace or
what the results store lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.cli import main


def test_a_suite_that_does_not_exist_is_one_line_before_airflow_starts(perfpipe_env: Path,
                                                                       capsys) -> None:
    assert main(["nightly", "--suite", "bogus"]) == 2
    out, err = capsys.readouterr()
    suites = Path("scenarios/suites.yml").resolve()
    assert err.splitlines() == [(f"perfpipe: {suites}: suites: no suite 'bogus'; "
                                 "known: ['capacity', 'nightly', 'rated', 'release', 'smoke']")]
    assert out == "" and not perfpipe_env.exists()  # nothing started, nothing written


def test_an_inventory_no_run_can_use_is_one_line_too(perfpipe_env: Path, tmp_path: Path,
                                                     monkeypatch, capsys) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("hosts: [{name: localhost, transport: local, roles: [driver]}]\n")
    monkeypatch.setenv("PERFPIPE_INVENTORY", str(inventory))
    assert main(["nightly"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"perfpipe: {inventory}") and "broker" in line, line


@pytest.mark.slow  # a nightly DAG run whose plan task fails: about 15 s
def test_a_plan_that_fails_under_airflow_is_said_in_one_line(perfpipe_env: Path, monkeypatch,
                                                             capsys) -> None:
    """The database is unreachable when the DAG's plan task runs: the command says the
    plan task's own error (the password masked), not the store's missing tables."""
    monkeypatch.setenv("PERFPIPE_DB_URL", "postgresql+psycopg://u:secretpw@127.0.0.1:1/db")
    monkeypatch.setenv("PERFPIPE_DB_RETRY_S", "1")
    assert main(["nightly"]) == 1
    out, err = capsys.readouterr()
    last = err.splitlines()[-1]
    assert last.startswith("perfpipe: perfpipe mqtt_perf_nightly: plan failed: database "
                           "postgresql+psycopg://u:***@127.0.0.1:1/db unreachable"), last
    assert last.endswith(": failed)") and "secretpw" not in out + err

"""`perfpipe nightly` when no run can be planned: one line saying why, never a trace or
what the results store lacks; and the help of every command."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tasks.cli import main, parser
from tasks.views.summary import run_summary, short_summary
from tasks.views.tables import metrics_rows, verdict_rows


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


def test_an_airflow_home_without_the_dags_is_one_line_too(perfpipe_env: Path, tmp_path: Path,
                                                          monkeypatch, capsys) -> None:
    """dag.test() runs the DAG as the home's bundles have it: another dags folder ended in
    "the dag is not serialized" after Airflow started; a folder linking dags/ will do."""
    from tasks.airflow_glue.dag_test import DAGS_DIR, dags_folder_problem

    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(tmp_path / "their_dags"))
    (tmp_path / "their_dags").mkdir()
    assert main(["nightly"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"perfpipe: Airflow's dags folder {tmp_path / 'their_dags'} does not hold "
                    f"{DAGS_DIR / 'mqtt_perf_nightly.py'}, so dag.test() cannot run "
                    f"mqtt_perf_nightly: set AIRFLOW__CORE__DAGS_FOLDER={DAGS_DIR} (as `make "
                    f"run` does) or link {DAGS_DIR} into it"), line
    # a bundle of the home's that is dags/ will do, and one that is no folder cannot be told
    import json

    for bundles in ([{"name": "perfpipe", "kwargs": {"path": str(DAGS_DIR)},
                      "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle"}],
                    [{"name": "git", "kwargs": {},
                      "classpath": "airflow.providers.git.bundles.git.GitDagBundle"}]):
        monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
        assert dags_folder_problem("mqtt_perf_nightly") is None
    monkeypatch.delenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST")
    assert dags_folder_problem("mqtt_perf_nightly") is not None
    (tmp_path / "their_dags" / "perfpipe").symlink_to(DAGS_DIR)
    assert dags_folder_problem("mqtt_perf_nightly") is None


def test_show_and_report_on_a_fresh_state_say_there_is_no_such_run(perfpipe_env: Path,
                                                                    capsys) -> None:
    """A store nothing wrote to yet is made first, as for every other store command: an
    unknown run is named, not a database error about a missing table."""
    assert main(["show", "nightly-x"]) == 2
    err = capsys.readouterr().err  # (beside Alembic's log lines, which tests may see)
    assert "no run 'nightly-x'; recent: []" in err.splitlines() and "no such table" not in err
    assert main(["report", "nightly-x"]) == 2
    err = capsys.readouterr().err
    assert "unknown run 'nightly-x'" in err and "no such table" not in err, err


@pytest.mark.xdist_group("airflow-db")
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
    assert ": failed; Airflow's log: " in last and "secretpw" not in out + err
    # the terminal: the plan's step line and the failure alert, none of Airflow's own lines
    assert "[info" not in out + err and len((out + err).splitlines()) <= 4, out + err
    assert any(line.startswith("plan ") and " failed " in line for line in out.splitlines())
    log = Path(last.rsplit("Airflow's log: ", 1)[1].removesuffix(")")).read_text()
    assert "[DAG TEST] starting task_id=plan" in log and "secretpw" not in log


def undocumented(command: argparse.ArgumentParser, path: str = "perfpipe") -> list[str]:
    """Every subcommand without a description or a help line, and every option or
    positional argument without help, under `command`."""
    missing = [] if command.description else [f"{path}: no description"]
    for action in command._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {name}: no help")
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest: choice.help for choice in action._choices_actions}
            for sub_name, sub in action.choices.items():
                if not helped.get(sub_name):
                    missing.append(f"{path} {sub_name}: no help line")
                missing += undocumented(sub, f"{path} {sub_name}")
    return missing


def test_every_subcommand_and_option_has_help() -> None:
    assert undocumented(parser()) == []
    # the check itself: what it must catch
    bare = parser()
    sub = next(a for a in bare._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("bare").add_argument("--flag")
    sub.choices["show"].add_argument("extra")
    assert sorted(undocumented(bare)) == ["perfpipe bare --flag: no help",
                                          "perfpipe bare: no description",
                                          "perfpipe bare: no help line",
                                          "perfpipe show extra: no help"]


def test_the_nightly_summary_lists_what_needs_a_look_and_counts_the_rest(tmp_path: Path) -> None:
    run = {"run_id": "nightly-x", "kind": "nightly", "suite": "smoke", "broker_kind": "mosquitto",
           "broker_version": "2.0.11", "status": "ok", "artifact_dir": str(tmp_path)}
    (tmp_path / "report.html").write_text("<html></html>")

    def verdict(metric: str, name: str) -> dict:
        return {"metric": metric, "verdict": name, "baseline_value": 100.0, "value": 90.0,
                "change_pct": -10.0, "detail": {}}

    stage = {"stage_id": "s.q0", "validity": "valid", "params": {"index": 0},
             "metrics": {"delivered_rate": 90.0},
             "comparisons": [verdict("delivered_rate", "regression"),
                             *(verdict(f"m{i}", "learning") for i in range(30))]}
    files = {"report": tmp_path / "report.html", "slack message": tmp_path / "slack_message.json"}
    text = short_summary(run, [stage], files)
    assert "verdicts: 1 regression, 30 learning (all of them: perfpipe show nightly-x)" in text
    assert "delivered_rate  regression" in text and " m1 " not in text
    assert f"report: {tmp_path / 'report.html'}" in text
    assert "slack message: (not written" in text and len(text.splitlines()) < 15
    failed = short_summary({**run, "status": "failed"}, [], files)
    assert "no verdicts: the run ended before load_metrics" in failed
    assert "slack message: (not written: the run failed before it)" in failed
    # a run still going (perfpipe show while the nightly runs), its version not read yet:
    # it did not fail, and its version is no "None"
    going = short_summary({**run, "status": "running", "broker_version": None}, [], files)
    assert "slack message: (not written yet: the run is still going)" in going
    assert "mosquitto (version not known yet)): running" in going and "None" not in going
    # nothing compared because a stage's setup changed: the summary and the table say so
    why = "setup changed (measure_s: 10 -> 60): a new history starts here"
    fresh = {**stage, "comparisons": [{**verdict("delivered_rate", "no_baseline"),
                                       "detail": {"new_history": why}}]}
    assert f"verdicts: none, {why}\n" in short_summary(run, [fresh], files)
    assert verdict_rows([fresh])[0]["note"] == why
    # nothing compared because no stage was valid: not "no baseline", and no promise that
    # the next run compares against this one
    broken = {**stage, "validity": "invalid",
              "comparisons": [verdict("delivered_rate", "invalid")]}
    short, whole = short_summary(run, [broken], files), run_summary(run, [broken], files)
    assert ("nothing was compared; an invalid stage feeds no baseline (its reasons: "
            "perfpipe show nightly-x)") in short and "next run compares" not in short
    # perfpipe show (and run) lists the reasons itself, and the notes of every stage
    broken["reason"] = "delivered 50.0% of the expected delivery rate (allowed 95%..105%)"
    broken["notes"] = "subscribers received at QoS 1\nclocks not trusted\nclocks not trusted"
    noted = {**broken, "stage_id": "s.q1", "validity": "valid", "reason": None,
             "params": {"index": 1},
             "notes": "\n".join(["clocks not trusted", *(f"n{i}" for i in range(7))])}
    search = {**stage, "stage_id": "s.max", "params": {"index": 2, "search_outcome": {}},
              "comparisons": [verdict("max_rate", "invalid")]}  # a search's row: no notes
    whole = run_summary(run, [search, broken, noted], files)
    assert ("nothing was compared; an invalid stage feeds no baseline (its reasons: above)"
            in whole) and "next run compares" not in whole
    assert f"\ninvalid stages:\n  s.q0: {broken['reason']}\n" in whole
    unjudged = {**stage, "validity": None, "reason": None}  # its results never recorded
    assert "  s.q0: not judged: no results recorded" in run_summary(run, [unjudged], files)
    # a note of every stage once; a stage's own, five at most and the rest counted
    assert ("\nnotes on the stages:\n  every stage: clocks not trusted\n"
            "  s.q0: subscribers received at QoS 1\n"
            + "".join(f"  s.q1: n{i}\n" for i in range(5))
            + "  s.q1: and 2 more (all of them: the run folder's metrics/stage_metrics.json)\n"
            ) in whole


def test_a_run_that_failed_or_compared_nothing_promises_no_baseline(tmp_path: Path) -> None:
    """`perfpipe show` of a run that ended failed says it feeds no baseline (not that the
    next run compares against it), and of a run with no verdicts at all, why."""
    run = {"run_id": "nightly-f", "kind": "nightly", "suite": "smoke", "broker_kind": "mosquitto",
           "broker_version": "2.0.11", "status": "failed", "artifact_dir": str(tmp_path),
           # as teardown stores a failed run: set aside, its reason kept
           "excluded": True, "excluded_reason": "run failed: report did not finish"}
    first = {"stage_id": "s.q0", "validity": "valid", "params": {"index": 0}, "metrics": {},
             "comparisons": [{"metric": "delivered_rate", "verdict": "no_baseline",
                              "baseline_value": None, "value": 90.0, "change_pct": None,
                              "detail": {}}]}
    files = {"report": tmp_path / "report.html"}
    for said in (run_summary(run, [first], files), short_summary(run, [first], files)):
        assert "this run ended failed, so it feeds no baseline" in said
        assert "next run compares" not in said
    assert "(the next run compares against this one)" in run_summary(
        {**run, "status": "ok", "excluded": False, "excluded_reason": None}, [first], files)
    assert "set aside (noisy neighbour), so it feeds no baseline" in run_summary(
        {**run, "status": "ok", "excluded_reason": "noisy neighbour"}, [first], files)
    none = {**first, "comparisons": []}
    assert "\nno verdicts: the run ended before compare\n" in run_summary(run, [none], files)
    assert "no verdicts: the run has not reached compare yet" in run_summary(
        {**run, "status": "running"}, [none], files)


def test_the_report_the_cli_and_slack_count_and_show_verdicts_alike() -> None:
    """One verdict count, worst first, in the report, the CLI's summary and Slack (a
    metric not judged as its host was off its usual counted as such in all three); and
    `perfpipe show`'s verdict table in the report's units."""
    from collections import Counter

    from tasks.notify.messages import Links, run_message
    from tasks.views.report import render
    from tasks.views.tables import verdict_counts

    gated = {"metric": "e2e_latency_p50", "verdict": "no_baseline", "baseline_value": None,
             "value": 900.0, "change_pct": None, "confidence": None,
             "detail": {"off_pace_pct": 30.0, "note": "not judged: the host ran 30% off its pace"}}
    rows = [gated, {**gated, "metric": "delivered_rate", "verdict": "unchanged", "detail": {}},
            {**gated, "metric": "e2e_latency_avg", "verdict": "regression", "value": 1500.0,
             "baseline_value": 1000.0, "change_pct": 50.0, "detail": {}}]
    stage = {"stage_id": "s.q0", "scenario": "fanin", "validity": "valid", "reason": None,
             "params": {"index": 0}, "metrics": {}, "series": {}, "comparisons": rows,
             "notes": ""}
    run = {"run_id": "nightly-c", "kind": "nightly", "suite": "smoke", "broker_kind": "mosquitto",
           "broker_version": "2.0.11", "status": "ok", "artifact_dir": "/x"}
    said = "1 regression, 1 unchanged, 1 not judged (host off its usual)"
    assert f"<p>verdicts: {said}</p>" in render(run, [stage], [])
    assert f"verdicts: {said} (all of them" in short_summary(run, [stage], {})
    message = run_message(run, [], verdict_counts(rows), Links("report.html"))
    assert message["blocks"][1]["text"]["text"] == f"verdicts: {said}"
    assert Counter(verdict_counts(rows)) == Counter({"regression": 1, "unchanged": 1,
                                                     "not judged (host off its usual)": 1})
    listed = verdict_rows([stage])
    shown = {r["metric"]: r for r in listed}["e2e_latency_avg"]
    assert (shown["baseline"], shown["tonight"], shown["unit"]) == (1.0, 1.5, "ms")
    assert listed[0]["verdict"] == "regression"  # worst first, as the report lists them
    # the measured figures beside them in the same unit (they were in us)
    stage["metrics"] = {"e2e_latency_p50": 900.0, "delivered_rate": 5000.0}
    (measured,) = metrics_rows([stage])
    assert measured["e2e p50 ms"] == 0.9 and measured["delivered msg/s"] == 5000.0
    page = render({**run, "broker_version": None}, [stage], [])
    assert "mosquitto (version not known yet) ·" in page and "mosquitto None" not in page


def test_airflow_failing_itself_is_one_line_with_the_trace_in_its_log(perfpipe_env: Path,
                                                                      tmp_path: Path) -> None:
    """An Airflow home whose metadata DB was never migrated: dag.test() raises. One line
    and exit 1; the trace goes to the Airflow log file that line names."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow")}
    done = subprocess.run([sys.executable, "-m", "tasks.cli", "nightly"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("perfpipe: Airflow could not run mqtt_perf_nightly: OperationalError: ")
    log = Path(line.rsplit("the trace is in Airflow's log: ", 1)[1].removesuffix(")"))
    assert log.is_relative_to(tmp_path / "airflow" / "logs")
    assert "Traceback (most recent call last)" in log.read_text()


def test_exit_codes_of_a_run_and_of_a_nightly_dag_run() -> None:
    from tasks.metrics import exit_code

    assert [exit_code("ok", None), exit_code("ok", "Slack not told"), exit_code("failed", None),
            exit_code("invalid", None)] == [0, 5, 1, 1]
    # under Airflow: Slack not told fails the alert task on purpose; still the CLI's 5
    assert exit_code("ok", "Slack not told", airflow_state="failed") == 5
    assert exit_code("ok", None, airflow_state="failed") == 1
    assert exit_code("failed", None, airflow_state="failed") == 1
    # the database away at teardown: the status not stored, as the step itself exits
    assert exit_code("failed", None, stored=False) == exit_code("ok", None, stored=False) == 4


def test_a_step_is_refused_a_host_it_cannot_run_for_and_a_run_id_never_planned(
        perfpipe_env: Path, tmp_path: Path, capsys) -> None:
    """`perfpipe step --host`: a per-host step needs one of the inventory's hosts, and a
    step of the whole run none (it would be marked finished for that host only, and
    teardown would close the run failed); each is refused before it runs, in one line."""
    from tests.conftest import planned_run

    ctx = planned_run(tmp_path, "hosts: [{name: localhost, transport: local, roles: [driver]}]\n"
                      "broker: {kind: mosquitto, managed: false, address: 127.0.0.1, "
                      "port: 1883}\n", "smoke")
    capsys.readouterr()
    refusals = {
        ("stages", "--host", "localhost"): "perfpipe: step 'stages' runs once for the run, not "
        "per host: leave out --host localhost (it is for provision, tune)",
        ("provision", "--host", "driver9"): "perfpipe: step 'provision' runs per host: no host "
        f"'driver9' in inventory {ctx.inventory.name!r}; name one of ['localhost'] (--host)",
        ("tune",): "perfpipe: step 'tune' runs per host: name one of ['localhost'] (--host)",
    }
    for (step, *host), said in refusals.items():
        assert main(["step", step, ctx.run_id, *host]) == 2
        assert capsys.readouterr().err.splitlines() == [said]
    assert not ctx.finished("stages", "localhost") and not ctx.finished("provision", "driver9")

    assert main(["step", "stages", "nightly-typo"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "no run 'nightly-typo' was planned here" in line, line
    assert str(perfpipe_env / "runs") in line and "`perfpipe run`" in line, line


def test_a_perfpipe_variable_that_cannot_be_used_is_named_as_it_was_set(
        perfpipe_env: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PERFPIPE_LAB_WAIT_S", "soon")
    monkeypatch.setenv("PERFPIPE_DB_RETRY_S", "-1")
    assert main(["show", "nightly-x"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "perfpipe: PERFPIPE_LAB_WAIT_S='soon': Input should be a valid number, unable to parse "
        "string as a number", "PERFPIPE_DB_RETRY_S='-1': Input should be greater than or equal "
        "to 0"]


def test_a_command_never_migrates_a_database_runs_share(perfpipe_env: Path, capsys) -> None:
    """A newer checkout's `perfpipe alerts list` upgraded the shared results database,
    and every worker of the deployed, older perfpipe then refused it. A command makes a
    new store, and otherwise says the revision it found and leaves it."""
    from alembic import command
    from sqlalchemy import create_engine, text

    from sql.store import alembic_config
    from tasks.settings import load_settings

    url = load_settings().database_url()

    def revision() -> str:
        engine = create_engine(url)
        with engine.connect() as conn:
            found = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        engine.dispose()
        return found

    assert main(["alerts", "list"]) == 0  # a new store: made, at this perfpipe's revision
    head = revision()
    engine = create_engine(url)
    with engine.begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    engine.dispose()
    capsys.readouterr()
    for argv in (["alerts", "list"], ["show", "nightly-x"], ["baseline", "list"]):
        assert main(argv) == 2, argv
        assert f"is at schema revision 0004, this perfpipe's is {head}" in capsys.readouterr().err
    assert revision() == "0004"
    load_settings().store().migrate()  # as a run of this perfpipe does
    assert main(["alerts", "list"]) == 0 and revision() == head


def test_a_misspelt_setting_is_warned_of_and_an_empty_one_is_unset(perfpipe_env: Path,
                                                                    monkeypatch) -> None:
    import os
    import subprocess
    import sys

    from tasks.notify.slack import notifier_for
    from tasks.settings import REPO_ROOT, load_settings

    env = {**os.environ, "PERFPIPE_DB_URI": "postgresql+psycopg://x@db/perf",
           "PERFPIPE_SLACK_TOKEN": "", "PERFPIPE_TEST_MQTT_PASSWORD": "a password's name"}
    done = subprocess.run([sys.executable, "-m", "tasks.cli", "show", "nightly-x"], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    warned = [line for line in done.stderr.splitlines() if "no perfpipe setting" in line]
    assert warned == ["PERFPIPE_DB_URI is no perfpipe setting and is ignored: did you mean "
                      "PERFPIPE_DB_URL?"], done.stderr
    assert "postgresql" not in done.stderr and "MQTT_PASSWORD" not in done.stderr
    monkeypatch.setenv("PERFPIPE_SLACK_TOKEN", "")
    assert load_settings().slack_token is None
    assert notifier_for(load_settings()).client is None  # messages go to files

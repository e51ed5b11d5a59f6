"""DAG integrity: every DAG file imports cleanly, cheaply, and is documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.steps import STEPS
from tasks.steps.aggregate import SUBMIT_CONF, spark_job

pytestmark = pytest.mark.xdist_group("airflow-db")

REPO = Path(__file__).resolve().parent.parent
DAG_FILES = sorted((REPO / "dags").glob("*.py"))
# Imported by the pipeline's steps; a DAG file must leave them to task run time.
HEAVY = ("pyspark", "paho", "fabric", "slack_sdk", "scipy", "sql")
# What DAG files may read at parse time: the step registry, the vocabulary and how a
# perfpipe run names its DAG run, which import only the standard library,
PARSE_TIME = {"tasks", "tasks.steps", "tasks.metrics", "tasks.airflow_glue",
              "tasks.airflow_glue.dag_runs",
              # the aggregate step's operator: the Spark provider's, which the DAG uses anyway
              "tasks.airflow_glue.spark"}
# and the suites file, for the `suite` Param's choices: the settings (where the scenarios dir
# is) and the catalog's loader (what a valid suites file is), so that the choices are the
# suites the pipeline itself would accept. They use pydantic and PyYAML, which Airflow imports
# itself before any DAG file runs, and pydantic-settings (about 50 ms more).
# (the catalog's bounds are the driver's: its limits and its wire header, standard library)
SUITES_READER = {"tasks.settings", "tasks.config_files", "tasks.catalog",
                 "tasks.catalog.scenarios", "tasks.driver", "tasks.driver.limits",
                 "tasks.driver.wire"}
SUITES_READER_DEPS = {"pydantic_settings", "dotenv"}  # beyond what `import airflow.sdk` has


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import BundleDagBag

    # as the dag-processor does: the DAG bundle (dags/) is importable, for perfpipe_graph
    return BundleDagBag(dag_folder=str(REPO / "dags"), bundle_path=REPO / "dags")


def test_every_dag_file_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"mqtt_perf_nightly", "mqtt_perf_release", "mqtt_perf_maintenance",
            "mqtt_perf_watchdog"} <= set(dagbag.dag_ids)


def test_only_dag_files_are_parsed_as_dag_files(dagbag):
    parsed = {Path(stat.file).name for stat in dagbag.dagbag_stats}
    assert "perfpipe_graph.py" not in parsed  # dags/.airflowignore: imported, not a DAG file
    assert parsed == {"mqtt_perf_maintenance.py", "mqtt_perf_nightly.py",
                      "mqtt_perf_release.py", "mqtt_perf_watchdog.py"}


def test_the_tests_dag_runs_stay_out_of_make_runs_airflow_home():
    assert Path(os.environ["AIRFLOW_HOME"]).resolve() != (REPO / ".state" / "airflow").resolve()


def test_dags_have_no_cycles_owners_tags_and_docs(dagbag):
    for dag in dagbag.dags.values():
        dag.check_cycle()
        assert dag.tags, f"{dag.dag_id} has no tags"
        assert dag.doc_md, f"{dag.dag_id} has no doc"
        for task in dag.tasks:
            assert task.owner and task.owner != "airflow", f"{task.task_id}: set an owner"
            assert task.doc_md, f"{dag.dag_id}.{task.task_id} has no doc_md"


def test_nightly_schedule_and_teardown(dagbag):
    dag = dagbag.get_dag("mqtt_perf_nightly")
    assert dag.schedule == "0 2 * * *" or str(dag.timetable.summary) == "0 2 * * *"
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.get_task("teardown").is_teardown
    assert {t.task_id for t in dag.get_task("teardown").upstream_list if t.is_setup} == {"hosts"}
    assert dag.get_task("hosts").retries > 0  # a moment's hiccup does not leave the run open
    # a failed teardown is said at once (a retry would find the run closed and restore nothing)
    assert dag.get_task("teardown").retries == 0
    steps = [step.name for step in STEPS]
    assert set(steps) <= set(dag.task_ids)
    for before, after in zip(steps, steps[1:]):  # in the registry's order
        assert after in dag.get_task(before).downstream_task_ids, (before, after)
    assert dag.get_task("stages").retries == 0 and dag.get_task("stages").pool == "perfpipe_lab"
    assert dag.get_task("provision").retries > 0 and dag.get_task("collect").retries > 0
    assert dag.get_task("alert").retries > 0  # a retried alert updates, never reposts
    from tasks.airflow_glue.spark import AggregateOperator

    assert type(dag.get_task("aggregate")) is AggregateOperator  # the provider's, as a step
    # spark-submit as the CLI runs it (the C1 JIT only: a short job starts sooner), its
    # conf handed over by the spark_job task (step modules are not imported at parse time)
    conf = dag.get_task("aggregate").conf
    assert (conf.operator.task_id, conf.key) == ("spark_job", "conf")
    assert spark_job("r-1")["conf"] == SUBMIT_CONF
    assert "-XX:TieredStopAtLevel=1" in SUBMIT_CONF["spark.driver.extraJavaOptions"]


def test_the_scheduled_dags_run_once_deployed(dagbag):
    for dag_id in ("mqtt_perf_nightly", "mqtt_perf_watchdog"):
        assert dagbag.get_dag(dag_id).is_paused_upon_creation is False, dag_id


def test_release_params_are_validated_and_documented(dagbag):
    dag = dagbag.get_dag("mqtt_perf_release")
    assert dag.schedule is None or str(dag.timetable.summary) in ("None", "")
    for name in ("release_label", "broker_version", "suite", "inventory", "baseline", "promote",
                 "dry_run"):
        assert dag.params.get_param(name).description, name
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError):
        dag.params.get_param("release_label").resolve("9.4.5; rm -rf /")
    assert dag.params.get_param("release_label").resolve("9.4.5") == "9.4.5"
    with pytest.raises(ParamValidationError):  # `$` matches before a last newline in `re`
        dag.params.get_param("release_label").resolve("9.4.5\n")
    # what may be left empty is optional in the trigger form (null allowed), not required
    for name in ("broker_version", "inventory", "baseline"):  # baseline: the latest pinned
        assert dag.params.get_param(name).resolve(None) is None, name
    assert dagbag.get_dag("mqtt_perf_nightly").params.get_param("inventory").resolve(None) is None


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dag_files_do_no_heavy_imports_at_parse_time(path):
    code = (f"import sys, json, runpy, airflow.sdk, pendulum; "
            f"sys.path.insert(0, {str(path.parent)!r}); runpy.run_path({str(path)!r}); "
            f"print(json.dumps([sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}), "
            f"sorted(m for m in sys.modules if m.split('.')[0] == 'tasks')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         check=True)
    heavy, ours = json.loads(out.stdout.strip().splitlines()[-1])
    assert heavy == []
    assert set(ours) <= PARSE_TIME | SUITES_READER, sorted(set(ours) - PARSE_TIME - SUITES_READER)


def test_parse_time_modules_import_only_the_standard_library():
    code = ("import sys; before = set(sys.modules); import tasks.steps, tasks.metrics, tasks.airflow_glue.dag_runs; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    assert set(out.stdout.split()) - set(sys.stdlib_module_names) == {"tasks"}


def test_the_suites_reader_imports_only_what_airflow_has_loaded_already():
    code = ("import sys, airflow.sdk; before = {m.split('.')[0] for m in sys.modules}; "
            f"import {', '.join(sorted(SUITES_READER))}; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    assert set(out.stdout.split()) - set(sys.stdlib_module_names) <= {"tasks"} | SUITES_READER_DEPS


def _suites_file_keys(scenarios_dir: Path) -> list[str]:
    import yaml

    return sorted(yaml.safe_load((scenarios_dir / "suites.yml").read_text())["suites"])


def test_suite_params_offer_the_suites_of_the_suites_file(dagbag):
    from airflow.sdk.definitions.param import ParamValidationError

    from tasks.settings import load_settings

    shipped = _suites_file_keys(load_settings().scenarios_dir)
    assert {"smoke", "nightly", "release"} <= set(shipped)
    for dag_id in ("mqtt_perf_nightly", "mqtt_perf_release"):
        param = dagbag.get_dag(dag_id).params.get_param("suite")
        assert param.schema["enum"] == shipped, dag_id  # a choice in the trigger form
        assert param.value == "smoke" and param.resolve("release") == "release", dag_id
        with pytest.raises(ParamValidationError):
            param.resolve("bogus")


def test_suite_params_follow_the_scenarios_dir(tiny_suite, monkeypatch):
    """The tests' own scenarios dir (`tiny`): the DAGs offer its suites, as the plan reads them."""
    from tasks.airflow_glue.dag_test import load_dag
    from tasks.settings import load_settings

    assert _suites_file_keys(load_settings().scenarios_dir) == ["tiny"]
    # PERFPIPE_SUITE (default smoke) names no suite there: free text, so the plan task says
    # so instead of the nightly quietly running another suite
    param = load_dag("mqtt_perf_nightly").params.get_param("suite")
    assert "enum" not in param.schema and param.value == "smoke"
    monkeypatch.setenv("PERFPIPE_SUITE", "tiny")
    for dag_id in ("mqtt_perf_nightly", "mqtt_perf_release"):
        param = load_dag(dag_id).params.get_param("suite")
        assert param.schema["enum"] == ["tiny"] and param.value == "tiny", dag_id
    monkeypatch.setenv("PERFPIPE_DB_RETRY_S", "abc")  # a bad setting: the DAG still parses
    assert "enum" not in load_dag("mqtt_perf_nightly").params.get_param("suite").schema
    monkeypatch.delenv("PERFPIPE_DB_RETRY_S")
    monkeypatch.setenv("PERFPIPE_SCENARIOS_DIR", str(tiny_suite / "nowhere"))
    param = load_dag("mqtt_perf_nightly").params.get_param("suite")  # no suites file: free text
    assert "enum" not in param.schema and param.value == "tiny"


def test_the_aggregate_tasks_spark_submit_gets_no_secret_nor_runs_for_ever(tmp_path, monkeypatch):
    """The provider's hook hands spark-submit a copy of the worker's whole environment, the
    results DB's Connection and the Slack token among them; the aggregate task's does not.
    A spark-submit on PATH that writes down its environment stands in for Spark's (the real
    job runs in the DAG tests)."""
    from tasks.airflow_glue.spark import AggregateOperator

    seen = tmp_path / "env.json"
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport json, os, time\n"
                    f"open({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
                    f"time.sleep(float(os.environ.get('GIVEN_SLEEP', 0)))\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("AIRFLOW_CONN_PERFPIPE_RESULTS", '{"conn_type": "postgres", "password": "pw"}')
    monkeypatch.setenv("PERFPIPE_SLACK_TOKEN", "xoxb-secret")
    monkeypatch.setenv("PERFPIPE_KEPT", "kept")
    operator = AggregateOperator(task_id="aggregate", application="job.py", conn_id="spark_default",
                                 env_vars={"GIVEN": "1"})
    operator._get_hook().submit("job.py")
    env = json.loads(seen.read_text())
    assert "AIRFLOW_CONN_PERFPIPE_RESULTS" not in env and "PERFPIPE_SLACK_TOKEN" not in env
    assert env["PERFPIPE_KEPT"] == "kept" and env["GIVEN"] == "1"
    # and a spark-submit that never ends is killed after the CLI's bound (here 1 s), not a
    # task timeout that would count the wait for the lab lock too
    import tasks.steps

    monkeypatch.setattr(tasks.steps, "AGGREGATE_TIMEOUT_S", 1)
    operator = AggregateOperator(task_id="aggregate", application="job.py", conn_id="spark_default",
                                 env_vars={"GIVEN_SLEEP": "60"})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="spark-submit killed after 1 s"):
        operator._get_hook().submit("job.py")
    assert time.monotonic() - started < 30

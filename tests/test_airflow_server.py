"""`make airflow`'s recipe under test: the real api-server, scheduler and dag-processor in an
Airflow home of the test's own, the release DAG triggered with Params by the README's own
REST example (token from the documented login, unpause, trigger), then waited for, measuring
for real on a local Mosquitto."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sql import Store
from tests.checks import assert_plausible
from tasks.ports import free_port

# about 110 s: Airflow up 20-30 s, the release run 80 s (its Spark job 35 s, the stages 15 s)
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DAG_ID = "mqtt_perf_release"


def api(url: str, method: str, path: str, body: dict | None = None,
        token: str | None = None) -> dict:
    """One REST call; the reply's JSON (HTTPError carries Airflow's reason)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as error:
        raise AssertionError(f"{method} {path}: {error.code} {error.read().decode()}") from None


def release_only_dags(folder: Path) -> Path:
    """A DAG folder with the release DAG alone: the nightly and watchdog, active once a
    scheduler sees them, would start their own runs beside the one under test."""
    folder.mkdir()
    for name in (f"{DAG_ID}.py", "perfpipe_graph.py", ".airflowignore"):
        (folder / name).symlink_to(REPO / "dags" / name)
    return folder


def migrate(env: dict[str, str]) -> None:
    """What the Makefile's `.migrated` rule does to an Airflow home."""
    for argv in (["db", "migrate"],
                 ["pools", "set", "perfpipe_lab", "1", "lab hosts: one measurement at a time"]):
        subprocess.run([sys.executable, "-m", "airflow", *argv], env=env, check=True,
                       capture_output=True, timeout=120)


def kill_leftovers(marker: Path) -> None:
    """Whatever a killed run left behind (a broker, drivers, started detached): found by
    the test's own temp dir on its command line."""
    from tasks.driver.procfs import ProcessFinder, all_stats

    for pid in ProcessFinder("match", re.escape(str(marker))).find(all_stats()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def airflow_server(tiny_suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tasks.airflow_glue.local_server import Server, server_env, start, wait_ready

    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(release_only_dags(tmp_path / "dags")))
    server = Server(tmp_path / "airflow", free_port())
    migrate(server_env(server, os.environ))
    running = start(server)
    try:
        wait_ready(running, timeout_s=180)
        yield server
    finally:
        running.stop(wait_s=10)
        kill_leftovers(tmp_path)


def readme_trigger(server) -> str:
    """Run the README's REST example against this server with the tests' tiny suite; the
    Airflow run id it triggered."""
    from tasks.airflow_glue.local_server import DEFAULT_PORT, PASSWORDS_FILE

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Running the real scheduler"):]
    script = re.search(r"```sh\n(URL=.*?)```", section, re.S).group(1)
    for old, new in ((f"http://127.0.0.1:{DEFAULT_PORT}", server.url),
                     (f".state/airflow/{PASSWORDS_FILE}", str(server.passwords_file)),
                     ('"release_label": "9.4.5", "suite": "smoke"',
                      '"release_label": "rc1", "suite": "tiny"')):
        assert old in script, f"the README's REST example no longer has {old}"
        script = script.replace(old, new)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] in ("queued", "running", "success"), done.stdout
    return re.search(r"^triggered (\S+)$", done.stdout, re.M).group(1)


def wait_for(what: str, check, timeout_s: float, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := check()) is not None:
            return found
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


@pytest.mark.alone
def test_release_dag_runs_under_the_real_scheduler_through_the_rest_api(airflow_server):
    from tasks.airflow_glue.local_server import COMPONENTS
    from tasks.settings import load_settings
    from tasks.steps.plan import new_run_id

    url = airflow_server.url
    password = airflow_server.password()
    with pytest.raises(AssertionError, match="401"):  # a real login, not all-admins
        api(url, "POST", "/auth/token", {"username": "admin", "password": password + "x"})
    token = api(url, "POST", "/auth/token",
                {"username": "admin", "password": password})["access_token"]
    assert airflow_server.passwords_file.stat().st_mode & 0o077 == 0
    # a second `make airflow` on the same home is refused: two schedulers on one SQLite DB
    from tasks.airflow_glue.local_server import Server, start

    with pytest.raises(RuntimeError, match="already runs on the home"):
        start(Server(airflow_server.home, free_port()))

    def parsed():
        dags = api(url, "GET", f"/api/v2/dags?dag_id_pattern={DAG_ID}", token=token)["dags"]
        return dags or None

    wait_for("the dag-processor parsing the release DAG", parsed, 120)
    airflow_run = readme_trigger(airflow_server)  # unpause, trigger with Params, look
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{airflow_run}"
    assert api(url, "GET", path, token=token)["conf"]["suite"] == "tiny"

    def finished():
        state = api(url, "GET", path, token=token)["state"]
        return state if state in ("success", "failed") else None

    state = wait_for("the release DAG run finishing", finished, 300, every_s=2)
    tasks = api(url, "GET", f"{path}/taskInstances", token=token)["task_instances"]
    assert state == "success", {t["task_id"]: t["state"] for t in tasks}
    assert len(tasks) >= 10 and {t["state"] for t in tasks} == {"success"}

    perf_run = new_run_id("release", f"{DAG_ID}/{airflow_run}")
    store = Store(load_settings().database_url())
    assert_plausible(store, perf_run)  # status ok, both stages measured for real
    assert store.run(perf_run)["release_label"] == "rc1"
    for component in COMPONENTS:
        assert password not in airflow_server.log(component).read_text()

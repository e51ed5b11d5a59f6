"""Airflow's api-server, scheduler and dag-processor on this machine: what `make airflow`
runs, and what tests/test_airflow_server.py starts in an Airflow home of its own.

The embedded default: the metadata DB is the Airflow home's SQLite file and the executor
is the LocalExecutor (Airflow 3 has no SequentialExecutor; `airflow standalone` runs the
LocalExecutor on the same SQLite). The api-server listens on loopback only. Login is
Airflow's simple auth manager with one user, `admin`, whose password is generated here
into the Airflow home's passwords file (mode 0600) before the api-server starts, so the
api-server never prints it to its log. The Spark connection and the other settings come
from the caller's environment (the Makefile exports AIRFLOW_CONN_SPARK_DEFAULT).

Each component runs in a session of its own, logs to `<home>/logs/<component>.log`, and
is stopped with every process below it (task processes put themselves in groups of their
own, so a group kill would miss them).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..driver.procfs import all_stats, descendants
from .dag_test import DAGS_DIR

COMPONENTS = ("api-server", "scheduler", "dag-processor")
# The scheduler's log server would listen on every interface (port 8793); the api-server
# reads task logs from this home's files, so it is not needed on one machine
ARGS = {"scheduler": ("--skip-serve-logs",)}
USER = "admin"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
DEFAULT_PORT = 8080
STOP_WAIT_S = 30.0  # how long a component may take to stop after TERM before it is killed
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
# Settings the caller may override (export them before `make airflow`).
DEFAULTS = {
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__PARALLELISM": "4",  # the LocalExecutor forks this many workers up front
}


@dataclass(frozen=True)
class Server:
    """Where the three components run: the Airflow home and the api-server's port."""

    home: Path
    port: int = DEFAULT_PORT

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def passwords_file(self) -> Path:
        return self.home / PASSWORDS_FILE

    def log(self, component: str) -> Path:
        return self.home / "logs" / f"{component}.log"

    def password(self) -> str:
        return json.loads(self.passwords_file.read_text())[USER]


def server_env(server: Server, environ: Mapping[str, str]) -> dict[str, str]:
    """The components' environment: `environ` with the settings this recipe fixes."""
    env = {**DEFAULTS, "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR), **environ}
    env.update({
        "AIRFLOW_HOME": str(server.home),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(server.port),
        "AIRFLOW__API__BASE_URL": server.url,  # the tasks reach its execution API there
        "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(server.passwords_file),
    })
    return env


def ensure_password(server: Server) -> None:
    """Generate the admin password into the passwords file unless it holds one already."""
    path = server.passwords_file
    known = json.loads(path.read_text() or "{}") if path.exists() else {}
    if USER not in known:
        known[USER] = secrets.token_urlsafe(12)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(known) + "\n")
    path.chmod(0o600)


@dataclass
class Running:
    """The started components, by name."""

    server: Server
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    lock: object = None  # the home's lock file, released at stop

    def exited(self) -> dict[str, int]:
        """Components that ended, with their exit codes."""
        return {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """TERM every component, KILL whatever of them (or below them) is left after wait_s."""
        stats = all_stats()
        tree = set().union(*(descendants(p.pid, stats) for p in self.processes.values()))
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + wait_s
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # what was below them when stopping began, and whatever started since in their
        # sessions (each component leads one; a task process only changes its group)
        now = all_stats()
        leaders = {p.pid for p in self.processes.values()}
        late = {pid for pid, stat in now.items() if stat.session in leaders}
        for pid in (tree & set(now)) | late:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes.values():
            process.wait()
        if self.lock is not None:
            self.lock.close()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # as the api-server binds it: a port in TIME_WAIT after a stop is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _one_server_per_home(server: Server):
    """A lock on the home held while the components run: a second scheduler on the same
    SQLite metadata DB would fight the first."""
    handle = open(server.home / "local_server.lock", "w")  # noqa: SIM115 (held until stop)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"Airflow already runs on the home {server.home} (make airflow "
                           "in another terminal?): stop it first") from None
    return handle


def start(server: Server, environ: Mapping[str, str] | None = None) -> Running:
    """Start the three components (the home's metadata DB must be migrated)."""
    env = server_env(server, os.environ if environ is None else environ)
    if not _port_free(server.port):
        raise RuntimeError(f"port {server.port} of 127.0.0.1 is taken: choose another "
                           "(make airflow AIRFLOW_PORT=...)")
    server.log("api-server").parent.mkdir(parents=True, exist_ok=True)
    ensure_password(server)
    running = Running(server, lock=_one_server_per_home(server))
    try:
        for component in COMPONENTS:
            with open(server.log(component), "ab") as log:
                running.processes[component] = subprocess.Popen(
                    [sys.executable, "-m", "airflow", component, *ARGS.get(component, ())],
                    env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True)
    except BaseException:
        running.stop(0)
        raise
    return running


def health(server: Server) -> dict | None:
    """The api-server's health report, None while it does not answer."""
    try:
        with urllib.request.urlopen(f"{server.url}/api/v2/monitor/health", timeout=5) as reply:
            return json.load(reply)
    except (OSError, ValueError):
        return None


def is_ready(report: dict | None) -> bool:
    """The api-server answers, and the scheduler and the dag-processor heartbeat."""
    return bool(report) and all((report.get(part) or {}).get("status") == "healthy"
                                for part in ("metadatabase", "scheduler", "dag_processor"))


def wait_ready(running: Running, timeout_s: float) -> None:
    """Return when all three are up; RuntimeError when one exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ended := running.exited():
            name, code = next(iter(ended.items()))
            raise RuntimeError(f"airflow {name} exited with {code}: see {running.server.log(name)}")
        if is_ready(health(running.server)):
            return
        time.sleep(1)
    raise RuntimeError(f"Airflow was not up within {timeout_s:.0f} s: see the logs in "
                       f"{running.server.log('api-server').parent}")


def banner(server: Server) -> str:
    logs = server.log("{" + ",".join(COMPONENTS) + "}")
    return (f"Airflow is up: {server.url}\n"
            f"  log in as {USER}, password: the \"{USER}\" entry of {server.passwords_file}\n"
            f"  logs: {logs}\n"
            "  Ctrl-C stops the api-server, the scheduler and the dag-processor")


def _stop_on(signum: int, frame) -> None:
    raise KeyboardInterrupt


def _on_stop_signals(handler) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handler)


def serve(server: Server, ready_timeout_s: float = 180.0) -> int:
    """Start the three, say how to log in, run until Ctrl-C (or TERM) or one of them exits."""
    _on_stop_signals(_stop_on)  # SIGINT too: a background job inherits it ignored
    print(f"starting the Airflow api-server, scheduler and dag-processor (home {server.home})",
          flush=True)
    running, code = None, 0
    try:
        running = start(server)
        wait_ready(running, ready_timeout_s)
        print(banner(server), flush=True)
        while not running.exited():
            time.sleep(1)
        name, code = next(iter(running.exited().items()))
        print(f"airflow {name} exited with {code}: see {server.log(name)}", file=sys.stderr)
        code = code or 1
    except KeyboardInterrupt:
        pass
    except RuntimeError as error:
        print(f"perfpipe: {error}", file=sys.stderr)
        code = 1
    finally:
        if running is not None:
            _on_stop_signals(signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
            print(f"stopping Airflow (at most {STOP_WAIT_S:.0f} s)", flush=True)
            running.stop()
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tasks.airflow_glue.local_server",
        description="Run Airflow's api-server, scheduler and dag-processor on this machine "
                    "(LocalExecutor, the Airflow home's SQLite DB) until Ctrl-C.")
    parser.add_argument("--home", type=Path, default=os.environ.get("AIRFLOW_HOME"),
                        required="AIRFLOW_HOME" not in os.environ,
                        help="Airflow home with a migrated metadata DB (default: $AIRFLOW_HOME)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"the api-server's port on 127.0.0.1 (default {DEFAULT_PORT})")
    args = parser.parse_args(argv)
    return serve(Server(Path(args.home).resolve(), args.port))


if __name__ == "__main__":
    sys.exit(main())

"""docker-compose.yml, checked as a file (no Docker engine here): it parses, images are
pinned, every path it mounts or builds from exists, every setting the code reads is
provided, and the services agree on their connection strings. It is at least as careful as
Airflow 3's own compose file: long-running services have healthchecks (on ports they listen
on) and restart policies, the Airflow services wait for airflow-init and healthy databases,
logs go to a volume, and the admin logs in with a password taken from the environment (the
login is checked with Airflow's own simple auth manager)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tasks.catalog.inventory import load_inventory
from tasks.catalog.scenarios import load_suite
from tasks.catalog.stages import expand_all
from tasks.settings import Settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
AIRFLOW = [name for name, s in SERVICES.items()  # the Airflow services, not one-shot helpers
           if s.get("image", "").startswith("perfpipe-airflow")
           and "AIRFLOW__CORE__EXECUTOR" in s.get("environment", {})]
MOUNT_ROOT = "/opt/perfpipe"


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in SERVICES[service].get("environment", {}).items()}


def expand(value: str) -> str:
    """${VAR:?msg} / ${VAR:-default} -> ${VAR}: the variable, not its message."""
    return re.sub(r"\$\{(\w+)(:[?-][^}]*)?\}", r"${\1}", value)


def test_every_image_is_pinned_to_a_version():
    for name, service in SERVICES.items():
        image = service.get("image")
        assert image, f"{name}: no image"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: {image}"


def test_every_mounted_or_built_path_exists():
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name} mounts {source}"
        build = service.get("build")
        if build:
            dockerfile = REPO / build["context"] / build["dockerfile"]
            assert dockerfile.exists(), f"{name}: {dockerfile}"
            for line in dockerfile.read_text().splitlines():
                if line.startswith("COPY "):
                    assert (REPO / line.split()[1]).exists(), f"{dockerfile.name}: {line}"
    for secret in COMPOSE["secrets"].values():
        assert (REPO / secret["file"]).parent.is_dir()  # the user generates the key there
    assert "ssh-keygen" in (REPO / "secrets" / "README.md").read_text()


@pytest.mark.parametrize("service", AIRFLOW)
def test_airflow_services_get_every_setting_the_pipeline_reads(service):
    provided = env(service)
    for field in ("state_dir", "db_conn_id", "inventory", "spark_master", "slack_conn_id",
                  "slack_channel"):
        assert f"PERFPIPE_{field.upper()}" in provided, f"{service}: PERFPIPE_{field.upper()}"
    assert set(Settings.model_fields) >= {f[9:].lower() for f in provided if f.startswith("PERFPIPE_")}
    for conn in ("SPARK_DEFAULT", provided["PERFPIPE_DB_CONN_ID"].upper(),
                 provided["PERFPIPE_SLACK_CONN_ID"].upper()):
        assert f"AIRFLOW_CONN_{conn}" in provided, conn
    assert provided["PYTHONPATH"] == MOUNT_ROOT
    assert provided["AIRFLOW__CORE__DAGS_FOLDER"] == f"{MOUNT_ROOT}/dags"


def test_connection_strings_agree_with_the_services():
    airflow = env("airflow-scheduler")
    meta = urlsplit(expand(airflow["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]))
    db = env("airflow-db")
    assert (meta.hostname, meta.username, meta.path.strip("/")) == (
        "airflow-db", db["POSTGRES_USER"], db["POSTGRES_DB"])
    assert meta.password == expand(db["POSTGRES_PASSWORD"])
    results = json.loads(expand(airflow["AIRFLOW_CONN_PERFPIPE_RESULTS"]))
    rdb = env("results-db")
    assert (results["conn_type"], results["host"], results["login"], results["schema"]) == (
        "postgres", "results-db", rdb["POSTGRES_USER"], rdb["POSTGRES_DB"])
    assert results["password"] == expand(rdb["POSTGRES_PASSWORD"])
    assert json.loads(expand(airflow["AIRFLOW_CONN_PERFPIPE_SLACK"]))["conn_type"] == "slack"
    assert urlsplit(airflow["AIRFLOW__CELERY__BROKER_URL"]).hostname in SERVICES
    spark = json.loads(airflow["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert f"{spark['host']}:{spark['port']}" == airflow["PERFPIPE_SPARK_MASTER"]
    assert urlsplit(airflow["PERFPIPE_SPARK_MASTER"]).hostname in SERVICES
    for worker in ("spark-worker",):
        assert airflow["PERFPIPE_SPARK_MASTER"] in SERVICES[worker]["command"]
    api = urlsplit(airflow["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert api.hostname in SERVICES and str(api.port) in SERVICES[api.hostname]["ports"][0]


def test_the_compose_inventory_points_at_compose_services():
    path = env("airflow-scheduler")["PERFPIPE_INVENTORY"].replace(MOUNT_ROOT, str(REPO))
    inventory = load_inventory(Path(path))
    for host in inventory.hosts:
        assert host.address in SERVICES, host.name
        key = str(host.key_file)
        assert key.startswith("/run/secrets/") and Path(key).name in COMPOSE["secrets"]
    assert inventory.broker.address in SERVICES and not inventory.broker.managed
    assert all(SERVICES[h.address].get("secrets") for h in inventory.hosts)


def test_the_scheduled_nightly_runs_the_nightly_suite():
    """Compose's nightly runs what suites.yml calls the nightly's (rated load, then
    capacity), not the setting's default (`smoke`, make run's); every scenario in it loads."""
    value = env("airflow-scheduler")["PERFPIPE_SUITE"]
    default = re.fullmatch(r"\$\{PERFPIPE_SUITE:-([\w-]+)\}", value)
    assert default, f"PERFPIPE_SUITE: {value!r}, not ${{PERFPIPE_SUITE:-SUITE}}"
    suite = default.group(1)
    assert suite == "nightly" != Settings.model_fields["suite"].default
    scenarios = load_suite(REPO / "scenarios", suite)
    assert any(s.stages.search for s in scenarios)  # capacity, not rated load alone
    assert expand_all(scenarios)


def test_the_compose_broker_gets_tls_and_the_drivers_its_ca():
    """The broker-certs service's command, run here for real; its files are the ones the
    Mosquitto config and the TLS scenario name, where compose mounts them; then Mosquitto
    with the compose config (ports and paths moved to this machine) completes an MQTT
    CONNECT over TLS, verified against the CA as a driver does, by the service's name."""
    import pwd
    import shutil
    import socket
    import ssl
    import subprocess
    import tempfile
    import time

    from tasks.brokers.certs import main as certs_main
    from tasks.catalog.scenarios import load_catalog
    from tasks.ports import free_port
    from tests.conftest import mosquitto_binary

    service = SERVICES["broker-certs"]
    args = service["command"][service["command"].index("tasks.brokers.certs") + 1:]
    certs_mount = next(v.split(":")[1] for v in service["volumes"] if v.startswith("broker-tls:"))
    broker_mount = next(v.split(":")[1] for v in SERVICES["mosquitto"]["volumes"]
                        if v.startswith("broker-tls:"))
    ca_mount = next(v.split(":")[1] for v in service["volumes"] if v.startswith("broker-ca:"))
    driver_mount = next(v.split(":")[1] for v in SERVICES["driver1"]["volumes"]
                        if v.startswith("broker-ca:"))
    for name, other in SERVICES.items():  # the server's key reaches the broker alone
        assert name in ("broker-certs", "mosquitto") or not any(
            v.startswith("broker-tls:") for v in other.get("volumes", [])), name
    conf = (REPO / "infra/docker/mosquitto.conf").read_text()
    tls = load_catalog(REPO / "scenarios")["messagesight_connburst_tls"].connection.tls
    assert Path(tls.ca_file).parent == Path(driver_mount)
    assert f"listener {tls.port} 0.0.0.0" in conf

    base = Path(tempfile.mkdtemp(prefix="perfpipe-compose-tls-", dir="/var/tmp"))
    base.chmod(0o755)  # Mosquitto drops to its own user, which must reach the files
    try:
        certs, ca = base / "certs", base / "ca"
        owner = str(pwd.getpwnam("mosquitto").pw_uid)  # compose: the image's mosquitto, 1883
        args = [str(certs) if a == certs_mount else str(ca) if a == ca_mount
                else owner if a == "1883" else a for a in args]
        assert certs_main(args) == 0
        assert [p.name for p in ca.iterdir()] == [Path(tls.ca_file).name]
        for path in re.findall(rf"{broker_mount}/\S+", conf):
            assert (certs / Path(path).name).is_file(), path
        assert (certs / Path(tls.ca_file).name).read_bytes() == (certs / "ca.pem").read_bytes()
        made = {p: p.stat().st_mtime_ns for p in [*certs.iterdir(), *ca.iterdir()]}
        assert certs_main(args) == 0  # a second run keeps the files the broker already has
        assert {p: p.stat().st_mtime_ns for p in [*certs.iterdir(), *ca.iterdir()]} == made

        port, tls_port = free_port(), free_port()
        local = (conf.replace("listener 1883 0.0.0.0", f"listener {port} 127.0.0.1")
                 .replace(f"listener {tls.port} 0.0.0.0", f"listener {tls_port} 127.0.0.1")
                 .replace(broker_mount, str(certs)))
        (base / "mosquitto.conf").write_text(local)
        with open(base / "mosquitto.log", "w") as log:
            broker = subprocess.Popen([mosquitto_binary(), "-c", str(base / "mosquitto.conf")],
                                      stdout=log, stderr=subprocess.STDOUT)
        try:
            context = ssl.create_default_context(cafile=str(ca / Path(tls.ca_file).name))
            deadline = time.monotonic() + 10
            while True:
                try:
                    raw = socket.create_connection(("127.0.0.1", tls_port), timeout=2)
                    break
                except OSError:
                    assert time.monotonic() < deadline, (base / "mosquitto.log").read_text()
                    time.sleep(0.05)
            with context.wrap_socket(raw, server_hostname="mosquitto") as tls_sock:
                # CONNECT, MQTT 3.1.1, clean session, keepalive 10 s, client id "t"
                tls_sock.sendall(bytes([0x10, 13, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 10, 0, 1])
                                 + b"t")
                assert tls_sock.recv(4) == bytes([0x20, 2, 0, 0])  # CONNACK, accepted
        finally:
            broker.kill()
            broker.wait(5)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- as careful as Airflow 3's compose file -------------------------------------------------

# A service others wait for to complete is a one-shot job; every other one runs for good.
def waits(service: str) -> dict[str, dict]:
    """depends_on as a mapping (a bare list, which waits for nothing, as no conditions)."""
    depends = SERVICES[service].get("depends_on") or {}
    return depends if isinstance(depends, dict) else {name: {} for name in depends}


ONE_SHOT = {target for name in SERVICES for target, dep in waits(name).items()
            if dep.get("condition") == "service_completed_successfully"}
LONG_RUNNING = [name for name in SERVICES if name not in ONE_SHOT]
AIRFLOW_SERVICES = [name for name in AIRFLOW if name not in ONE_SHOT]
AIRFLOW_PKG = Path(importlib.util.find_spec("airflow").submodule_search_locations[0])
AIRFLOW_OPTIONS = yaml.safe_load((AIRFLOW_PKG / "config_templates" / "config.yml").read_text())


def command(service: str) -> str:
    value = SERVICES[service].get("command", "")
    return (" ".join(value) if isinstance(value, list) else value).strip()


def healthcheck(service: str) -> str:
    """The check's command line, as the container runs it (compose's $$ is a literal $)."""
    test = (SERVICES[service].get("healthcheck") or {}).get("test", [])
    return (" ".join(test[1:]) if isinstance(test, list) else test).replace("$$", "$")


def airflow_option(service: str, section: str, key: str) -> str:
    """What an Airflow service gets for [section] key: its env, else Airflow's default."""
    return env(service).get(f"AIRFLOW__{section.upper()}__{key.upper()}",
                            str(AIRFLOW_OPTIONS[section]["options"][key]["default"]))


def interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose's variable substitution: ${VAR}, ${VAR:-default}, ${VAR:?error}, $$."""
    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if environ.get(name):
            return environ[name]
        assert op != ":?", f"compose would stop: {arg}"
        return arg if op == ":-" else ""
    return re.sub(r"\$\$|\$\{(\w+)(?:(:[?-])([^}]*))?\}", one, value)


def test_the_file_has_no_duplicate_keys():
    """Compose rejects a mapping with a key twice; PyYAML silently keeps the last one.
    Checked on the composed node tree, where merge keys (<<) are not yet applied."""
    pending = [yaml.compose((REPO / "docker-compose.yml").read_text())]
    while pending:
        node = pending.pop()
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
            duplicated = {k for k in keys if keys.count(k) > 1}
            assert not duplicated, f"line {node.start_mark.line + 1}: {duplicated}"
            pending += [v for _, v in node.value]
        elif isinstance(node, yaml.SequenceNode):
            pending += node.value


def test_long_running_services_have_a_healthcheck_and_a_restart_policy():
    assert ONE_SHOT == {"airflow-init", "broker-certs"}
    for name in LONG_RUNNING:
        service = SERVICES[name]
        test = (service.get("healthcheck") or {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL") and healthcheck(name), f"{name}: {test}"
        assert service.get("restart") in ("always", "unless-stopped"), name
    for name in ONE_SHOT:  # restarted, a one-shot job would run again and again
        assert SERVICES[name].get("restart", "no") in ("no", "on-failure"), name


def test_every_wait_is_on_a_condition_the_target_can_meet():
    for name, service in SERVICES.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: a bare list only orders the starts"
        for target, dep in depends.items():
            assert target in SERVICES, (name, target)
            condition = dep.get("condition")
            if condition == "service_healthy":
                assert SERVICES[target].get("healthcheck"), (name, target)
            else:
                assert condition == "service_completed_successfully", (name, target, condition)


def test_airflow_services_wait_for_init_and_healthy_databases():
    airflow = env("airflow-scheduler")
    needed = {urlsplit(expand(airflow[key]).removeprefix("db+")).hostname for key in (
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL",
        "AIRFLOW__CELERY__RESULT_BACKEND")}
    needed.add(json.loads(expand(airflow["AIRFLOW_CONN_PERFPIPE_RESULTS"]))["host"])
    assert needed == {"airflow-db", "results-db", "redis"}
    assert set(AIRFLOW_SERVICES) == {"airflow-apiserver", "airflow-scheduler",
                                     "airflow-dag-processor", "airflow-triggerer",
                                     "airflow-worker"}
    for name in AIRFLOW_SERVICES + ["airflow-init"]:
        depends = waits(name)
        for db in needed:
            assert depends.get(db) == {"condition": "service_healthy"}, (name, db)
        if name != "airflow-init":
            assert depends.get("airflow-init") == {
                "condition": "service_completed_successfully"}, name
    # the worker runs tasks, which report through the api-server's execution API
    api = urlsplit(airflow["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]).hostname
    assert waits("airflow-worker").get(api) == {"condition": "service_healthy"}


def listening_ports(name: str) -> set[int]:
    """The ports a service's server listens on, from where that server takes them."""
    service = SERVICES[name]
    ports = {int(str(p).split(":")[-1]) for p in service.get("ports", [])}  # container side
    image = service.get("image", "")
    if name in AIRFLOW_SERVICES and command(name).endswith("airflow api-server"):
        ports.add(int(airflow_option(name, "api", "port")))
    if name in AIRFLOW_SERVICES and command(name) == "airflow scheduler":
        if airflow_option(name, "scheduler", "enable_health_check").lower() == "true":
            ports.add(int(airflow_option(name, "scheduler", "scheduler_health_check_server_port")))
    if image.startswith("apache/spark:") and "deploy.worker.Worker" in command(name):
        ports.add(int(env(name).get("SPARK_WORKER_WEBUI_PORT", 8081)))
    if image.startswith("eclipse-mosquitto:"):
        conf = next(v.split(":")[0] for v in service["volumes"] if "mosquitto.conf" in v)
        ports |= {int(p) for p in re.findall(r"^listener (\d+)", (REPO / conf).read_text(), re.M)}
    if "driver.Dockerfile" in (service.get("build") or {}).get("dockerfile", ""):
        sshd = (REPO / "infra/docker/sshd_config").read_text()
        ports.add(int(m.group(1)) if (m := re.search(r"^Port (\d+)", sshd, re.M)) else 22)
    return ports


PROBE = re.compile(r"://(?P<h1>[^/:\s]+):(?P<p1>\d+)"  # an HTTP URL
                   r"|/dev/tcp/(?P<h2>[^/\s]+)/(?P<p2>\d+)"  # bash's TCP connect
                   r"|\s-h\s+(?P<h3>\S+)\s+-p\s+(?P<p3>\d+)"  # mosquitto_sub
                   r"|\(\s*'(?P<h4>[^']+)',\s*(?P<p4>\d+)\s*\)")  # Python's socket


def test_healthchecks_probe_ports_the_service_itself_listens_on():
    probed_somewhere = set()
    for name in LONG_RUNNING:
        probes = [(m["h1"] or m["h2"] or m["h3"] or m["h4"], int(m["p1"] or m["p2"] or m["p3"] or m["p4"]))
                  for m in PROBE.finditer(" " + healthcheck(name))]
        listening = listening_ports(name)
        assert bool(probes) == bool(listening), f"{name}: probes {probes}, listens on {listening}"
        for host, port in probes:
            assert host in ("localhost", "127.0.0.1", "${HOSTNAME}"), f"{name} probes {host}"
            assert port in listening, f"{name} probes {port}, listens on {listening}"
            probed_somewhere.add(name)
    assert {"airflow-apiserver", "airflow-scheduler", "spark-master", "spark-worker",
            "mosquitto", "driver1", "driver2"} <= probed_somewhere
    assert "/api/v2/version" in healthcheck("airflow-apiserver")  # unauthenticated
    assert healthcheck("airflow-scheduler").endswith("/health")


def test_the_other_airflow_healthchecks_ask_airflow_and_celery():
    from airflow.cli.cli_config import ARG_JOB_TYPE_FILTER

    for name in ("airflow-dag-processor", "airflow-triggerer"):
        found = re.search(r"airflow jobs check --job-type (\w+) --hostname \"\$\{HOSTNAME\}\"",
                          healthcheck(name))
        assert found, healthcheck(name)
        job_type = found.group(1)
        assert job_type in ARG_JOB_TYPE_FILTER.kwargs["choices"], job_type
        assert job_type.removesuffix("Job").lower() == command(name).split()[-1].replace("-", "")
    worker = healthcheck("airflow-worker")
    assert "celery_executor.app inspect ping" in worker and '"celery@${HOSTNAME}"' in worker
    for name in ("airflow-db", "results-db"):
        db = env(name)
        assert healthcheck(name) == f"pg_isready -U {db['POSTGRES_USER']} -d {db['POSTGRES_DB']}"
    assert healthcheck("redis") == "redis-cli ping"


def test_airflow_settings_are_options_airflow_knows():
    """A misspelt AIRFLOW__SECTION__KEY is silently ignored by Airflow."""
    for name in AIRFLOW:
        for key in env(name):
            if key.startswith("AIRFLOW__") and not key.startswith("AIRFLOW__CELERY__"):
                section, option = key[9:].lower().split("__")
                assert option in AIRFLOW_OPTIONS[section]["options"], f"{name}: {key}"


def test_airflow_logs_go_to_a_volume_every_airflow_service_mounts():
    for name in AIRFLOW:
        folder = env(name)["AIRFLOW__LOGGING__BASE_LOG_FOLDER"]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES[name]["volumes"]}
        assert folder in mounts, f"{name} logs to {folder}, not on a volume"
        assert mounts[folder] in COMPOSE["volumes"], mounts[folder]  # named, kept


SECRET = re.compile(r"PASSWORD|SECRET|TOKEN", re.I)
REFERENCE = re.compile(r"\$\{\w+(:\?[^}]*|:-)?\}")  # a variable, required or empty by default


def test_no_password_is_written_in_the_file():
    """Passwords, secrets and tokens are variables (required, or empty), never literals:
    in env values, in connection URLs and in JSON connections."""
    seen = 0
    for name in SERVICES:
        for key, value in env(name).items():
            if SECRET.search(key) and not key.endswith("_FILE"):  # not a file's path
                assert REFERENCE.fullmatch(value), f"{name}: {key}={value}"
                seen += 1
            if "://" in value:
                password = urlsplit(value.removeprefix("db+")).password
                assert password is None or REFERENCE.fullmatch(password), f"{name}: {key}"
            if value.startswith("{"):
                secret = {k: v for k, v in json.loads(value).items() if SECRET.search(k)}
                assert all(REFERENCE.fullmatch(v) for v in secret.values()), f"{name}: {key}"
    assert seen >= 5
    assert env("airflow-apiserver")["AIRFLOW_ADMIN_PASSWORD"].startswith("${AIRFLOW_ADMIN_PASSWORD:?")
    assert all("AIRFLOW_ADMIN_PASSWORD" not in env(n) for n in SERVICES if n != "airflow-apiserver")


@pytest.mark.xdist_group("airflow-db")
def test_the_admin_logs_in_with_the_password_from_the_environment(tmp_path: Path):
    """The api-server's own command writes the passwords file before `airflow api-server`;
    then Airflow's simple auth manager, configured as compose configures it, generates and
    prints nothing, and its login service takes that password for an admin, and no other."""
    service = SERVICES["airflow-apiserver"]
    assert service["command"][:2] == ["bash", "-c"]
    script, last = service["command"][2].rstrip().rsplit("\n", 1)
    assert last == "exec airflow api-server"
    password = "pw-" + os.urandom(8).hex()
    compose_env = {"AIRFLOW_ADMIN_PASSWORD": password, "AIRFLOW_JWT_SECRET": os.urandom(32).hex(),
                   "AIRFLOW_DB_PASSWORD": "x", "RESULTS_DB_PASSWORD": "x"}
    environ = {k: interpolate(v, compose_env) for k, v in env("airflow-apiserver").items()
               if k.startswith(("AIRFLOW__CORE__", "AIRFLOW__API_AUTH__", "AIRFLOW_ADMIN"))}
    assert environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(tmp_path / "passwords.json")
    # the tests' Airflow home (its metadata DB holds the revoked-tokens table a login reads)
    environ |= {"AIRFLOW_HOME": os.environ["AIRFLOW_HOME"], "PATH": os.environ["PATH"]}
    written = subprocess.run(["bash", "-c", script], env=environ, capture_output=True, text=True)
    assert written.returncode == 0 and not written.stdout + written.stderr, written
    assert (tmp_path / "passwords.json").stat().st_mode & 0o077 == 0  # owner only

    check = f"""
import asyncio
from fastapi import HTTPException
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.datamodels.login import LoginBody
from airflow.api_fastapi.auth.managers.simple.services.login import SimpleAuthManagerLogin
manager = create_auth_manager()
manager.init()
token = SimpleAuthManagerLogin.create_token(LoginBody(username="admin", password={password!r}))
user = asyncio.run(manager.get_user_from_token(token))
print("LOGIN", user.get_name(), user.role)
for name, wrong in (("admin", "airflow"), ("airflow", {password!r})):
    try:
        SimpleAuthManagerLogin.create_token(LoginBody(username=name, password=wrong))
        print("ACCEPTED", name)
    except HTTPException as exc:
        print("REFUSED", exc.status_code)
"""
    out = subprocess.run([sys.executable, "-c", check], env=environ, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-4:] == ["LOGIN admin admin", "REFUSED 401", "REFUSED 401", ""], out.stdout
    assert password not in out.stdout + out.stderr  # nothing printed or logged it

"""docker-compose.yml, checked as a file (no Docker engine here): it parses, images are
pinned, every path it mounts or builds from exists, every setting the code reads is
provided, and the services agree on their connection strings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tasks.catalog.inventory import load_inventory
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
    from tests.conftest import free_port, mosquitto_binary

    service = SERVICES["broker-certs"]
    args = service["command"][service["command"].index("tasks.brokers.certs") + 1:]
    certs_mount = next(v.split(":")[1] for v in service["volumes"] if v.startswith("broker-tls:"))
    broker_mount = next(v.split(":")[1] for v in SERVICES["mosquitto"]["volumes"]
                        if v.startswith("broker-tls:"))
    driver_mount = next(v.split(":")[1] for v in SERVICES["driver1"]["volumes"]
                        if v.startswith("broker-tls:"))
    conf = (REPO / "infra/docker/mosquitto.conf").read_text()
    tls = load_catalog(REPO / "scenarios")["messagesight_connburst_tls"].connection.tls
    assert Path(tls.ca_file).parent == Path(driver_mount)
    assert f"listener {tls.port} 0.0.0.0" in conf

    base = Path(tempfile.mkdtemp(prefix="perfpipe-compose-tls-", dir="/var/tmp"))
    base.chmod(0o755)  # Mosquitto drops to its own user, which must reach the files
    try:
        certs = base / "certs"
        owner = str(pwd.getpwnam("mosquitto").pw_uid)  # compose: the image's mosquitto, 1883
        args = [str(certs) if a == certs_mount else owner if a == "1883" else a for a in args]
        assert certs_main(args) == 0
        for path in re.findall(rf"{broker_mount}/\S+", conf):
            assert (certs / Path(path).name).is_file(), path
        assert (certs / Path(tls.ca_file).name).read_bytes() == (certs / "ca.pem").read_bytes()
        made = {p.name: p.stat().st_mtime_ns for p in certs.iterdir()}
        assert certs_main(args) == 0  # a second run keeps the files the broker already has
        assert {p.name: p.stat().st_mtime_ns for p in certs.iterdir()} == made

        port, tls_port = free_port(), free_port()
        local = (conf.replace("listener 1883 0.0.0.0", f"listener {port} 127.0.0.1")
                 .replace(f"listener {tls.port} 0.0.0.0", f"listener {tls_port} 127.0.0.1")
                 .replace(broker_mount, str(certs)))
        (base / "mosquitto.conf").write_text(local)
        with open(base / "mosquitto.log", "w") as log:
            broker = subprocess.Popen([mosquitto_binary(), "-c", str(base / "mosquitto.conf")],
                                      stdout=log, stderr=subprocess.STDOUT)
        try:
            context = ssl.create_default_context(cafile=str(certs / Path(tls.ca_file).name))
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

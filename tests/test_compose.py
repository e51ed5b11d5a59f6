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

from tasks.inventory import load_inventory
from tasks.settings import Settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
AIRFLOW = [name for name, s in SERVICES.items() if s.get("image", "").startswith("perfpipe-airflow")]
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

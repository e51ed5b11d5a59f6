"""EMQX 5: a configuration-only adapter (EMQX runs from its container image, not on a host).

It can:
- render the benchmark's EMQX settings as the image's environment overrides
  (``EMQX_<PATH>__<KEY>``), a compose service and the ``docker run`` line, pinned to the
  image docker-compose.yml runs (``IMAGE``); ``python -m tasks.brokers.render emqx``;
- with ``managed: false``: health-check with an MQTT CONNECT, read the version from the
  dashboard listener's unauthenticated ``GET /status?format=json`` (``rel_vsn``) or else
  from ``$SYS/brokers/<node>/version``, and snapshot ``$SYS/brokers/+/stats/#``. EMQX's
  default authorization lets only 127.0.0.1 subscribe to ``$SYS/#``, so from a driver
  host the HTTP status is what answers.

It cannot start or stop EMQX (``managed: true`` fails with the fix) nor read per-client
queue depth (that needs the authenticated REST API).

Benchmark settings, each against a default that would distort a measurement:
- ``mqtt.max_mqueue_len`` 1000000 (default 1000: a subscriber's queue beyond that drops
  messages; a benchmark must see that as backlog, the validity gate then judges it);
- ``force_shutdown.enable`` false (default: a client process whose mailbox passes 1000
  messages is shut down: a slow fan-in subscriber would be disconnected mid-stage);
- ``sys_topics.sys_msg_interval`` 1s (default 1m), like Mosquitto's ``sys_interval 1``.
"""

from __future__ import annotations

from .base import url_host
from .config_only import ConfigOnlyBroker, http_json
from .sys_topics import version_number

IMAGE = "emqx/emqx:5.8.6"  # docker-compose.yml's emqx service (tests check they agree)
DASHBOARD_PORT = 18083


def environment(mqtt_port: int = 1883, dashboard_port: int = DASHBOARD_PORT) -> dict[str, str]:
    """The image's environment overrides for a benchmark (docker-compose.yml's emqx
    service has them too): queues that hold rather than drop, no forced shutdown of a slow
    subscriber, $SYS every second, and the Erlang VM's Prometheus collectors the adapter's
    CPU and memory come from (disabled by default: the columns were empty)."""
    return {
        "EMQX_LISTENERS__TCP__DEFAULT__BIND": f"0.0.0.0:{mqtt_port}",
        "EMQX_MQTT__MAX_MQUEUE_LEN": "1000000",
        "EMQX_FORCE_SHUTDOWN__ENABLE": "false",
        "EMQX_SYS_TOPICS__SYS_MSG_INTERVAL": "1s",
        "EMQX_DASHBOARD__LISTENERS__HTTP__BIND": str(dashboard_port),
        "EMQX_PROMETHEUS__COLLECTORS__VM_STATISTICS": "enabled",
        "EMQX_PROMETHEUS__COLLECTORS__VM_MEMORY": "enabled",
        "EMQX_LOG__CONSOLE__LEVEL": "warning",
    }


def parse_status(body: dict | None) -> str | None:
    """The version in EMQX's JSON status (``rel_vsn`` such as "v5.8.6"), or None."""
    if not body or body.get("app_status") not in (None, "running"):
        return None
    return version_number(str(body.get("rel_vsn", "")))


class Emqx(ConfigOnlyBroker):
    kind = "emqx"
    title = "EMQX"
    managed_fix = (f"run the {IMAGE} image (docker-compose.yml's emqx service; settings from "
                   f"`python -m tasks.brokers.render emqx`) and set managed: false with its "
                   f"address and port")
    sys_stats_topics = ("$SYS/brokers/+/stats/#",)
    version_topics = ("$SYS/brokers/+/version",)  # not Mosquitto's $SYS/broker/version
    process_pattern = r"beam\.smp.*emqx"
    # /api/v5/prometheus/stats on the dashboard port (the erlang_vm_* collectors must be
    # enabled for the node's CPU: prometheus.collectors.vm_statistics = enabled)
    metrics_port = DASHBOARD_PORT
    metrics_path = "/api/v5/prometheus/stats"
    prometheus = {"cpu_seconds": "erlang_vm_statistics_runtime_milliseconds*0.001",
                  "rss_bytes": "erlang_vm_memory_bytes_total",
                  "connections": "emqx_connections_count",
                  "delivered": "emqx_messages_delivered"}

    def version(self) -> str:
        address = getattr(self.host, "address", "127.0.0.1")
        return parse_status(http_json(f"http://{url_host(address)}:{DASHBOARD_PORT}"
                                      f"/status?format=json")) or "unknown"

    def probe_version(self, address: str, port: int, dashboard_port: int = DASHBOARD_PORT) -> str:
        found = parse_status(http_json(f"http://{url_host(address)}:{dashboard_port}"
                                       f"/status?format=json"))
        return found or super().probe_version(address, port)  # else its $SYS version

    def render(self, port: int = 1883, dashboard_port: int = DASHBOARD_PORT) -> dict[str, str]:
        if not 1 <= int(port) <= 65535 or not 1 <= int(dashboard_port) <= 65535:
            raise ValueError(f"port {port} / dashboard_port {dashboard_port}: must be 1..65535")
        env = environment(port, dashboard_port)
        compose = "\n".join([
            "# perfpipe: EMQX under test; then broker: {kind: emqx, managed: false, ...}",
            "services:",
            "  emqx:",
            f"    image: {IMAGE}",
            f'    ports: ["{port}:{port}", "{dashboard_port}:{dashboard_port}"]',
            "    environment:",
            *(f'      {k}: "{v}"' for k, v in env.items()),
            "",
        ])
        run = " ".join(["docker run -d --name perfpipe-emqx",
                        f"-p {port}:{port} -p {dashboard_port}:{dashboard_port}",
                        *(f"-e {k}={v}" for k, v in env.items()), IMAGE])
        return {"emqx.env": "".join(f"{k}={v}\n" for k, v in env.items()),
                "docker-compose.emqx.yml": compose, "docker-run.sh": run + "\n"}

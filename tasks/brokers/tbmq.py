"""TBMQ (ThingsBoard's MQTT broker): a configuration-only adapter.

TBMQ is a JVM service that needs Kafka and PostgreSQL (and Redis from 1.4's compose on)
beside it; it runs from its images, not on a host perfpipe manages.

It can:
- render a single-node compose file pinned to the images of TBMQ's own single-node
  compose (release 1.4.0: ``thingsboard/tbmq:1.4.0``, postgres 15, bitnami/kafka 3.5.1,
  bitnami/redis 7.0) with the benchmark's settings as TBMQ environment variables;
  ``python -m tasks.brokers.render tbmq``;
- with ``managed: false``: health-check with an MQTT CONNECT (anonymous:
  ``SECURITY_MQTT_BASIC_ENABLED`` is false in the rendered file).

It cannot start or stop TBMQ (``managed: true`` fails with the fix), and it cannot tell
the version: TBMQ publishes no ``$SYS`` topics and its REST API needs a login, so the
run records "unknown" (check the image tag in the rendered file).
"""

from __future__ import annotations

from .config_only import ConfigOnlyBroker

IMAGE = "thingsboard/tbmq:1.4.0"
POSTGRES_IMAGE = "postgres:15"
KAFKA_IMAGE = "bitnami/kafka:3.5.1"
REDIS_IMAGE = "bitnami/redis:7.0"
HTTP_PORT = 8083


def environment(mqtt_port: int = 1883, heap: str = "2048M") -> dict[str, str]:
    return {
        "TB_SERVICE_ID": "tbmq",
        "SPRING_DATASOURCE_URL": "jdbc:postgresql://postgres:5432/thingsboard_mqtt_broker",
        "SPRING_DATASOURCE_USERNAME": "postgres",
        "SPRING_DATASOURCE_PASSWORD": "postgres",
        "TB_KAFKA_SERVERS": "kafka:9092",
        "REDIS_HOST": "redis",
        "LISTENER_TCP_ENABLED": "true",
        "LISTENER_TCP_BIND_PORT": str(mqtt_port),
        # anonymous clients, like the other brokers under test
        "SECURITY_MQTT_BASIC_ENABLED": "false",
        "JAVA_OPTS": f"-Xms{heap} -Xmx{heap} -XX:+AlwaysPreTouch",
    }


class Tbmq(ConfigOnlyBroker):
    kind = "tbmq"
    title = "TBMQ"
    process_pattern = r"java .*(tbmq|thingsboard)"
    # Spring Boot's actuator (METRICS_ENABLED=true): process_cpu_usage is the JVM's share
    # of all the host's CPUs
    metrics_port = 8083
    metrics_path = "/actuator/prometheus"
    prometheus = {"cpu_pct": "process_cpu_usage*system_cpu_count*100",
                  "rss_bytes": "jvm_memory_used_bytes"}
    managed_fix = (f"run {IMAGE} with its Kafka, PostgreSQL and Redis (`python -m "
                   f"tasks.brokers.render tbmq` writes the compose file) and set managed: false "
                   f"with its address and port")

    def probe_version(self, address: str, port: int) -> str:
        return "unknown"  # no $SYS, and the REST API needs a login

    def stats(self, address: str, port: int, wait_s: float = 0.0) -> dict[str, str]:
        return {}

    def render(self, port: int = 1883, heap: str = "2048M") -> dict[str, str]:
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"port {port}: must be 1..65535")
        env = environment(port, heap)
        compose = "\n".join([
            "# perfpipe: single-node TBMQ under test (images of TBMQ's release-1.4.0 compose).",
            "# docker compose up -d: on its first start the tbmq image creates its database",
            "# schema (start-tbmq.sh runs install-tbmq.sh once).",
            "# Then broker: {kind: tbmq, managed: false, address: <this host>, port: "
            f"{port}}}",
            "services:",
            "  postgres:",
            f"    image: {POSTGRES_IMAGE}",
            "    environment: {POSTGRES_DB: thingsboard_mqtt_broker, POSTGRES_PASSWORD: postgres}",
            "  kafka:",
            f"    image: {KAFKA_IMAGE}",
            "    environment:",
            "      KAFKA_CFG_NODE_ID: 0",
            "      KAFKA_CFG_PROCESS_ROLES: controller,broker",
            "      KAFKA_CFG_CONTROLLER_QUORUM_VOTERS: 0@kafka:9093",
            "      KAFKA_CFG_LISTENERS: PLAINTEXT://:9092,CONTROLLER://:9093",
            "      KAFKA_CFG_ADVERTISED_LISTENERS: PLAINTEXT://:9092",
            "      KAFKA_CFG_LISTENER_SECURITY_PROTOCOL_MAP: CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "      KAFKA_CFG_CONTROLLER_LISTENER_NAMES: CONTROLLER",
            "      KAFKA_CFG_INTER_BROKER_LISTENER_NAME: PLAINTEXT",
            "  redis:",
            f"    image: {REDIS_IMAGE}",
            '    environment: {ALLOW_EMPTY_PASSWORD: "yes"}',
            "  tbmq:",
            f"    image: {IMAGE}",
            "    depends_on: [postgres, kafka, redis]",
            f'    ports: ["{port}:{port}", "{HTTP_PORT}:{HTTP_PORT}"]',
            "    environment:",
            *(f'      {k}: "{v}"' for k, v in env.items()),
            "",
        ])
        return {"docker-compose.tbmq.yml": compose,
                "tbmq.env": "".join(f"{k}={v}\n" for k, v in env.items())}

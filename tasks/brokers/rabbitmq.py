"""RabbitMQ with its MQTT plugin (Debian's rabbitmq-server package): a broker that runs here.

perfpipe never touches the packaged service. It starts a private node for the run:

- its own node name (``perfpipe-<mqtt port>@localhost``), and everything under
  ``<run dir>/broker``: rabbitmq.conf, enabled_plugins (``[rabbitmq_mqtt,
  rabbitmq_prometheus].``: the bundled Prometheus endpoint is the node's own view of its
  CPU, memory, connections and queue depth, read while stages run), an empty
  rabbitmq-env.conf (so /etc/rabbitmq is not read), Mnesia, logs, the Erlang cookie
  (``HOME`` is that folder) and the pid file;
- its own ports, each chosen free on the host: MQTT (the run's broker port) and its
  Prometheus endpoint (on the same address), AMQP and Erlang distribution (both on
  loopback only), and an epmd of its own on a private port
  started in the broker's process group. The system epmd (4369), if one runs, is never
  used, started or stopped.

**Start is slow**: the Erlang VM boots, creates Mnesia and enables the plugin before the
MQTT listener opens, 5-15 s on a small machine (tests/test_rabbitmq.py measures it); the
health check (a real MQTT CONNECT) waits up to 90 s. Stop sends TERM to the process group
(the node shuts down cleanly in 2-3 s), KILLs what is left after the timeout, and checks
that nothing of the session and no epmd on its private port remains.

What the MQTT plugin of 3.10 does and does not: MQTT 3.1/3.1.1 only; anonymous clients
are mapped to the ``guest`` user (allowed from other hosts for this private node only);
QoS 2 is downgraded to QoS 1 (a QoS 2 subscription is granted QoS 1, so a QoS 2 stage
measures at-least-once delivery). ``stats`` reads queue depth with rabbitmqctl.
"""

from __future__ import annotations

import json
import re
import time

from ..rundir import BROKER_DIR
from .base import BrokerAdapter
from .errors import BrokerError
from .health import Launched, bind_address, health_check

LIB = "/usr/lib/rabbitmq/lib"
SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
START_TIMEOUT_S = 90.0
PLUGINS = "[rabbitmq_mqtt,rabbitmq_prometheus].\n"

# Run by the launched process group: a private epmd first (same group, so stopping the
# group stops it), then the server in its place. Values come from the environment.
START_SCRIPT = """epmd -port "$ERL_EPMD_PORT" -address 127.0.0.1 &
epmd_pid=$!
i=0
until epmd -port "$ERL_EPMD_PORT" -names >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -gt 100 ] || ! kill -0 "$epmd_pid" 2>/dev/null; then
    echo "perfpipe: epmd did not start on port $ERL_EPMD_PORT" >&2
    exit 70
  fi
  sleep 0.1
done
kill -0 "$epmd_pid" 2>/dev/null || { echo "perfpipe: port $ERL_EPMD_PORT is taken" >&2; exit 70; }
exec "$PERFPIPE_RABBITMQ_SERVER"
"""


def render_config(bind: str, mqtt_port: int, amqp_port: int, metrics_port: int) -> str:
    """rabbitmq.conf for benchmarking: MQTT on the run's port, AMQP on loopback only, the
    Prometheus endpoint (the node's own statistics) on the MQTT address."""
    return "\n".join([
        "# perfpipe: a private RabbitMQ node for one run (MQTT plugin); see tasks/brokers/rabbitmq.py",
        f"listeners.tcp.default = 127.0.0.1:{amqp_port}",
        f"mqtt.listeners.tcp.default = {bind}:{mqtt_port}",
        "mqtt.allow_anonymous = true",
        "mqtt.default_user = guest",
        "mqtt.default_pass = guest",
        "mqtt.vhost = /",
        "mqtt.exchange = amq.topic",
        "mqtt.tcp_listen_options.backlog = 4096",
        "mqtt.tcp_listen_options.nodelay = true",
        f"prometheus.tcp.ip = {bind}",
        f"prometheus.tcp.port = {metrics_port}",
        "# drivers on other hosts connect as the anonymous (guest) user of this private node",
        "loopback_users.guest = false",
        "# a full disk must fail the run, not throttle publishers silently",
        "disk_free_limit.absolute = 50MB",
        "log.console = false",
        "log.file.level = warning",
        "",
    ])


def node_name(mqtt_port: int) -> str:
    return f"perfpipe-{mqtt_port}@localhost"


def node_env(base: str, node: str, epmd_port: int) -> dict[str, str]:
    """What both the server and rabbitmqctl need to find this node and nothing else."""
    return {
        "HOME": base,  # the Erlang cookie lives here, not in the user's home
        "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_USE_LONGNAME": "false",
        "RABBITMQ_CONF_ENV_FILE": f"{base}/rabbitmq-env.conf",
        "RABBITMQ_ENABLED_PLUGINS_FILE": f"{base}/enabled_plugins",
    }


def server_env(base: str, node: str, ports: dict[str, int]) -> dict[str, str]:
    return {
        **node_env(base, node, ports["epmd"]),
        "RABBITMQ_CONFIG_FILE": f"{base}/rabbitmq.conf",
        "RABBITMQ_ADVANCED_CONFIG_FILE": f"{base}/advanced.config",
        "RABBITMQ_MNESIA_BASE": f"{base}/mnesia",
        "RABBITMQ_LOG_BASE": f"{base}/log",
        "RABBITMQ_PID_FILE": f"{base}/rabbitmq.pid",
        "RABBITMQ_NODE_PORT": str(ports["amqp"]),
        "RABBITMQ_DIST_PORT": str(ports["dist"]),
        # never start a second (daemon) epmd; distribution only on loopback
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
            "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}",
        "PERFPIPE_RABBITMQ_SERVER": SERVER,
    }


def parse_version(listing: str) -> str | None:
    """The version in a listing of LIB (``rabbitmq_server-3.10.8``), or None."""
    found = re.findall(r"rabbitmq_server-(\d+\.\d+[\w.+-]*)", listing)
    return found[-1] if found else None


class RabbitMQ(BrokerAdapter):
    kind = "rabbitmq"
    title = "RabbitMQ"
    process_pattern = r"beam\.smp.*\brabbit\b"  # the Erlang VM of a node (epmd apart)
    # the bundled rabbitmq_prometheus plugin: the node's CPU is the Erlang runtime's own
    # account of its CPU time (statistics(runtime)), which is user CPU only: it matched
    # /proc's user CPU of the node within 1% and left out its system time (here about a
    # third of the total at 500 msg/s). So a node costed from this endpoint alone reads
    # low, consistently night to night; give it a host to count system time too. The
    # backlog is the messages in its queues (one per MQTT subscription).
    metrics_port = 15692
    prometheus = {"cpu_seconds": "erlang_vm_statistics_runtime_milliseconds*0.001",
                  "rss_bytes": "rabbitmq_process_resident_memory_bytes",
                  "connections": "rabbitmq_connections", "backlog": "rabbitmq_queue_messages",
                  "delivered": "rabbitmq_global_messages_delivered_total"}

    def version(self) -> str:
        """The installed server's version (from the package's library folder)."""
        listing = self.host.run(["ls", "-1", LIB], check=False).stdout
        version = parse_version(listing)
        plugin = version and self.host.exists(f"{LIB}/rabbitmq_server-{version}/plugins/"
                                              f"rabbitmq_mqtt-{version}")
        if not version or not plugin or not self.host.exists(SERVER):
            raise BrokerError(f"{self.host.name}: RabbitMQ with its MQTT plugin is not installed "
                              f"(apt-get install rabbitmq-server, or `make deps`)")
        return version

    def _free_ports(self, taken: int, count: int) -> list[int]:
        ports: list[int] = []
        while len(ports) < count:
            port = self.host.free_port()
            if port != taken and port not in ports:
                ports.append(port)
        return ports

    def start(self, run_dir: str, address: str, port: int) -> dict:
        """Start a private node with the MQTT plugin; returns when it accepts MQTT CONNECT."""
        base = f"{run_dir}/{BROKER_DIR}"
        node = node_name(port)
        amqp, dist, epmd, metrics = self._free_ports(port, 4)
        ports = {"mqtt": port, "amqp": amqp, "dist": dist, "epmd": epmd, "metrics": metrics}
        for folder in (base, f"{base}/mnesia", f"{base}/log"):
            self.host.mkdir(folder)
        files = {"rabbitmq.conf": render_config(bind_address(address), port, amqp, metrics),
                 "enabled_plugins": PLUGINS, "rabbitmq-env.conf": ""}
        for name, text in files.items():
            self.host.put_text(text, f"{base}/{name}")
        env = server_env(base, node, ports)
        log = f"{base}/rabbitmq.log"
        started = time.monotonic()
        group = self.launch(["env", *(f"{k}={v}" for k, v in env.items()),
                             "sh", "-c", START_SCRIPT], log)
        try:
            connect_s = health_check(address, port, timeout_s=START_TIMEOUT_S,
                                     launched=Launched(self.host, log))
        except BrokerError as exc:
            self.stop(group, timeout_s=5)
            raise BrokerError(f"{self.host.name}: RabbitMQ did not accept MQTT on {port}: {exc}; "
                              f"see {log} and {base}/log/{node}.log") from None
        start_s = time.monotonic() - started
        pid = int(self.host.read_text(f"{base}/rabbitmq.pid").strip())  # the Erlang VM
        state = {"group_pid": group, "pid": pid, "config": f"{base}/rabbitmq.conf", "log": log,
                 "node": node, "base": base, "ports": ports, "metrics_port": metrics,
                 "start_s": round(start_s, 2),
                 "connect_s": round(connect_s, 4)}
        state["running_version"] = self.running_version(state)
        return state

    def ctl(self, state: dict, args: list[str], timeout: float = 60) -> str:
        """rabbitmqctl against this run's node (never the system one)."""
        env = node_env(state["base"], state["node"], state["ports"]["epmd"])
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), CTL, "-q", "-n", state["node"], *args]
        return self.host.run(argv, timeout=timeout).stdout

    def running_version(self, state: dict) -> str:
        return self.ctl(state, ["version"]).strip()

    def stats(self, state: dict) -> dict:
        """Queue depth of the running node: one queue per MQTT subscription."""
        rows = json.loads(self.ctl(state, ["list_queues", "name", "messages",
                                           "messages_unacknowledged", "consumers",
                                           "--formatter", "json"]) or "[]")
        depths = [int(r.get("messages") or 0) for r in rows]
        return {"queues": len(rows), "messages": sum(depths), "max_queue_depth": max(depths, default=0),
                "unacked": sum(int(r.get("messages_unacknowledged") or 0) for r in rows),
                "consumers": sum(int(r.get("consumers") or 0) for r in rows)}

    def session(self, group_pid: int) -> list[tuple[int, str]]:
        """(pid, command line) of every process still in the launched session."""
        out = self.host.run(["ps", "-o", "pid=,args=", "-s", str(group_pid)], check=False).stdout
        rows = [line.strip().split(None, 1) for line in out.splitlines() if line.strip()]
        return [(int(r[0]), r[1] if len(r) > 1 else "") for r in rows]

    def stop(self, group_pid: int, timeout_s: float = 30.0) -> None:
        """TERM the node's process group, KILL it after timeout_s, then check nothing is left."""
        members = self.session(group_pid)
        epmd_ports = {m.group(1) for _, args in members
                      if (m := re.search(r"\bepmd -port (\d+)", args))}
        self.host.kill_group(group_pid, "TERM")
        deadline = time.monotonic() + timeout_s
        while self.session(group_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.session(group_pid):
            self.host.kill_group(group_pid, "KILL")
            time.sleep(0.5)
        for epmd_port in epmd_ports:  # an epmd on the run's private port is the run's own
            if self.host.run(["epmd", "-port", epmd_port, "-names"], check=False).ok:
                self.host.run(["epmd", "-port", epmd_port, "-kill"], check=False)
        left = self.session(group_pid)
        if left:
            raise BrokerError(f"{self.host.name}: RabbitMQ processes survived KILL: {left}")

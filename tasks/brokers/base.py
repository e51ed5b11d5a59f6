"""What every broker adapter offers the pipeline, and the error they raise.

An adapter is one broker kind (`ADAPTERS` in `tasks.brokers` maps the inventory's
`broker.kind` to it), built on the inventory host that runs the broker, or on no host for
a broker perfpipe only reaches over the network. The broker step and teardown use only
the members below; an adapter overrides what its broker does differently. Adapters that
cannot start their broker here (IBM MQ, EMQX, TBMQ) derive from
`tasks.brokers.config_only.ConfigOnlyBroker`.
"""

from __future__ import annotations

from ..catalog.cpus import pinned
from ..hosts import Host
from .errors import BrokerError
from .health import health_check
from .sys_topics import sys_version

__all__ = ["BrokerAdapter", "BrokerError"]


class BrokerAdapter:
    kind = ""  # the inventory's broker.kind
    title = ""  # the broker's name for people
    supports_tls = False  # the broker step can give a broker it starts a TLS listener
    startable = True  # perfpipe can start it on a host (`start`); False: it says why not
    # the command line of its processes, to find a broker perfpipe did not start on its host
    # (`tasks.driver.procfs`; the inventory's broker.processes names another way)
    process_pattern: str | None = None
    # its own Prometheus endpoint (port and path on the broker's address), and where each
    # column of the broker's own view comes from (`tasks.driver.broker_stats`)
    metrics_port: int | None = None
    metrics_path = "/metrics"
    prometheus: dict[str, str] = {}
    # the most cores its work can keep busy: 1 for a broker that runs one event loop; None,
    # as many as its host has (what a capacity answer's CPU is measured against:
    # `tasks.analysis.capacity`)
    cores: int | None = None

    def __init__(self, host: Host | None = None, cpus: str | None = None) -> None:
        self.host = host
        self.cpus = cpus  # the CPUs of its host it runs on when perfpipe starts it, or None
        self.launched: int | None = None  # the process group `launch` started, if it did

    def launch(self, argv: list[str], log_path: str) -> int:
        """`Host.launch` of the broker's command, on `cpus` when given (`start` uses it);
        the group is kept in `launched`, so a caller whose start fails later can stop it."""
        self.launched = self.host.launch(pinned(argv, self.cpus), log_path)
        return self.launched

    def version(self) -> str:
        """The installed version as the broker host tells it, or "unknown"."""
        return "unknown"

    def start(self, run_dir: str, address: str, port: int, **options) -> dict:
        """Start the broker detached on its host, wait until it answers, and return its state
        for broker.json (at least group_pid and pid)."""
        raise NotImplementedError

    def stop(self, group_pid: int, timeout_s: float = 10.0) -> None:
        """Stop a broker this adapter started (its whole process group)."""
        raise NotImplementedError

    def health(self, address: str, port: int, timeout_s: float = 10.0) -> float:
        """A real MQTT CONNECT/CONNACK to the running broker; seconds, or BrokerError."""
        return health_check(address, port, timeout_s)

    def probe_version(self, address: str, port: int) -> str:
        """The running broker's version over the network ($SYS/broker/version), or
        "unknown"."""
        return sys_version(address, port)

    def stats_args(self, state: dict, metrics_url: str | None = None) -> list[str]:
        """The broker sampler's arguments that read the broker's own view while a stage runs
        (`tasks.driver.sampler`): its Prometheus endpoint (`metrics_url`, else the adapter's
        port on the broker's address, or the port the adapter opened), or nothing."""
        port = state.get("metrics_port") or self.metrics_port
        url = metrics_url or (port and f"http://{url_host(state['address'])}:{port}"
                                       f"{self.metrics_path}")
        if not self.prometheus or not url:
            return []
        return ["--prometheus", url,
                *(arg for column, source in self.prometheus.items()
                  for arg in ("--prom", f"{column}={source}"))]


def url_host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address

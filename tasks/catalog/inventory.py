"""The inventory: which hosts exist, their roles, and where the broker under test is."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from ..brokers import ADAPTERS
from ..config_files import load_model
from ..hosts import Host, LocalHost, SshHost
from .cpus import CPU_LIST, CPUS_FOR, kept_on, parse

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
PATH_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789./_-"
# top-level folders of the system's own (and /usr but /usr/local): no work or code root
SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                         "run", "sbin", "sys"})


SSH_ONLY = frozenset({"port", "user", "key_file", "gateway", "ssh_conn_id"})
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


class HostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME, description="short host name used in paths and reports")
    address: str = "localhost"
    transport: Literal["local", "ssh"] = "local"
    port: StrictInt = Field(22, ge=1, le=65535)
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    key_file: Path | None = None
    roles: list[Literal["broker", "driver"]] = Field(min_length=1)
    procs: StrictInt | Literal["auto"] = Field(
        "auto", description="driver processes on this host; auto: one per CPU perfpipe's "
        "processes may use there (its affinity), less the CPUs broker.cpus keeps for the "
        "broker on its host (resolved at plan time for local hosts, from the provisioned "
        "fingerprint's usable_cpus for SSH hosts)")
    search_procs: StrictInt | Literal["auto"] | None = Field(
        None, description="driver processes on this host for a max-rate search's probes "
        "and holds (capacity stages), instead of `procs`; default: procs")
    python: str | None = Field(None, description="interpreter for the driver; default: "
                               "python3 over SSH, perfpipe's own Python locally")
    code_root: str = "/opt/perfpipe"
    work_root: str = "/var/tmp/perfpipe"
    gateway: str | None = Field(None, description="name of another inventory host to jump through")
    ssh_conn_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$",
                                    description="Airflow Connection with address, user and key")
    tuning_allow: list[str] = Field(["*"], description="globs of sysctl keys perfpipe may change "
                                    "here; others are only checked")

    @model_validator(mode="after")
    def _reached_as_said(self) -> HostConfig:
        """A local host is this machine: SSH settings on it, or an address elsewhere with
        no transport said, would be ignored and the host's work run here unsaid."""
        if self.transport == "ssh":
            return self
        ssh_only = sorted(name for name in SSH_ONLY  # as given, or stored in a run's plan
                          if getattr(self, name) != type(self).model_fields[name].default)
        if ssh_only:
            raise ValueError(f"transport: local runs on this machine, yet {', '.join(ssh_only)} "
                             f"{'is' if len(ssh_only) == 1 else 'are'} given: set transport: "
                             "ssh to reach the host over SSH (or leave them out)")
        if "transport" not in self.model_fields_set and self.address not in LOOPBACK:
            raise ValueError(f"address {self.address!r} with no transport: set transport: ssh "
                             "for a host reached over SSH, or transport: local for this "
                             "machine at that address")
        return self

    @field_validator("procs", "search_procs")
    @classmethod
    def _procs_range(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and not 1 <= value <= 256:
            raise ValueError("must be 1..256 driver processes, or auto (one per CPU "
                             "perfpipe's processes may use there that the broker leaves)")
        return value

    def procs_for(self, cpus: int | None, *, search: bool = False) -> int:
        """The number of driver processes, with 'auto' resolved against a CPU count:
        `search_procs` (when set) for a max-rate search's probes, else `procs`."""
        field = "search_procs" if search and self.search_procs is not None else "procs"
        value = getattr(self, field)
        if isinstance(value, int):
            return value
        if not cpus:
            raise ValueError(f"hosts: {self.name}.{field} is auto but the host's core count "
                             f"is unknown; provision it first or set {field}: N")
        return max(1, min(256, int(cpus)))

    @field_validator("code_root", "work_root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or not set(value) <= set(PATH_CHARS):
            raise ValueError("must be an absolute path of letters, digits and ./_-")
        parts = value.strip("/").split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"{value!r}: write the path without '.', '..' or '//' parts, "
                             f"e.g. /var/tmp/perfpipe")
        if len(parts) < 2:
            raise ValueError(f"{value!r}: perfpipe creates and removes folders under it; give "
                             f"a folder of its own at least two levels deep, e.g. "
                             f"/var/tmp/perfpipe")
        if parts[0] in SYSTEM_DIRS or parts[0] == "usr" and parts[1] != "local":
            raise ValueError(f"{value!r}: perfpipe creates and removes folders under it, and "
                             f"/{parts[0]} is the system's; give a folder of its own, e.g. "
                             f"/var/tmp/perfpipe")
        return value.rstrip("/")


class BrokerProcesses(BaseModel):
    """How the sampler finds an already running broker's processes on its host (exactly one
    way; `tasks.driver.procfs`): a pid file, a systemd unit, or a command-line pattern.
    Every process found counts (a JVM and its helpers)."""

    model_config = ConfigDict(extra="forbid")

    pid_file: str | None = Field(None, pattern=r"^/[A-Za-z0-9_./@-]+$",
                                 description="e.g. /run/mosquitto/mosquitto.pid")
    unit: str | None = Field(None, pattern=r"^[A-Za-z0-9_.@:-]+$",
                             description="a systemd unit, e.g. mosquitto.service")
    match: str | None = Field(None, min_length=1, max_length=200,
                              description="a regular expression on the command line")

    @model_validator(mode="after")
    def _one_way(self) -> BrokerProcesses:
        given = [name for name in ("pid_file", "unit", "match") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError("give exactly one of pid_file, unit or match")
        if self.match:
            try:
                re.compile(self.match)
            except re.error as exc:
                raise ValueError(f"match: not a regular expression ({exc})") from None
        return self

    def way(self) -> tuple[str, str]:
        """(way, value) as the sampler takes it."""
        return next((name, getattr(self, name)) for name in ("pid_file", "unit", "match")
                    if getattr(self, name))


class BrokerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # one of the registered adapters: registering one in tasks.brokers.ADAPTERS is enough
    kind: Literal[tuple(ADAPTERS)] = Field(  # type: ignore[valid-type]
        "mosquitto", description="the broker adapter (tasks.brokers.ADAPTERS)")
    host: str | None = Field(None, description="inventory host that runs the broker; may be "
                             "left out for an unmanaged broker perfpipe only connects to")
    managed: bool = Field(True, description="false: the broker already runs; never start or stop it")
    port: StrictInt | None = Field(None, ge=1, le=65535,
                                   description="empty: a free port is chosen")
    address: str | None = Field(None, description="address clients connect to; default the host's")
    processes: BrokerProcesses | None = Field(
        None, description="an unmanaged broker: how to find its processes on broker.host "
        "(default: its adapter's command-line pattern)")
    extra_config: list[str] = Field(
        [], description="lines appended to the config of a Mosquitto perfpipe starts (a "
        "plugin, a limit); perfpipe's own settings come first")
    metrics_url: str | None = Field(
        None, pattern=r"^https?://[A-Za-z0-9_.:\[\]-]+(:\d+)?(/[A-Za-z0-9_./?=&-]*)?$",
        description="the broker's own Prometheus endpoint (default: its adapter's, on the "
        "broker's address)")
    cpus: str | None = Field(
        None, pattern=CPU_LIST, description="a broker perfpipe starts runs on these CPUs of "
        "its host ('0', '0-1,3', as taskset takes them) and perfpipe's processes there "
        "(drivers, the sampler) on the others, for the stages cpus_for names "
        "(tasks.catalog.cpus); unset: anywhere")
    cpus_for: Literal[CPUS_FOR] = Field(  # type: ignore[valid-type]
        "all", description="the stages broker.cpus keeps the broker there for: 'all', or "
        "'capacity' (a max-rate search's probes and holds; every other stage runs the broker "
        "and perfpipe's processes anywhere)")

    @field_validator("extra_config")
    @classmethod
    def _config_lines(cls, lines: list[str]) -> list[str]:
        if any(not line.strip() or any(ord(c) < 32 for c in line) for line in lines):
            raise ValueError("one config line per entry: no empty entries, no line breaks or "
                             "control characters")
        return lines

    @field_validator("cpus", mode="before")
    @classmethod
    def _one_cpu(cls, cpus: object) -> object:
        return str(cpus) if isinstance(cpus, int) and not isinstance(cpus, bool) else cpus

    @field_validator("cpus")
    @classmethod
    def _cpu_list(cls, cpus: str | None) -> str | None:
        if cpus is not None:
            parse(cpus)  # a range that runs backwards
        return cpus


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "local"
    hosts: list[HostConfig] = Field(min_length=1)
    broker: BrokerConfig
    tuning_profile: str | None = None
    tuning_mode: Literal["check", "apply"] = "check"
    tuning_restore: bool = Field(True, description="restore applied tuning at teardown")

    @model_validator(mode="after")
    def _consistent(self) -> Inventory:
        names = [h.name for h in self.hosts]
        if len(names) != len(set(names)):
            raise ValueError("hosts: host names must be unique")
        if not self.driver_hosts():
            raise ValueError("hosts: at least one host needs the role 'driver'")
        if self.broker.extra_config and (self.broker.kind != "mosquitto" or not self.broker.managed):
            raise ValueError("broker.extra_config: only for a Mosquitto perfpipe starts "
                             "(kind: mosquitto, managed: true); configure your own broker "
                             "yourself")
        if self.broker.cpus_for != "all" and not self.broker.cpus:
            raise ValueError(f"broker.cpus_for: {self.broker.cpus_for!r} needs broker.cpus (the "
                             f"CPUs to keep the broker on); set it or leave cpus_for out")
        if self.broker.cpus and not self.broker.managed:
            raise ValueError("broker.cpus: only for a broker perfpipe starts (managed: true); "
                             "place your own broker yourself")
        self._gateways_lead_out(names)
        if self.broker.host is None:
            if self.broker.managed or not (self.broker.address and self.broker.port):
                raise ValueError("broker.host: needed unless the broker is unmanaged "
                                 "(managed: false) with its address and port")
            return self
        broker_host = self.host(self.broker.host) if self.broker.host in names else None
        if broker_host is None:
            raise ValueError(f"broker.host: {self.broker.host!r} is not a host in hosts ({names})")
        if self.broker.managed and "broker" not in broker_host.roles:
            raise ValueError(f"broker.host: host {broker_host.name!r} lacks the role 'broker'")
        if not self.broker.managed and self.broker.port is None:
            raise ValueError("broker.port: an unmanaged (already running) broker needs its port")
        return self

    def _gateways_lead_out(self, names: list[str]) -> None:
        """Every gateway is another host of the inventory, and following gateways from any
        host ends (a loop would connect forever)."""
        gateways = {h.name: h.gateway for h in self.hosts if h.gateway}
        for name, gateway in gateways.items():
            if gateway not in names or gateway == name:
                raise ValueError(f"hosts: {name}.gateway {gateway!r} must be another host "
                                 f"in hosts ({names})")
        for name in gateways:
            seen = [name]
            while (hop := gateways.get(seen[-1])) is not None:
                if hop in seen:
                    raise ValueError(f"hosts: the gateways loop ({' -> '.join(seen + [hop])}); "
                                     f"one of them must reach its host without a gateway")
                seen.append(hop)

    def host(self, name: str) -> HostConfig:
        found = next((h for h in self.hosts if h.name == name), None)
        if found is None:  # a run file naming a host this inventory no longer has
            raise ValueError(f"no host {name!r} in inventory {self.name!r}; its hosts: "
                             f"{[h.name for h in self.hosts]}")
        return found

    def driver_hosts(self) -> list[HostConfig]:
        return [h for h in self.hosts if "driver" in h.roles]

    def driver_procs(self, cpus: dict[str, int | None] | None = None, *, search: bool = False
                     ) -> list[tuple[str, int]]:
        """(host, processes) of every driver host, 'auto' resolved from `cpus` (host -> the
        CPUs perfpipe's processes may use there, `tasks.steps.provision.usable_cpus`), for
        `tasks.catalog.placement.driver_slots`; `search`: for a max-rate search's probe (each
        host's search_procs, where set)."""
        cpus = cpus or {}
        return [(h.name, h.procs_for(self.driver_cores(h.name, cpus.get(h.name), search=search),
                                     search=search))
                for h in self.driver_hosts()]

    def broker_kept_on(self, search: bool) -> str | None:
        """The CPUs `broker.cpus` keeps the broker on during a stage (`search`: a max-rate
        search's probe or hold), or None (`tasks.catalog.cpus.kept_on`)."""
        return kept_on(self.broker.cpus, self.broker.cpus_for, search)

    def driver_cores(self, name: str, cores: int | None, *, search: bool = False) -> int | None:
        """The cores of host `name` (`cores` of them) its driver processes have during a
        stage (`search`: a max-rate search's): all but those `broker.cpus` keeps for the
        broker there then, so 'auto' does not start two driver processes on the one CPU
        the broker leaves (at least 1; None when unknown)."""
        kept = self.broker_kept_on(search)
        if not cores or not kept or self.broker.host != name:
            return cores
        return max(1, cores - len(parse(kept)))

    def broker_address(self) -> str:
        return self.broker.address or self.host(self.broker.host).address


def load_inventory(path: Path) -> Inventory:
    """Load and validate an inventory; relative key_file paths are relative to its folder."""
    inventory = load_model(Inventory, path)
    for host in inventory.hosts:
        if host.transport == "local":  # this machine: 'auto' is known at plan time, from
            # the CPUs perfpipe may use here (an SSH host's: its fingerprint's usable_cpus)
            usable = len(os.sched_getaffinity(0))
            if host.search_procs == "auto" or (host.search_procs, host.procs) == (None, "auto"):
                host.search_procs = host.procs_for(  # broker.cpus may leave searches fewer
                    inventory.driver_cores(host.name, usable, search=True), search=True)
            if host.procs == "auto":
                host.procs = host.procs_for(inventory.driver_cores(host.name, usable))
        if host.key_file is not None and not host.key_file.is_absolute():
            host.key_file = (Path(path).parent / host.key_file).resolve()
    return inventory


def connect(inventory: Inventory, name: str, work_root: str, keep_env: tuple[str, ...] = ()
            ) -> Host:
    """A Host for an inventory entry; local hosts keep run files under `work_root` and
    hand the commands they run the secret-looking variables in `keep_env` only."""
    config = inventory.host(name)
    if config.transport == "local":
        return LocalHost(config.name, work_root=work_root, python=config.python,
                         keep_env=keep_env)
    gateway = connect(inventory, config.gateway, work_root) if config.gateway else None
    common = dict(gateway=gateway, python=config.python or "python3", code_root=config.code_root,
                  work_root=config.work_root)
    if config.ssh_conn_id:
        from ..airflow_glue.ssh import from_connection

        details = from_connection(config.ssh_conn_id)
        return SshHost(config.name, details.address, port=details.port, user=details.user,
                       connect_kwargs=details.connect_kwargs,
                       host_key_check=details.host_key_check, **common)
    return SshHost(config.name, config.address, port=config.port, user=config.user or "root",
                   key_file=str(config.key_file) if config.key_file else None, **common)

"""Step broker: start the broker under test (or find the one already running).

A managed broker is started on its host with a benchmark config and stopped at teardown;
an unmanaged one (``managed: false`` in the inventory) is only health-checked, never
started or stopped.

TLS: when a planned stage connects over TLS (a scenario's ``connection.tls``), a managed
broker also gets a TLS listener on that block's ``port``, with a CA and server certificate
generated for the run (`tasks.brokers.tls.make_certificates`; the CA and the
certificate are kept in the run's ``broker/tls/``). The CA is installed on every driver
host at each ``tls.ca_file`` named ``perfpipe-ca.pem`` (any other ca_file is the user's
own and left alone).

CPUs: with ``broker.cpus`` a managed broker runs on the CPUs it names (`tasks.catalog.cpus`),
checked against its host's before the start and read back from /proc after it; broker.json
records them, and so does the run's fingerprint.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from .. import rundir
from ..brokers import ADAPTERS, BrokerError
from ..brokers.tls import GENERATED_CA
from ..catalog import cpus as cpu_lists
from ..hosts import Host
from ..run_context import RunContext
from . import Call
from .provision import host_cpus


def tls_wanted(ctx: RunContext) -> dict | None:
    """{port, ca_files} of the TLS listener the planned stages connect to, or None."""
    ports, ca_files = set(), set()
    for stage in ctx.stages:
        tls = (stage.connection or {}).get("tls")
        if tls is None:
            continue
        if not tls.get("port"):
            raise BrokerError(f"stage {stage.stage_id}: connection.tls needs port: (the broker's "
                              f"TLS listener, e.g. 8883); the default is the plain port")
        ports.add(tls["port"])
        if tls.get("ca_file") and posixpath.basename(tls["ca_file"]) == GENERATED_CA:
            ca_files.add(tls["ca_file"])
    if len(ports) > 1:
        raise BrokerError(f"the planned TLS stages use ports {sorted(ports)}; perfpipe opens one "
                          f"TLS listener, so give every connection.tls the same port")
    return {"port": ports.pop(), "ca_files": sorted(ca_files)} if ports else None


def install_ca(ctx: RunContext, local_ca: str, ca_files: list[str]) -> None:
    for host_config in ctx.inventory.driver_hosts():
        host = ctx.host(host_config.name)
        for path in ca_files:
            host.mkdir(posixpath.dirname(path))
            host.put(Path(local_ca), path)


def fits_cpus(ctx: RunContext, cpus: str) -> None:
    """BrokerError naming `broker.cpus` when it does not fit the broker's host."""
    name = ctx.inventory.broker.host
    count = host_cpus(ctx).get(name)
    if count is None:
        raise BrokerError(f"broker.cpus: {name}'s core count was not recorded by provision")
    try:
        cpu_lists.check_fits(cpus, name, count, "driver" in ctx.inventory.host(name).roles)
    except ValueError as exc:
        raise BrokerError(str(exc)) from None


def placed_on(host: Host, adapter, state: dict, cpus: str) -> str:
    """The CPUs the started broker may run on, read back from /proc: `cpus` as a list, or
    BrokerError (and the broker stopped) when they are not what was asked."""
    status = host.run(["cat", f"/proc/{state['pid']}/status"], check=False)
    try:
        found = cpu_lists.allowed(status.stdout) if status.ok else None
    except ValueError:
        found = None
    if found != cpu_lists.parse(cpus):
        adapter.stop(state["group_pid"])
        raise BrokerError(f"broker.cpus: asked for {cpus}, but {state['pid']} may run on "
                          f"{'(unreadable)' if found is None else cpu_lists.as_list(found)}: "
                          f"is taskset (util-linux) on {host.name}?")
    return cpu_lists.as_list(found)


def run(ctx: RunContext, call: Call) -> dict:
    inventory = ctx.inventory
    config = inventory.broker
    address = inventory.broker_address()
    host = ctx.host(config.host) if config.host else None
    if config.cpus:
        fits_cpus(ctx, config.cpus)
    adapter = ADAPTERS[config.kind](host, cpus=config.cpus)
    # with no host in the inventory, the broker tells its version over the network
    version = adapter.version() if host else adapter.probe_version(address, config.port)
    state = {"kind": config.kind, "host": config.host, "address": address,
             "managed": config.managed, "version": version}
    expected = ctx.plan.get("options", {}).get("broker_version")
    if expected and expected != state["version"]:
        raise BrokerError(f"{config.host}: {config.kind} is version {state['version']}, but the "
                          f"run asked for {expected} (fix the broker_version parameter or the host)")
    if config.managed:
        if (ctx.run_dir / rundir.BROKER).exists():  # a retried task: stop what it started
            stop_broker(ctx)
        port = config.port or host.free_port()
        tls = tls_wanted(ctx)
        options = {"extra_config": config.extra_config} if config.extra_config else {}
        if tls:
            if not adapter.supports_tls:
                raise BrokerError(f"{config.kind}: perfpipe cannot give it a TLS listener; leave "
                                  f"the TLS scenarios out of the suite")
            options.update(tls_port=tls["port"], local_dir=ctx.run_dir / rundir.TLS_DIR,
                           tls_names=[address, config.host, "localhost", "127.0.0.1"])
        state.update(port=port, **adapter.start(ctx.remote_run_dir(host), address, port,
                                                 **options))
        if config.cpus:
            state["cpus"] = placed_on(host, adapter, state, config.cpus)
        if tls:
            install_ca(ctx, state["tls"]["local_ca_file"], tls["ca_files"])
            state["tls"]["installed_ca_files"] = tls["ca_files"]
    else:
        state.update(port=config.port, pid=None)
        state["connect_s"] = adapter.health(address, config.port)
    ctx.write_json(rundir.BROKER, state)
    store = ctx.store()
    store.set_broker_version(ctx.run_id, state["version"])
    return {"address": address, "port": state["port"], "version": state["version"]}


def stop_broker(ctx: RunContext) -> str:
    """Stop the broker this run started; never one it found running."""
    if not (ctx.run_dir / rundir.BROKER).exists():
        return "no broker was started"
    state = ctx.broker()
    if not state.get("managed") or not state.get("group_pid"):
        return "broker not managed by perfpipe: left running"
    if state.get("stopped"):
        return "already stopped"
    host = ctx.host(state["host"])
    ADAPTERS[state["kind"]](host).stop(state["group_pid"])
    stopped = f"stopped {state['kind']} (pid {state['pid']}) on {state['host']}"
    try:
        ctx.write_json(rundir.BROKER, {**state, "stopped": True})
    except OSError as exc:  # a full disk: stopped all the same (a second stop finds it gone)
        return f"{stopped}, not recorded: {exc}"
    return stopped

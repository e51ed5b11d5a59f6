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
checked against those its host lets perfpipe's processes use before the start, and read
back from every thread's /proc status after it; broker.json records both (``cpus``,
``host_cpus``: the stages step runs perfpipe's processes there on the rest) and
``cpus_for``, and the run's fingerprint the first and the last. With ``cpus_for:
capacity`` the broker starts anywhere, and the stages step keeps it on ``cpus`` for each
max-rate search only (`kept_for_search`, `tasks.brokers.affinity`).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import rundir
from ..brokers import ADAPTERS, BrokerError, affinity
from ..brokers.tls import tls_listener
from ..catalog import cpus as cpu_lists
from ..hosts import Host
from ..run_context import RunContext
from . import Call
from .plan import choice_named


def install_ca(ctx: RunContext, local_ca: str, ca_files: list[str]) -> None:
    for host_config in ctx.inventory.driver_hosts():
        host = ctx.host(host_config.name)
        for path in ca_files:
            host.mkdir(posixpath.dirname(path))
            host.put(Path(local_ca), path)


def fits_cpus(ctx: RunContext, host: Host, cpus: str) -> str:
    """The CPUs perfpipe's processes may use on the broker's host, as a list; BrokerError
    naming `broker.cpus` when it names others, leaves none for drivers there, or the host
    has no taskset (or no pgrep, to move the broker for searches only)."""
    if not host.run(["sh", "-c", "command -v taskset"], check=False).ok:
        raise BrokerError(f"broker.cpus: needs taskset (util-linux) on {host.name}; install it "
                          f"or leave broker.cpus out")
    broker = ctx.inventory.broker
    if cpu_lists.searches_only(broker.cpus, broker.cpus_for) and not host.run(
            ["sh", "-c", "command -v pgrep"], check=False).ok:
        raise BrokerError(f"broker.cpus_for: needs pgrep (procps) on {host.name} to move the "
                          f"broker's processes; install it or leave cpus_for out")
    (usable,) = cpu_lists.allowed(host.run(["cat", "/proc/self/status"]).stdout)
    drivers_there = "driver" in ctx.inventory.host(host.name).roles
    try:
        cpu_lists.check_fits(cpus, host.name, usable, drivers_there)
    except ValueError as exc:
        raise BrokerError(str(exc)) from None
    return cpu_lists.as_list(usable)


def let_go(ctx: RunContext, state: dict) -> None:
    """Where an attempt of the stages step stopped inside a search: every broker thread
    given back the CPUs it had before the search (`rundir.BROKER_MOVED`, written before
    the move), so a retried step's rated stages do not run with the broker kept there;
    nothing to give back once that broker is gone."""
    path = ctx.run_dir / rundir.BROKER_MOVED
    if not path.exists():
        return
    moved = json.loads(path.read_text())
    host = ctx.host(state["host"])
    if moved.get("group_pid") == state["group_pid"] and host.alive(state["pid"],
                                                                    state["group_pid"]):
        kept = {int(tid): cpus for tid, cpus in moved["threads"].items()}
        affinity.give_back(host, state["group_pid"], kept, fallback=state["host_cpus"])
    path.unlink()


@contextmanager
def kept_for_search(ctx: RunContext, state: dict) -> Iterator[None]:
    """Around a max-rate search: the broker kept on `broker.cpus` where it runs there for
    searches only (what each thread had recorded first, `rundir.BROKER_MOVED`), and each
    thread given back its own CPUs after. A broker already gone is left to the stages
    step's own check, which says so."""
    moves = cpu_lists.searches_only(state.get("cpus"), state.get("cpus_for", "all"))
    host = ctx.host(state["host"]) if moves else None
    if host is None or not host.alive(state["pid"], state["group_pid"]):
        yield
        return
    affinity.move(host, state["group_pid"], state["cpus"], keep=lambda kept: ctx.write_json(
        rundir.BROKER_MOVED, {"group_pid": state["group_pid"], "onto": state["cpus"],
                              "threads": kept}))
    try:
        yield
    except BaseException as exc:
        try:
            let_go(ctx, state)
        except BrokerError as late:  # the search's own error is the one to see
            exc.add_note(f"and the broker's threads were not given back their CPUs: {late}")
        raise
    let_go(ctx, state)


def placed_on(host: Host, adapter, state: dict, cpus: str) -> str:
    """The CPUs the started broker's threads may run on, read back from /proc: `cpus` as
    a list, or BrokerError (and the broker stopped) when any thread's are not those."""
    status = host.run(["sh", "-c", f"cat /proc/{int(state['pid'])}/task/*/status"],
                      check=False)
    try:
        found = {cpu_lists.as_list(t) for t in cpu_lists.allowed(status.stdout)}
    except ValueError:
        found = set()
    asked = cpu_lists.as_list(cpu_lists.parse(cpus))
    if found == {asked}:
        return asked
    problem = (f"broker.cpus: asked for {cpus}, but the broker's threads may run on "
               f"{', '.join(sorted(found)) or '(unreadable)'}: a cpuset or cgroup of "
               f"{host.name} narrows them, or the broker sets its own")
    try:
        adapter.stop(state["group_pid"])
    except BrokerError as exc:
        problem += f"; stopping it: {exc}"
    raise BrokerError(problem)


def start_managed(ctx: RunContext, adapter, state: dict, port: int, options: dict,
                  usable: str | None, tls: dict | None) -> None:
    """Start the broker perfpipe manages, place it and give the driver hosts its CA, adding
    what it is to `state` (broker.json)."""
    config, host = ctx.inventory.broker, adapter.host
    state.update(port=port, **adapter.start(ctx.remote_run_dir(host), state["address"], port,
                                             **options))
    if config.cpus:  # kept there from the start, or by the stages step for searches
        kept = ctx.inventory.broker_kept_on(search=False)
        asked = (placed_on(host, adapter, state, kept) if kept
                 else cpu_lists.as_list(cpu_lists.parse(config.cpus)))
        state.update(cpus=asked, cpus_for=config.cpus_for, host_cpus=usable)
    if tls:
        install_ca(ctx, state["tls"]["local_ca_file"], tls["ca_files"])
        state["tls"]["installed_ca_files"] = tls["ca_files"]


def _refuse_held(host, config, ports: list[int]) -> None:
    """A port of the broker's that another process holds (listens on, or has bound): the
    broker perfpipe
    starts would exit ("address in use") a moment after the health check had its CONNECT
    answered by that other server, and every stage would fail with "broker died"."""
    for port in ports:
        if host.port_held(port):
            raise BrokerError(f"{host.name}: port {port} is taken by another process (a "
                              f"{config.kind} service of the host's own?): stop it, "
                              "or give broker.port (connection.tls.port for TLS) a free port, "
                              "or leave broker.port out for one perfpipe picks")


def stop_launched(adapter, failure: BaseException) -> None:
    """Stop the broker a failed start launched (its state never reached broker.json, so
    teardown would not know of it: it would hold its port on somebody's host); a failure to
    stop it is added to the start's own error."""
    group = adapter.launched
    if group is None:
        return
    try:
        if adapter.host.alive(group):
            adapter.stop(group)
    except Exception as exc:  # noqa: BLE001 - the start's error is the one to raise
        failure.add_note(f"stopping the broker it launched (group {group}): {exc}")


def run(ctx: RunContext, call: Call) -> dict:
    inventory = ctx.inventory
    config = inventory.broker
    address = inventory.broker_address()
    host = ctx.host(config.host) if config.host else None
    usable = fits_cpus(ctx, host, config.cpus) if config.cpus else None
    adapter = ADAPTERS[config.kind](host, cpus=inventory.broker_kept_on(search=False))
    # with no host in the inventory, the broker tells its version over the network
    version = adapter.version() if host else adapter.probe_version(address, config.port)
    state = {"kind": config.kind, "host": config.host, "address": address,
             "managed": config.managed, "version": version}
    expected = ctx.plan.get("options", {}).get("broker_version")
    if expected and expected != state["version"]:
        raise BrokerError(f"{config.host}: {config.kind} is version {state['version']}, but the "
                          f"run asked for {expected} (fix the host's broker, or "
                          f"{choice_named('broker_version')})")
    if config.managed:
        if (ctx.run_dir / rundir.BROKER).exists():  # a retried task: stop what it started
            stop_broker(ctx)
            (ctx.run_dir / rundir.BROKER_MOVED).unlink(missing_ok=True)  # of that broker
        port = config.port or host.free_port()
        tls = tls_listener(ctx.stages, config.kind, adapter.supports_tls)
        if adapter.startable:  # else its start says why it is not
            _refuse_held(host, config, [port] + ([tls["port"]] if tls else []))
        options = {"extra_config": config.extra_config} if config.extra_config else {}
        if tls:
            options.update(tls_port=tls["port"], local_dir=ctx.run_dir / rundir.TLS_DIR,
                           tls_names=[address, config.host, "localhost", "127.0.0.1"])
        try:
            start_managed(ctx, adapter, state, port, options, usable, tls)
            ctx.write_json(rundir.BROKER, state)  # from here teardown knows of it
        except BaseException as exc:
            stop_launched(adapter, exc)
            raise
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

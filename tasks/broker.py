"""Step 4, broker: start the broker under test (or find the one already running).

A managed broker is started on its host with a benchmark config and stopped at teardown;
an unmanaged one (``managed: false`` in the inventory) is only health-checked, never
started or stopped.
"""

from __future__ import annotations

from .brokers import ADAPTERS, BrokerError
from .brokers.mosquitto import health_check, sys_version
from .run_context import BROKER_FILE, RunContext


def start_broker(ctx: RunContext) -> dict:
    inventory = ctx.inventory
    config = inventory.broker
    address = inventory.broker_address()
    host = ctx.host(config.host) if config.host else None
    adapter = ADAPTERS[config.kind](host) if host else None
    version = adapter.version() if adapter else sys_version(address, config.port)
    state = {"kind": config.kind, "host": config.host, "address": address,
             "managed": config.managed, "version": version}
    expected = ctx.plan.get("options", {}).get("broker_version")
    if expected and expected != state["version"]:
        raise BrokerError(f"{config.host}: {config.kind} is version {state['version']}, but the "
                          f"run asked for {expected} (fix the broker_version parameter or the host)")
    if config.managed:
        existing = ctx.run_dir / BROKER_FILE
        if existing.exists():  # a retried task: stop what the first try started
            stop_broker(ctx)
        port = config.port or host.free_port()
        state.update(port=port, **adapter.start(ctx.remote_run_dir(host), address, port))
    else:
        state.update(port=config.port, pid=None)
        state["connect_s"] = health_check(address, config.port)
    ctx.write_json(BROKER_FILE, state)
    store = ctx.store()
    store.set_broker_version(ctx.run_id, state["version"])
    return {"address": address, "port": state["port"], "version": state["version"]}


def stop_broker(ctx: RunContext) -> str:
    """Stop the broker this run started; never one it found running."""
    path = ctx.run_dir / BROKER_FILE
    if not path.exists():
        return "no broker was started"
    state = ctx.broker()
    if not state.get("managed") or not state.get("group_pid"):
        return "broker not managed by perfpipe: left running"
    if state.get("stopped"):
        return "already stopped"
    host = ctx.host(state["host"])
    ADAPTERS[state["kind"]](host).stop(state["group_pid"])
    ctx.write_json(BROKER_FILE, {**state, "stopped": True})
    return f"stopped {state['kind']} (pid {state['pid']}) on {state['host']}"

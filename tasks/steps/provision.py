"""Step provision (per host): check the host can run the driver, ship it, record the
host's fingerprint.

The fingerprint (CPU, memory, kernel, OS, Python, paho version, clock offset) is stored
with the run; comparisons only match stages whose hosts have the same fingerprint
(`tasks.fingerprint`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import bundle, rundir
from ..catalog.cpus import placement
from ..driver.output import clocks_agree
from ..fingerprint import MEASUREMENT_VERSION, host_facts, host_hash, run_hash
from ..hosts import Host, HostError, LocalHost
from ..manifest import file_sha256
from ..run_context import RunContext
from . import Call

# Runs on the host with its own Python: standard library plus paho (the driver's runtime).
_FINGERPRINT_SCRIPT = r"""
import json, os, platform, time
def cpu_model():
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown'
def mem_bytes():
    for line in open('/proc/meminfo'):
        if line.startswith('MemTotal:'):
            return int(line.split()[1]) * 1024
def os_name():
    try:
        for line in open('/etc/os-release'):
            if line.startswith('PRETTY_NAME='):
                return line.split('=', 1)[1].strip().strip('"')
    except OSError:
        return platform.system()
try:
    import paho.mqtt
    paho_version = paho.mqtt.__version__
except ImportError:
    paho_version = None
def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()
print(json.dumps({'cpu_model': cpu_model(), 'cpus': os.cpu_count(), 'usable_cpus': usable_cpus(),
    'memory_bytes': mem_bytes(),
    'kernel': platform.release(), 'arch': platform.machine(), 'os': os_name(),
    'python': platform.python_version(), 'paho_mqtt': paho_version, 'time': 0}))
"""

class ProvisionError(RuntimeError):
    """A host cannot take part in the run; the message says what to install or fix."""


def ship_driver(host: Host, bundles: Path) -> str:
    """Make the driver importable on the host; returns the PYTHONPATH that runs it. The
    bundle already there is used only when its SHA-256 is the one built here (an upload
    cut short, or a file changed on the host, is replaced); a new one is uploaded beside
    it and renamed into place, so a run never imports half a file."""
    if isinstance(host, LocalHost):
        return host.code_root
    local = bundle.build(bundles)
    remote = f"{host.code_root}/{local.name}"
    want = file_sha256(local)
    if _remote_sha256(host, remote) != want:
        host.run(["mkdir", "-p", host.code_root])
        host.put(local, f"{remote}.part")
        host.run(["mv", "-f", f"{remote}.part", remote])
        if _remote_sha256(host, remote) != want:
            raise ProvisionError(f"{host.name}: the driver bundle {remote} does not read back "
                                 "as uploaded: check the disk of its code_root")
    return remote


def _remote_sha256(host: Host, path: str) -> str | None:
    found = host.run(["sha256sum", path], check=False)
    return found.stdout.split()[0] if found.ok and found.stdout.strip() else None


_CLOCK_ECHO = "import sys, time\nfor _ in sys.stdin:\n    print(repr(time.time()), flush=True)"


def clock_offset(host: Host, samples: int = 20) -> tuple[float, float]:
    """(offset, uncertainty) in seconds of the host's clock against ours, NTP style.

    One long-lived command echoes its clock for each line we send; the exchange with the
    shortest round trip wins, and half of that round trip bounds the error.
    """
    echo = host.interactive([host.python, "-u", "-c", _CLOCK_ECHO])
    best = None
    try:
        for _ in range(samples):
            sent = time.time()
            remote = float(echo.ask("t"))
            received = time.time()
            if best is None or received - sent < 2 * best[1]:
                best = (remote - (sent + received) / 2, (received - sent) / 2)
    finally:
        echo.close()
    return round(best[0], 6), round(best[1], 6)


def fingerprint(host: Host, pythonpath: str) -> dict:
    out = host.run(["env", f"PYTHONPATH={pythonpath}", host.python, "-c", _FINGERPRINT_SCRIPT],
                   timeout=60).stdout
    facts = json.loads(out.strip().splitlines()[-1])
    facts.pop("time")
    offset, uncertainty = clock_offset(host)
    facts["clock_offset_s"] = offset
    facts["clock_uncertainty_s"] = uncertainty
    # Cross-host latency (publisher and subscriber on different hosts) is only trusted when
    # the clocks agree well below the latencies measured.
    facts["clock_trusted"] = clocks_agree((offset, uncertainty))
    return facts


def run(ctx: RunContext, call: Call) -> dict:
    """Check one host and record its fingerprint; returns it (small, XCom-safe)."""
    host_name = call.host
    host = ctx.host(host_name)
    try:
        pythonpath = ship_driver(host, ctx.settings.state_dir / "bundles")
        facts = fingerprint(host, pythonpath)
    except HostError as exc:
        raise ProvisionError(f"{host_name}: cannot run the driver with {host.python}: {exc}") from exc
    finally:
        host.close()
    if tuple(int(part) for part in facts["python"].split(".")[:2]) < (3, 10):
        raise ProvisionError(f"{host_name}: {host.python} is Python {facts['python']}; the "
                             f"driver needs 3.10 or newer (set `python:` in the inventory)")
    if not facts["paho_mqtt"]:
        raise ProvisionError(f"{host_name}: paho-mqtt does not import with {host.python}; "
                             f"install the pinned version (pip install -r requirements.txt)")
    facts["host"] = host_name
    facts["roles"] = list(ctx.inventory.host(host_name).roles)
    facts["pythonpath"] = pythonpath
    facts["hash"] = host_hash(facts)
    facts["measurement_version"] = MEASUREMENT_VERSION  # of the driver just shipped
    ctx.write_json(rundir.host_file(host_name), facts)
    ctx.store().record_fingerprint(ctx.run_id, host_name, host_facts(facts))
    return {"host": host_name, "hash": facts["hash"], "clock_offset_s": facts["clock_offset_s"]}


def host_pythonpath(ctx: RunContext, host_name: str) -> str:
    """The PYTHONPATH provisioning set up for the driver on this host."""
    path = ctx.run_dir / rundir.host_file(host_name)
    if not path.exists():
        raise FileNotFoundError(f"{path}: host {host_name} was not provisioned in this run")
    return json.loads(path.read_text())["pythonpath"]


def _recorded_facts(ctx: RunContext) -> dict[str, dict]:
    """host -> the fingerprint provisioning recorded in the run folder."""
    return {path.stem: json.loads(path.read_text())
            for path in (ctx.run_dir / rundir.HOSTS_DIR).glob("*.json")}


def host_cpus(ctx: RunContext) -> dict[str, int]:
    """host -> its core count, from the fingerprints provisioning recorded (what a host's
    CPU use is a share of)."""
    return {host: facts["cpus"] for host, facts in _recorded_facts(ctx).items()}


def usable_cpus(ctx: RunContext) -> dict[str, int]:
    """host -> the CPUs perfpipe's processes may run on there (its affinity: a cpuset, a
    container or `taskset` can leave fewer than the host has), from the fingerprints
    provisioning recorded; what `procs: auto` resolves against. A run folder from before
    it was recorded has the core count."""
    return {host: facts.get("usable_cpus") or facts["cpus"]
            for host, facts in _recorded_facts(ctx).items()}


def run_fingerprint(ctx: RunContext) -> str:
    """The run's fingerprint (`tasks.fingerprint.run_hash`) from what provision and tune
    recorded: every host's hash, every tuning hash, the measurement version of the
    driver that was shipped (1 in a run folder of a perfpipe before it was recorded), so a
    run loaded again by a later perfpipe keeps its own, and the broker's CPUs and the
    stages it was kept on them for (the broker step's broker.json)."""
    def recorded(folder: str, key: str, default: object = "") -> list:
        return [json.loads(path.read_text()).get(key, default)
                for path in sorted((ctx.run_dir / folder).glob("*.json"))]

    versions = recorded(rundir.HOSTS_DIR, "measurement_version", 1)
    broker = ctx.broker()
    return run_hash(recorded(rundir.HOSTS_DIR, "hash"), recorded(rundir.TUNING_DIR, "values_hash"),
                    broker["kind"], measurement=max(versions, default=MEASUREMENT_VERSION),
                    broker_cpus=placement(broker.get("cpus"), broker.get("cpus_for", "all")))

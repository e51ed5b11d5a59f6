"""Mosquitto: the broker the embedded default starts, and the first adapter."""

from __future__ import annotations

import ipaddress
import re
import time
from pathlib import Path

import paho.mqtt.client as mqtt

from ..hosts import Host

MOSQUITTO_BINARIES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "mosquitto")


class BrokerError(RuntimeError):
    """The broker could not be started, reached or stopped; the message says which host."""


def render_config(port: int, bind: str) -> str:
    """A mosquitto.conf for benchmarking: no persistence, queues large enough not to discard."""
    return "\n".join([
        f"listener {port} {bind}",
        "allow_anonymous true",
        "persistence false",
        "max_queued_messages 1000000",
        "max_inflight_messages 0",
        "sys_interval 1",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "",
    ])


def bind_address(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return "0.0.0.0"


def health_check(address: str, port: int, timeout_s: float = 10.0) -> float:
    """A real MQTT CONNECT/CONNACK; returns the seconds it took, or raises BrokerError."""
    deadline = time.monotonic() + timeout_s
    last_error = "no answer"
    while time.monotonic() < deadline:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="perfpipe-health")
        started = time.monotonic()
        try:
            client.connect(address, port, keepalive=10)
            client.loop_start()
            for _ in range(100):
                if client.is_connected():
                    return time.monotonic() - started
                time.sleep(0.05)
            last_error = "no CONNACK within 5 s"
        except OSError as exc:
            last_error = str(exc)
        finally:
            client.loop_stop()
            client.disconnect()
        time.sleep(0.2)
    raise BrokerError(f"broker at {address}:{port} did not accept an MQTT CONNECT: {last_error}")


def sys_version(address: str, port: int, timeout_s: float = 3.0) -> str:
    """The version a broker announces on $SYS/broker/version (Mosquitto does), or "unknown"."""
    found: list[str] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="perfpipe-version")
    client.on_connect = lambda c, *_: c.subscribe("$SYS/broker/version")
    client.on_message = lambda c, u, message: found.append(message.payload.decode(errors="replace"))
    try:
        client.connect(address, port, keepalive=10)
        client.loop_start()
        deadline = time.monotonic() + timeout_s
        while not found and time.monotonic() < deadline:
            time.sleep(0.05)
    except OSError:
        return "unknown"
    finally:
        client.loop_stop()
        client.disconnect()
    match = re.search(r"(\d+\.\d+[\w.-]*)", found[0]) if found else None
    return match.group(1) if match else "unknown"


class Mosquitto:
    kind = "mosquitto"

    def __init__(self, host: Host) -> None:
        self.host = host

    def binary(self) -> str:
        for candidate in MOSQUITTO_BINARIES:
            if self.host.run(["sh", "-c", 'command -v "$0"', candidate], check=False).ok:
                return candidate
        raise BrokerError(f"{self.host.name}: mosquitto is not installed "
                          f"(apt-get install mosquitto, or `make deps`)")

    def version(self) -> str:
        out = self.host.run([self.binary(), "-h"], check=False).stdout
        match = re.search(r"mosquitto version (\S+)", out)
        return match.group(1) if match else "unknown"

    def start(self, run_dir: str, address: str, port: int) -> dict:
        """Write the config, start the broker detached, wait until it answers CONNECT."""
        conf = f"{run_dir}/broker/mosquitto.conf"
        log = f"{run_dir}/broker/mosquitto.log"
        local_conf = Path("/tmp") / f"perfpipe-mosquitto-{port}.conf"
        local_conf.write_text(render_config(port, bind_address(address)))
        self.host.mkdir(f"{run_dir}/broker")
        self.host.put(local_conf, conf)
        local_conf.unlink()
        group = self.host.launch([self.binary(), "-c", conf], log)
        try:
            health_check(address, port)
        except BrokerError:
            self.host.kill_group(group)
            tail = self.host.run(["tail", "-n", "5", log], check=False).stdout.strip()
            raise BrokerError(f"{self.host.name}: mosquitto did not come up on port {port}: "
                              f"{tail or 'no log output'}") from None
        pid = int(self.host.read_text(log + ".pid").strip())
        return {"group_pid": group, "pid": pid, "config": conf, "log": log}

    def stop(self, group_pid: int, timeout_s: float = 10.0) -> None:
        self.host.stop_group(group_pid, timeout_s)

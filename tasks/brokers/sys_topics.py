"""What a broker publishes about itself under $SYS, read with a short-lived MQTT client."""

from __future__ import annotations

import re
import time

import paho.mqtt.client as mqtt

from tasks.driver.paho_glue import stop_client


def sys_messages(address: str, port: int, topics: tuple[str, ...], wait_s: float = 3.0,
                 first_only: bool = False) -> dict[str, str]:
    """topic -> payload of the $SYS messages seen within wait_s ({} when none or unreachable)."""
    seen: dict[str, str] = {}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="perfpipe-sys",
                         protocol=mqtt.MQTTv311)
    client.on_connect = lambda c, *_: [c.subscribe(t) for t in topics]
    client.on_message = lambda c, u, m: seen.setdefault(m.topic, m.payload.decode(errors="replace"))
    try:
        client.connect(address, port, keepalive=10)
        client.loop_start()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not (first_only and seen):
            time.sleep(0.05)
    except OSError:
        return {}
    finally:
        stop_client(client)
    return seen


def version_number(text: str) -> str | None:
    match = re.search(r"(\d+\.\d+[\w.-]*)", text or "")
    return match.group(1) if match else None


def sys_version(address: str, port: int, timeout_s: float = 3.0,
                topics: tuple[str, ...] = ("$SYS/broker/version",)) -> str:
    """The version a broker announces under $SYS (Mosquitto on $SYS/broker/version), or
    "unknown"."""
    seen = sys_messages(address, port, topics, wait_s=timeout_s, first_only=True)
    found = [v for v in map(version_number, seen.values()) if v]
    return found[0] if found else "unknown"

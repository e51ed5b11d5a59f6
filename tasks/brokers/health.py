"""Is the broker there: a real MQTT CONNECT, and the address a broker should bind."""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt

from tasks.driver.paho_glue import stop_client

from .errors import BrokerError

if TYPE_CHECKING:
    from ..hosts import Host


def bind_address(address: str) -> str:
    """The one IP address a managed broker listens on: `address` itself, or the first
    address its name resolves to (the one the driver connects to, `tasks.driver.paho_glue`);
    never every interface of the host."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, IndexError) as exc:
        raise BrokerError(f"broker address {address!r} does not resolve here "
                          f"({getattr(exc, 'strerror', exc)}); give its IP address as the "
                          f"inventory's broker.address") from None


class Launched:
    """A broker process started with `Host.launch`, writing `log`: has it ended?"""

    def __init__(self, host: Host, log: str) -> None:
        self.host, self.log = host, log

    def check(self) -> None:
        """Raise BrokerError if the process has exited (its code and its log's last lines)."""
        code = self.host.exit_code(self.log)
        if code is not None:
            tail = self.host.run(["tail", "-n", "5", self.log], check=False).stdout.strip()
            raise BrokerError(f"the server exited with {code}: {tail or 'no output'}")


def health_check(address: str, port: int, timeout_s: float = 10.0,
                 ca_file: str | None = None, launched: Launched | None = None) -> float:
    """A real MQTT CONNECT/CONNACK (over TLS, verifying the broker's certificate and name
    against `ca_file`, when one is given); returns the seconds it took, or raises
    BrokerError. With `launched` (a broker perfpipe just started), a broker whose process
    has ended is said at once, with its log's last lines, not after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_error = "no answer"
    while time.monotonic() < deadline:
        if launched is not None:
            launched.check()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="perfpipe-health")
        if ca_file:
            client.tls_set(ca_certs=ca_file)
        started = time.monotonic()
        try:
            client.connect(address, port, keepalive=10)
            client.loop_start()
            for _ in range(100):
                if client.is_connected():
                    return time.monotonic() - started
                time.sleep(0.05)
            last_error = "no CONNACK within 5 s"
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            last_error = str(exc)
        finally:
            stop_client(client)
        time.sleep(0.2)
    raise BrokerError(f"broker at {address}:{port} did not accept an MQTT CONNECT: {last_error}")



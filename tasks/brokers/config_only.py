"""What configuration-only adapters share: brokers perfpipe cannot start on a host.

IBM MQ, EMQX and TBMQ do not install from this machine's OS packages, so perfpipe never
pretends to run them. Such an adapter

- renders the broker's configuration and the commands that set it up (``render``;
  ``python -m tasks.brokers.render KIND`` prints them) for a human or an existing
  installation;
- with ``managed: false`` (the broker already runs), checks it with a real MQTT CONNECT
  (``health``), reads its version where the broker tells it (``probe_version``: its HTTP
  status API or a ``$SYS`` version topic) and takes a ``$SYS`` snapshot (``stats``);
- with ``managed: true``, refuses in ``start`` with a message naming the field and the fix.
"""

from __future__ import annotations

import json
import urllib.request

from .base import BrokerAdapter
from .errors import BrokerError
from .sys_topics import sys_messages, sys_version


def http_json(url: str, timeout_s: float = 3.0) -> dict | None:
    """A JSON object from an HTTP GET, or None when unreachable or not JSON."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (http only)
            body = json.loads(response.read().decode())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


class ConfigOnlyBroker(BrokerAdapter):
    """Base of the configuration-only adapters (see the module docstring)."""

    managed_fix = ""  # what to do instead of managed: true
    startable = False
    sys_stats_topics: tuple[str, ...] = ("$SYS/#",)
    # where this broker announces its version, and only it: another broker's topic would
    # let a Mosquitto at the address pass for this kind
    version_topics: tuple[str, ...] = ("$SYS/broker/version",)

    @classmethod
    def managed_error(cls) -> str:
        return f"broker.managed: {cls.title} cannot be started by perfpipe on a host; {cls.managed_fix}"

    def start(self, run_dir: str, address: str, port: int) -> dict:
        raise BrokerError(self.managed_error())

    def stop(self, group_pid: int, timeout_s: float = 0.0) -> None:
        raise BrokerError(f"{self.title} is never started by perfpipe, so it never stops it")

    def probe_version(self, address: str, port: int) -> str:
        """The running broker's version over the network (its `version_topics`), or
        "unknown"."""
        return sys_version(address, port, topics=self.version_topics)

    def stats(self, address: str, port: int, wait_s: float = 3.0) -> dict[str, str]:
        """A snapshot of the broker's $SYS topics ({} when it publishes none to this client)."""
        return sys_messages(address, port, self.sys_stats_topics, wait_s=wait_s)

    def render(self, **settings) -> dict[str, str]:
        """file name -> text of the configuration and setup commands."""
        raise NotImplementedError

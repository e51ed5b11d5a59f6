"""What a broker says about itself, read over the network while a stage runs: Mosquitto's
``$SYS`` topics over MQTT, or a Prometheus endpoint (RabbitMQ's ``rabbitmq_prometheus``,
EMQX's ``/api/v5/prometheus/stats``, TBMQ's actuator). Standard library and paho only:
this module ships to hosts with the driver.

Both become rows of ``STATS_COLUMNS`` (`tasks.driver.output`), the broker's own view:
CPU % of one core, resident memory, connections, the backlog it holds for subscribers and
the messages it delivers per second, each empty when the broker does not tell it.

Where a Prometheus figure comes from is a small expression per column, given by the
broker's adapter: metric names and numbers joined by ``*``, each metric summed over all its
label sets (``erlang_vm_statistics_runtime_milliseconds*0.001``). ``cpu_seconds`` and
``delivered`` are counters: their rate between two scrapes becomes ``cpu_pct`` and
``delivered_per_s``.
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paho.mqtt.client import Client

SYS_FILE = "broker_sys.csv"
SYS_TOPIC = "$SYS/broker/#"
# column -> $SYS topic (values as published)
SYS_TOPICS = {
    "clients_connected": "$SYS/broker/clients/connected",
    "clients_total": "$SYS/broker/clients/total",
    "subscriptions": "$SYS/broker/subscriptions/count",
    "msgs_received": "$SYS/broker/messages/received",
    "msgs_sent": "$SYS/broker/messages/sent",
    "pub_received": "$SYS/broker/publish/messages/received",
    "pub_sent": "$SYS/broker/publish/messages/sent",
    "pub_dropped": "$SYS/broker/publish/messages/dropped",
    "bytes_received": "$SYS/broker/bytes/received",
    "bytes_sent": "$SYS/broker/bytes/sent",
    "store_messages": "$SYS/broker/store/messages/count",
    "store_bytes": "$SYS/broker/store/messages/bytes",
    "retained_messages": "$SYS/broker/retained messages/count",
    "heap_current": "$SYS/broker/heap/current",
    "heap_maximum": "$SYS/broker/heap/maximum",
}
UPTIME_TOPIC = "$SYS/broker/uptime"  # "N seconds"
RATES = {"pub_received_per_s": "pub_received", "pub_sent_per_s": "pub_sent",
         "msgs_received_per_s": "msgs_received", "msgs_sent_per_s": "msgs_sent"}
SYS_COLUMNS = ("second", "clients_connected", "clients_total", "subscriptions",
               "msgs_received", "msgs_sent", "pub_received", "pub_sent", "pub_dropped",
               "pub_received_per_s", "pub_sent_per_s", "msgs_received_per_s",
               "msgs_sent_per_s", "bytes_received", "bytes_sent", "store_messages",
               "store_bytes", "retained_messages", "queued_messages", "heap_current",
               "heap_maximum", "broker_uptime_s")


# Mosquitto's $SYS as the broker's own view (STATS_COLUMNS)
SYS_STATS = {"connections": "clients_connected", "backlog": "queued_messages",
             "delivered_per_s": "pub_sent_per_s"}
PROMETHEUS_GAUGES = ("cpu_pct", "rss_bytes", "connections", "backlog")
PROMETHEUS_COUNTERS = {"cpu_seconds": "cpu_pct", "delivered": "delivered_per_s"}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def plain_listener(config_text: str) -> tuple[str, int] | None:
    """(address, port) of the first listener without TLS in a mosquitto.conf, or None."""
    blocks: list[dict] = []
    for line in config_text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "listener" and len(words) >= 2:
            blocks.append({"port": int(words[1]), "bind": words[2] if len(words) > 2 else None})
        elif words[0] == "port" and len(words) == 2:  # the old default-listener form
            blocks.insert(0, {"port": int(words[1]), "bind": None})
        elif blocks:
            blocks[-1][words[0]] = words[1:] if len(words) > 1 else True
    for block in blocks:
        if not ({"certfile", "psk_hint", "protocol"} & set(block)) and block["port"] > 0:
            bind = block["bind"]
            if bind in (None, "0.0.0.0", "::", "localhost") or bind.startswith("/"):
                bind = "127.0.0.1"
            return bind, block["port"]
    return None


def broker_endpoint(pid: int) -> tuple[str, int] | None:
    """The plain MQTT listener of the broker process, from its ``-c CONFIG`` argument."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in argv]
    for flag in ("-c", "--config-file"):
        if flag in args[:-1]:
            try:
                return plain_listener(Path(args[args.index(flag) + 1]).read_text())
            except (OSError, ValueError):
                return None
    return None


# Mosquitto publishes these only when they changed since its last $SYS update, retained for
# 60 s (not at all with retain_available false); a listener may have to make them change
NUDGED_TOPICS = tuple(SYS_TOPICS[c] for c in ("clients_connected", "clients_total",
                                              "subscriptions"))
NUDGE_TOPIC = "$SYS/broker/version"  # a topic a $SYS reader may subscribe to, and quiet
NUDGE_UPDATES = 2  # updates the helper must outlive: the first may predate its subscription


class SysListener:
    """The latest value of every $SYS/broker topic, kept by a paho client's own thread.

    Mosquitto publishes a count (connections, sessions, subscriptions) only when it changed
    since its last update, retained for 60 s. When a stage's clients and its listener take
    the places of the previous stage's between two updates (11 s apart at Mosquitto's
    default sys_interval 10), more than 60 s after the count last changed, the listener would
    never learn it: the count stays as it was, and nothing is retained. So when the
    retained set lacks one of them, the listener opens a helper connection with one
    subscription: the broker publishes the counts with it, and once it has outlived
    ``NUDGE_UPDATES`` updates it leaves, and the next update publishes them as they are.
    The counts read one more for up to three updates, at the start of a stage. The
    retained set is read within ``timeout_s``; past it, no helper is opened."""

    def __init__(self, address: str, port: int, timeout_s: float = 5.0) -> None:
        self.values: dict[str, str] = {}
        self._endpoint = (address, port)
        self._lock = threading.Lock()
        self._barrier: int | None = None  # the mid of the second SUBSCRIBE
        self._retained_in = threading.Event()
        self._updates = 0  # live $SYS updates seen
        self._nudge: Client | None = None  # the helper, while it is connected
        self._nudged_at: int | None = None  # self._updates when its SUBACK came
        self._client = self._new_client("")
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._client.connect(address, port, keepalive=30)
        self._client.loop_start()
        deadline = time.monotonic() + timeout_s
        while not self._client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._client.is_connected():
            self.close()
            raise OSError(f"no CONNACK from {address}:{port} within {timeout_s:.0f} s")
        if self._retained_in.wait(max(0.0, deadline - time.monotonic())):
            with self._lock:
                missing = any(t not in self.values for t in NUDGED_TOPICS)
            if missing:
                self._start_nudge()

    @staticmethod
    def _new_client(suffix: str) -> Client:
        import paho.mqtt.client as mqtt

        return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                           client_id=f"perfpipe-sampler-{os.getpid()}{suffix}")

    def _on_connect(self, client, *_) -> None:
        # Mosquitto sends a SUBSCRIBE's SUBACK, then its retained messages, before it reads
        # the next packet; so the second SUBACK (the same filter: no new subscription, the
        # retained set again) follows all of the first's. Were one to come later (a socket
        # that would block), the helper it started would only be one too many
        client.subscribe(SYS_TOPIC, qos=0)
        self._barrier = client.subscribe(SYS_TOPIC, qos=0)[1]

    def _on_subscribe(self, client, userdata, mid, *_) -> None:
        if mid == self._barrier:
            self._retained_in.set()

    def _on_message(self, client, userdata, message) -> None:
        leave = False
        with self._lock:
            self.values[message.topic] = message.payload.decode(errors="replace")
            if message.topic == UPTIME_TOPIC and not message.retain:
                self._updates += 1
                leave = (self._nudged_at is not None
                         and self._updates - self._nudged_at >= NUDGE_UPDATES)
        if leave:
            nudge = self._take_nudge()
            if nudge is not None:
                nudge.disconnect()  # its network thread then ends by itself

    def _start_nudge(self) -> None:
        nudge = self._new_client("-nudge")

        def subscribed(*_) -> None:
            with self._lock:
                self._nudged_at = self._updates

        nudge.on_connect = lambda client, *_: client.subscribe(NUDGE_TOPIC, qos=0)
        nudge.on_subscribe = subscribed
        with self._lock:
            self._nudge = nudge
        nudge.connect_async(*self._endpoint, keepalive=30)
        nudge.loop_start()

    def _take_nudge(self) -> Client | None:
        """The helper, if still connected, taken so that only one caller stops it."""
        with self._lock:
            nudge, self._nudge, self._nudged_at = self._nudge, None, None
        return nudge

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.values)

    def close(self) -> None:
        from .paho_glue import stop_client

        for client in (self._take_nudge(), self._client):
            if client is not None:
                stop_client(client)


def _number(text: str | None) -> int | float | None:
    if text is None:
        return None
    word = text.split()[0] if text.split() else ""
    try:
        return int(word)
    except ValueError:
        try:
            return float(word)
        except ValueError:
            return None


def sys_row(second: int, values: dict[str, str], previous: dict | None) -> dict:
    """One broker_sys.csv row (column -> number or None) from the $SYS values seen.

    Rates: the broker publishes a new $SYS set every update (its uptime moves on); on a row
    with a new update, a counter's rate is its increase since the previous update over the
    uptime between them; rows without a new update repeat the last rates."""
    row: dict = {"second": second}
    for column, topic in SYS_TOPICS.items():
        row[column] = _number(values.get(topic))
    row["broker_uptime_s"] = uptime = _number(values.get(UPTIME_TOPIC))
    last = (previous or {}).get("_update")  # the row of the previous update
    if previous is None or uptime is None or last is None or last["broker_uptime_s"] is None:
        row["_update"] = row
        for column in RATES:
            row[column] = None
    elif uptime > last["broker_uptime_s"]:
        row["_update"] = row
        for column, counter in RATES.items():
            now, before = row[counter], last[counter]
            row[column] = (round((now - before) / (uptime - last["broker_uptime_s"]), 1)
                           if now is not None and before is not None else None)
    else:
        row["_update"] = last
        for column in RATES:
            row[column] = previous[column]
    store, retained = row["store_messages"], row["retained_messages"]
    row["queued_messages"] = (max(0, store - retained)
                              if store is not None and retained is not None else None)
    return row


def sys_stats(row: dict) -> dict:
    """A broker_sys.csv row as the broker's own view (STATS_COLUMNS, without second)."""
    return {column: row.get(source) for column, source in SYS_STATS.items()}


def parse_prometheus(text: str) -> dict[str, float]:
    """metric name -> the sum of its samples over every label set (text exposition format)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if value == value:  # NaN: not a figure
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + value
    return totals


def evaluate(expression: str, metrics: dict[str, float]) -> float | None:
    """A product of metric names and numbers (``a*b*0.001``); None when a metric is absent."""
    result = 1.0
    for term in expression.split("*"):
        term = term.strip()
        try:
            result *= float(term)
        except ValueError:
            if term not in metrics:
                return None
            result *= metrics[term]
    return result


class PrometheusReader:
    """Scrapes one endpoint; `row` turns two scrapes into the broker's own view."""

    def __init__(self, url: str, columns: dict[str, str], timeout_s: float = 2.0) -> None:
        unknown = set(columns) - set(PROMETHEUS_GAUGES) - set(PROMETHEUS_COUNTERS)
        if unknown:
            raise ValueError(f"prometheus columns {sorted(unknown)}: use "
                             f"{', '.join(PROMETHEUS_GAUGES + tuple(PROMETHEUS_COUNTERS))}")
        self.url, self.columns, self.timeout_s = url, columns, timeout_s
        self.last: tuple[float, dict[str, float | None]] | None = None

    def scrape(self) -> dict[str, float] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:  # noqa: S310
                return parse_prometheus(response.read().decode(errors="replace"))
        except (OSError, ValueError):
            return None

    def row(self) -> dict:
        """The broker's own view now (STATS_COLUMNS without second); counters as rates since
        the previous call."""
        now, metrics = time.monotonic(), self.scrape()
        values = {c: (None if metrics is None else evaluate(e, metrics))
                  for c, e in self.columns.items()}
        row = {c: values[c] for c in PROMETHEUS_GAUGES if c in values}
        previous = self.last
        for counter, rate in PROMETHEUS_COUNTERS.items():
            if counter not in values:
                continue
            before = previous[1].get(counter) if previous else None
            after = values[counter]
            if before is None or after is None or now <= previous[0]:
                row.setdefault(rate, None)
            else:
                scale = 100.0 if rate == "cpu_pct" else 1.0
                row[rate] = round(scale * (after - before) / (now - previous[0]), 2)
        self.last = (now, values)
        return row

"""Broker-side sampler: CPU and RSS of the broker process and the broker's own statistics
(Mosquitto ``$SYS``), one row per second, over the same window.

``python -m tasks.driver.sampler --pid PID --until UNIX_SECONDS --out DIR`` writes, into DIR:

``broker.csv``      `tasks.driver.output.SAMPLER_COLUMNS` (second, broker CPU % of one core,
                    broker RSS bytes) from /proc, standard library only. The Spark job
                    reads exactly these columns, so nothing else goes into this file.
``broker_sys.csv``  ``SYS_COLUMNS``: what the broker published under ``$SYS/broker/#``,
                    one row per second, for the same seconds as broker.csv (a row's
                    ``second`` is the whole Unix second that just ended; each value is the
                    latest the broker had published by then, empty when it has not
                    published it since the sampler subscribed: Mosquitto sends some values
                    only when they change, e.g. pub_dropped while nothing was dropped).
                    Written only when the broker published any $SYS value (Mosquitto
                    does; ActiveMQ does not). Columns:
    clients_connected    $SYS/broker/clients/connected (includes this sampler's client)
    clients_total        $SYS/broker/clients/total (connected + disconnected persistent)
    subscriptions        $SYS/broker/subscriptions/count
    msgs_received, msgs_sent   $SYS/broker/messages/received|sent: every MQTT packet since
                         the broker started (PUBLISH, PUBACK, PINGREQ, ...), cumulative
    pub_received, pub_sent     $SYS/broker/publish/messages/received|sent: PUBLISH only,
                         cumulative (Mosquitto 2.0.11 leaves incoming QoS 2 PUBLISHes out
                         of pub_received: use msgs_received for QoS 2 traffic)
    pub_dropped          $SYS/broker/publish/messages/dropped: PUBLISHes the broker discarded
                         (queue limits), cumulative
    pub_received_per_s, pub_sent_per_s, msgs_received_per_s, msgs_sent_per_s
                         the cumulative counter's increase between the broker's last two
                         $SYS updates over the uptime between them, repeated until the next
                         update. Mosquitto 2.0 updates $SYS every sys_interval + 1 seconds
                         (its check is strict on whole seconds: every 2 s with
                         sys_interval 1), so the cumulative columns step every other row;
                         over a window, (last - first) of a cumulative column is exact
    bytes_received, bytes_sent   $SYS/broker/bytes/received|sent, cumulative
    store_messages       $SYS/broker/store/messages/count: messages held in the broker's
                         store (queued for subscribers, in flight, and retained)
    store_bytes          $SYS/broker/store/messages/bytes
    retained_messages    $SYS/broker/retained messages/count (the $SYS tree itself is ~50)
    queued_messages      store_messages - retained_messages: the backlog (messages waiting
                         for or in flight to subscribers)
    heap_current, heap_maximum   $SYS/broker/heap/current|maximum, bytes (builds with
                         memory tracking only)
    broker_uptime_s      $SYS/broker/uptime: it moves on with every $SYS update
The first row can be partial: the broker sends its retained $SYS values as the sampler
subscribes, and the first second may end before all arrived.

The $SYS client is paho (the driver's one dependency). It connects to the broker's first
plain listener, read from the broker's own config (``-c FILE`` on its command line), or to
``--sys-host``/``--sys-port``; when it cannot connect the sampler still writes broker.csv
and says why on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from .output import SAMPLER_COLUMNS, SAMPLER_FILE, write_csv

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

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


def read_proc(pid: int) -> tuple[int, int] | None:
    """(user+system CPU ticks, RSS bytes) of a process, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        statm = Path(f"/proc/{pid}/statm").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(statm.split()[1]) * _PAGE


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


class SysListener:
    """The latest value of every $SYS/broker topic, kept by a paho client's own thread."""

    def __init__(self, address: str, port: int, timeout_s: float = 5.0) -> None:
        import paho.mqtt.client as mqtt

        self.values: dict[str, str] = {}
        self._lock = threading.Lock()
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                                   client_id=f"perfpipe-sampler-{os.getpid()}")
        self._client.on_connect = lambda client, *_: client.subscribe(SYS_TOPIC, qos=0)
        self._client.on_message = self._on_message
        self._client.connect(address, port, keepalive=30)
        self._client.loop_start()
        deadline = time.monotonic() + timeout_s
        while not self._client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._client.is_connected():
            self.close()
            raise OSError(f"no CONNACK from {address}:{port} within {timeout_s:.0f} s")

    def _on_message(self, client, userdata, message) -> None:
        with self._lock:
            self.values[message.topic] = message.payload.decode(errors="replace")

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.values)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


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


def sample(pid: int, until: float, out_dir: Path,
           sys_listener: SysListener | None = None) -> list[tuple[int, float, int]]:
    rows = []
    sys_rows: list[dict] = []
    previous = read_proc(pid)
    last_t = time.time()
    while previous is not None and time.time() < until:
        time.sleep(1.0 - (time.time() % 1.0))  # tick on whole seconds
        now = time.time()
        current = read_proc(pid)
        if current is None:
            break
        cpu_pct = 100.0 * (current[0] - previous[0]) / _TICKS / max(now - last_t, 1e-6)
        second = int(now) - 1
        rows.append((second, round(cpu_pct, 2), current[1]))
        previous, last_t = current, now
        if sys_listener is not None:
            sys_rows.append(sys_row(second, sys_listener.snapshot(),
                                    sys_rows[-1] if sys_rows else None))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / SAMPLER_FILE, SAMPLER_COLUMNS, rows)
    if sys_rows and any(r[c] is not None for r in sys_rows for c in SYS_TOPICS):
        write_csv(out_dir / SYS_FILE, SYS_COLUMNS,
                  [["" if r[c] is None else r[c] for c in SYS_COLUMNS] for r in sys_rows])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.driver.sampler", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--until", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sys-host", help="broker address for $SYS (default: from its config)")
    parser.add_argument("--sys-port", type=int, help="broker port for $SYS (default: its "
                        "first plain listener)")
    parser.add_argument("--no-sys", action="store_true", help="CPU and RSS only")
    args = parser.parse_args(argv)
    listener = None
    if not args.no_sys:
        endpoint = broker_endpoint(args.pid)
        if args.sys_port:
            endpoint = (args.sys_host or (endpoint[0] if endpoint else "127.0.0.1"), args.sys_port)
        if endpoint is None:
            print(f"sampler: no plain listener found for pid {args.pid}: no $SYS samples",
                  file=sys.stderr)
        else:
            try:
                listener = SysListener(*endpoint)
            except (OSError, ImportError) as exc:
                print(f"sampler: no $SYS samples from {endpoint[0]}:{endpoint[1]}: {exc}",
                      file=sys.stderr)
    try:
        rows = sample(args.pid, args.until, args.out, listener)
    finally:
        if listener is not None:
            listener.close()
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())

"""The least Python a CPython sender can run per message on bench_driver's fixed-rate rows.

    python bench/floor_sender.py '{"port": 1883, "clients": 1000, "rate": 50, "tick_us": 0}'

N raw MQTT 3.1.1 clients (TCP_NODELAY, like the driver), each publishing one pre-encoded
QoS 0 PUBLISH (256-byte payload) at ``rate`` msgs/s on the driver's golden-ratio phases;
the loop does nothing but a heap of due times, ``select()`` until the next one and one
``send`` per message: no timestamps, no sequence numbers, no histograms, no keepalive.
No CPython sender that sends each message at its intended time can run less Python, so
its msgs per CPU-second is the mark for perfpipe's driver (which is Python: it ships to
driver hosts with the standard library and paho only). Not a strict bound: a sender's
kernel time a message depends on how often its sends find the broker asleep and wake it,
and this loop's do so more often than perfpipe's (bench/README.md), which has come out
above it in some runs. It measures its own send lateness
(10 us buckets), so the bench can show it kept to the schedule. With ``tick_us`` it wakes
at most that often, as the driver's ``tick_us``.

Protocol as bench/mqttjs_bench.js: prints READY once every client has its CONNACK, reads
one JSON line of windows (Unix seconds: start, measure_start, measure_end, end) from
stdin, publishes from start to measure_end, prints {"count": sent in the measure window,
"errors": 0, "late_us": {p50, p90, p99}} and exits. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import heapq
import json
import select
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tasks.driver.send import phase  # noqa: E402
from tasks.driver.histogram import bucket_of, percentile  # noqa: E402
from tasks.driver.wire import remaining_length  # noqa: E402

LATE_BUCKET_US = 10


def connect_packet(client_id: str, keepalive_s: int = 60) -> bytes:
    """CONNECT, MQTT 3.1.1, clean session."""
    name = client_id.encode()
    variable = b"\x00\x04MQTT\x04\x02" + struct.pack("!H", keepalive_s)
    body = variable + struct.pack("!H", len(name)) + name
    return bytes([0x10, len(body)]) + body


def publish_packet(topic: str, payload_bytes: int) -> bytes:
    name = topic.encode()
    body = struct.pack("!H", len(name)) + name + bytes(payload_bytes)
    return bytes([0x30]) + remaining_length(len(body)) + body


CONNACK_OK = b"\x20\x02\x00\x00"  # session not present, accepted


def connect(port: int, client_id: str, keepalive_s: int = 60) -> socket.socket:
    """A blocking TCP_NODELAY connection (as the driver's) whose CONNACK was exactly
    `CONNACK_OK`; exits naming the client otherwise. The floor reader connects the same way."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as exc:
        sys.exit(f"client {client_id}: cannot connect to 127.0.0.1:{port}: {exc}")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(connect_packet(client_id, keepalive_s))
    if exactly(sock, len(CONNACK_OK)) != CONNACK_OK:
        sys.exit(f"client {client_id}: CONNACK refused or missing")
    return sock


def exactly(sock: socket.socket, n: int) -> bytes:
    """n bytes from a blocking socket (fewer only if it closed)."""
    got = b""
    while len(got) < n and (part := sock.recv(n - len(got))):
        got += part
    return got


def connect_all(port: int, clients: int, prefix: str) -> list[socket.socket]:
    socks = []
    for i in range(clients):
        sock = connect(port, f"{prefix}-{i}")
        sock.setblocking(False)
        socks.append(sock)
    return socks


def publish(socks: list[socket.socket], packet: bytes, rate: float, tick_us: int,
            windows: dict) -> tuple[int, list[int]]:
    """Sends until the window ends; (messages due in the measure window, their lateness
    in LATE_BUCKET_US buckets)."""
    interval = 1e9 / rate
    start = int(windows["start"] * 1e9)
    end = int(windows["measure_end"] * 1e9)
    counted = range(int(windows["measure_start"] * 1e9), end)
    heap = [(start + int(interval * phase(i + 1)), i) for i in range(len(socks))]
    heapq.heapify(heap)
    tick_ns = tick_us * 1000
    late = [0] * 100_001  # up to 1 s
    count = 0
    while time.time_ns() < start:
        time.sleep(min(0.01, max(0.0, (start - time.time_ns()) / 1e9)))
    while True:
        now = time.time_ns()
        if now >= end:
            return count, late
        while heap[0][0] <= now:
            due, i = heapq.heappop(heap)
            sock = socks[i]
            try:
                sent = sock.send(packet)
            except BlockingIOError:
                sent = 0
            if sent < len(packet):  # rare: finish the packet, or the stream breaks
                sock.setblocking(True)
                sock.sendall(packet[sent:])
                sock.setblocking(False)
            if due in counted:
                count += 1
                late[min((now - due) // (LATE_BUCKET_US * 1000), 100_000)] += 1
            heapq.heappush(heap, (due + int(interval), i))
        wait = max(heap[0][0], now + tick_ns) - time.time_ns()
        if wait > 0:
            select.select((), (), (), wait / 1e9)


def percentiles(late: list[int]) -> dict | None:
    """p50/p90/p99 of the lateness, read as the driver reads its own (`histogram`): each
    10 us bucket's midpoint put in the driver's buckets, here, after the loop."""
    counts: dict[int, int] = {}
    for index, n in enumerate(late):
        if n:
            bucket = bucket_of(int((index + 0.5) * LATE_BUCKET_US))
            counts[bucket] = counts.get(bucket, 0) + n
    if not counts:
        return None
    return {f"p{q}": percentile(counts, q) for q in (50, 90, 99)}


def main() -> None:
    config = json.loads(sys.argv[1])
    socks = connect_all(config["port"], config["clients"], config.get("prefix", "floor"))
    packet = publish_packet(config.get("topic", "bench/floor"), config.get("payload", 256))
    print("READY", flush=True)
    windows = json.loads(sys.stdin.readline())
    count, late = publish(socks, packet, config["rate"], config.get("tick_us", 0), windows)
    print(json.dumps({"count": count, "errors": 0, "late_us": percentiles(late)}), flush=True)
    deadline = windows.get("end", 0)
    while time.time() < deadline:
        time.sleep(0.05)
    for sock in socks:
        sock.close()


if __name__ == "__main__":
    main()

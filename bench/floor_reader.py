"""The least CPU a CPython process can spend on bench_driver's subscribe rows: a bound.

    python bench/floor_reader.py '{"port": 1883, "clients": 100, "topic": "bench/s",
                                   "delivery_bytes": 269, "hold_us": 0}'

N raw MQTT 3.1.1 clients subscribed at QoS 0 to one topic. The loop does nothing but
``epoll`` and one ``recv_into`` a shared buffer per reported socket, read as soon as
epoll reports it, as the driver's prompt reader reads (`tasks.driver.receive.Reader`):
no parsing, no receive times, no sequence checks, no histograms, no keepalive. The
messages are counted as the bytes read inside the measure window over the size of one
delivery. No CPython reader that reads each socket as it becomes readable can spend less,
so its msgs per CPU-second is the ceiling for perfpipe's prompt reader, and the broker's
CPU per delivery with it is what any prompt reader costs the broker: the kernel ACKs a
read that drains a socket, whoever reads it, and the broker (Nagle on) sends its next
segment on that ACK. With ``hold_us`` a pass that read anything is followed by the next
one no sooner than that after it began, as the driver's ``read_hold_us``.

Protocol as bench/mqttjs_bench.js: prints READY once every client has its SUBACK, reads
one JSON line of windows (Unix seconds: start, measure_start, measure_end, end) from
stdin, reads until end, prints {"count": messages read in the measure window, "errors":
0} and exits. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import sys
import time

from floor_sender import connect_packet

RECV_BYTES = 1 << 20  # the driver's shared receive buffer (receive.RECV_BYTES)


def subscribe_packet(topic: str) -> bytes:
    """SUBSCRIBE, packet id 1, one topic at QoS 0."""
    name = topic.encode()
    body = b"\x00\x01" + struct.pack("!H", len(name)) + name + b"\x00"
    return bytes([0x82, len(body)]) + body


def subscribe_all(port: int, clients: int, prefix: str, topic: str) -> list[socket.socket]:
    socks = []
    for i in range(clients):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(connect_packet(f"{prefix}-{i}"))
        if sock.recv(4)[:1] != b"\x20":
            sys.exit(f"client {i}: no CONNACK")
        sock.sendall(subscribe_packet(topic))
        if sock.recv(5)[:1] != b"\x90":
            sys.exit(f"client {i}: no SUBACK")
        sock.setblocking(False)
        socks.append(sock)
    return socks


def read(socks: list[socket.socket], hold_us: int, windows: dict) -> int:
    """Reads until the run ends; the bytes read in passes that began inside the measure
    window (the clock is read once a pass)."""
    poller = select.epoll()
    by_fd = {sock.fileno(): sock for sock in socks}
    for fd in by_fd:
        poller.register(fd, select.EPOLLIN)
    buf = bytearray(RECV_BYTES)
    measure_start, measure_end, end = (windows[k] for k in ("measure_start", "measure_end",
                                                            "end"))
    hold_s = hold_us / 1e6
    counted = 0
    while True:
        began = time.time()
        if began >= end:
            return counted
        events = poller.poll(min(0.1, end - began))
        got = 0
        for fd, _ in events:
            try:
                got += by_fd[fd].recv_into(buf)
            except BlockingIOError:
                pass
        if measure_start <= began < measure_end:
            counted += got
        if got and hold_s:
            left = began + hold_s - time.time()
            if left > 0:
                time.sleep(left)


def main() -> None:
    config = json.loads(sys.argv[1])
    socks = subscribe_all(config["port"], config["clients"], config.get("prefix", "floor"),
                          config.get("topic", "bench/s"))
    print("READY", flush=True)
    windows = json.loads(sys.stdin.readline())
    counted = read(socks, config.get("hold_us", 0), windows)
    print(json.dumps({"count": counted // config["delivery_bytes"], "errors": 0}), flush=True)
    for sock in socks:
        sock.close()


if __name__ == "__main__":
    main()

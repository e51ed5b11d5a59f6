"""A subscriber that does nothing per message, reading as early as epoll allows.

    python bench/floor_reader.py '{"port": 1883, "clients": 100, "topic": "bench/s",
                                   "delivery_bytes": 268}'

N raw MQTT 3.1.1 clients subscribed at QoS 0 to one topic (keepalive off: they send
nothing after SUBSCRIBE). The loop does nothing but ``epoll`` and one ``recv_into`` a
shared buffer per reported socket, as the driver's prompt reader reads while it is not
backlogged (`tasks.driver.receive.Reader`; the driver also holds its passes once
messages arrive 50 ms late, this never does): no parsing, no receive times, no sequence
checks, no histograms. The messages are counted as the bytes read inside the measure
window over the size of one delivery.

What it shows on bench_driver's subscribe rows is what a reader's own work per message
has to do with their bars: it spends none, so its CPU per message is the kernel's, and
the broker's CPU per delivery with it is what a reader that ACKs as early as possible
costs (the kernel ACKs a read that drains a socket, and the broker, Nagle on, sends its
next segment on that ACK). It is not a bound on every reader: one that spends more per
message comes back to epoll later, takes more messages a read, and can spend less per
message and cost the broker less (bench/README.md).

Protocol as bench/mqttjs_bench.js: prints READY once every client has its SUBACK, reads
one JSON line of windows (Unix seconds: start, measure_start, measure_end, end) from
stdin, reads until end, prints {"count": messages read in the measure window, "errors":
sockets the broker closed or that failed} and exits. Traffic goes only to 127.0.0.1.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import sys
import time

from floor_sender import connect, exactly

RECV_BYTES = 1 << 20  # the driver's shared receive buffer (receive.RECV_BYTES)


def subscribe_packet(topic: str) -> bytes:
    """SUBSCRIBE, packet id 1, one topic at QoS 0."""
    name = topic.encode()
    body = b"\x00\x01" + struct.pack("!H", len(name)) + name + b"\x00"
    return bytes([0x82, len(body)]) + body


SUBACK_OK = b"\x90\x03\x00\x01\x00"  # packet id 1, QoS 0 granted


def subscribe_all(port: int, clients: int, prefix: str, topic: str) -> list[socket.socket]:
    socks = []
    for i in range(clients):
        sock = connect(port, f"{prefix}-{i}", keepalive_s=0)
        sock.sendall(subscribe_packet(topic))
        if exactly(sock, len(SUBACK_OK)) != SUBACK_OK:
            sys.exit(f"client {i}: SUBACK refused or missing")
        sock.setblocking(False)
        socks.append(sock)
    return socks


def read(socks: list[socket.socket], windows: dict) -> tuple[int, int]:
    """Reads until the run ends: (bytes read in passes that began inside the measure
    window, the clock read once a pass; sockets lost)."""
    poller = select.epoll()
    by_fd = {sock.fileno(): sock for sock in socks}
    for fd in by_fd:
        poller.register(fd, select.EPOLLIN)
    buf = bytearray(RECV_BYTES)
    measure_start, measure_end, end = (windows[k] for k in ("measure_start", "measure_end",
                                                            "end"))
    counted = lost = 0
    while True:
        began = time.time()
        if began >= end:
            return counted, lost
        got = 0
        for fd, _ in poller.poll(min(0.1, end - began), 4096):
            try:
                n = by_fd[fd].recv_into(buf)
            except BlockingIOError:
                continue
            except OSError:
                n = 0
            if n == 0:  # closed by the broker, or failed: counted, never read again
                poller.unregister(fd)
                by_fd.pop(fd).close()
                lost += 1
            got += n
        if measure_start <= began < measure_end:
            counted += got


def main() -> None:
    config = json.loads(sys.argv[1])
    socks = subscribe_all(config["port"], config["clients"], config.get("prefix", "floor"),
                          config.get("topic", "bench/s"))
    print("READY", flush=True)
    windows = json.loads(sys.stdin.readline())
    counted, lost = read(socks, windows)
    print(json.dumps({"count": counted // config["delivery_bytes"], "errors": lost}),
          flush=True)
    for sock in socks:
        sock.close()


if __name__ == "__main__":
    main()

"""One rule for picking a TCP port for a server perfpipe starts (a broker, a proxy, a test's
PostgreSQL or Airflow): a port nobody has bound, chosen *outside* the kernel's ephemeral range.

The usual trick, bind to port 0 and close, hands out a port from the ephemeral range, the
same range every outgoing connection takes its local port from. Between picking the port and
the server binding it, any client on the host (a broker's own CLI talking to epmd, a driver,
a test) may take it, and the server fails with EADDRINUSE: RabbitMQ did so once in a clean
`make test`. Outside the range no connect() ever lands, so only another server choosing the
same port at random, or one with a fixed port, could collide.

`wait_listening` is the one wait for a server just started on such a port to take
connections.

Standard library only: `tasks.hosts` runs this file's source on remote hosts as it is.
"""
from __future__ import annotations

import errno
import random
import socket
import time

LOWEST = 10000  # below this sit well-known and registered services
RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"  # per network namespace
MIN_ROOM = 100  # fewer free-standing ports than this on a side: that side is not used
_handed_out: set[int] = set()  # never the same port twice from one process


def ephemeral_range(path: str = RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral range, first and last port (its default when unreadable)."""
    try:
        with open(path) as handle:
            first, last = (int(word) for word in handle.read().split()[:2])
            return first, last
    except (OSError, ValueError):
        return 32768, 60999


def server_ranges(first: int, last: int) -> list[range]:
    """Where to look for a server's port: below the ephemeral range, else above it. A host
    tuned for many client connections (perfpipe's lab-net and client profiles set 5000-65000,
    the IBM MQ server one 1024-65535) may leave neither: then the list is empty."""
    below, above = range(LOWEST, first), range(max(last + 1, LOWEST), 65536)
    return [side for side in (below, above) if len(side) >= MIN_ROOM]


def _bindable(port: int) -> bool:
    """Nobody has the port on any IPv4 address, nor (where the host has IPv6) any IPv6 one:
    a broker may listen on either. A connection in TIME_WAIT holding it also says no."""
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    if not socket.has_ipv6:
        return True
    try:
        sock6 = socket.socket(socket.AF_INET6)
    except OSError:  # IPv6 compiled in but off on this host
        return True
    with sock6:
        sock6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock6.bind(("::", port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


def free_port(tries: int = 200, range_file: str = RANGE_FILE) -> int:
    """A port this host can bind right now, outside the ephemeral range where there is room
    (see the module's docstring); on a host whose range covers every port, the kernel's
    own choice, as good as it gets there."""
    ranges = server_ranges(*ephemeral_range(range_file))
    for _ in range(tries if ranges else 0):
        port = random.choice(random.choice(ranges))
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    while True:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def held(port: int) -> bool:
    """Whether another process holds `port` here (listens on it, or has bound it, on any
    IPv4 address): a bind with SO_REUSEADDR, as brokers bind, fails. A connection in
    TIME_WAIT (a server stopped a moment ago) does not hold it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def wait_listening(port: int, timeout_s: float, host: str = "127.0.0.1",
                   poll_s: float = 0.05) -> bool:
    """Whether a server took connections on `port` within `timeout_s` (a server perfpipe,
    a bench or a test has just started on a `free_port`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(min(0.5, timeout_s), 0.05)).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


if __name__ == "__main__":  # run on hosts as `python -c SOURCE [PORT]` (tasks.hosts)
    import sys

    print(("held" if held(int(sys.argv[1])) else "free") if len(sys.argv) > 1 else free_port())

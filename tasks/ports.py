"""One rule for picking a TCP port for a server perfpipe starts (a broker, a proxy, a test's
PostgreSQL or Airflow): a port nobody has bound, chosen *below* the kernel's ephemeral range.

The usual trick, bind to port 0 and close, hands out a port from the ephemeral range, the
same range every outgoing connection takes its local port from. Between picking the port and
the server binding it, any client on the host (a broker's own CLI talking to epmd, a driver,
a test) may take it, and the server fails with EADDRINUSE: RabbitMQ did so once in a clean
`make test`. Below the range no connect() ever lands, so only another server choosing the same
port at random could collide.

Standard library only: `tasks.hosts` runs this file's source on remote hosts as it is.
"""
from __future__ import annotations

import random
import socket

LOWEST = 10000  # below this sit well-known and registered services
_handed_out: set[int] = set()  # never the same port twice from one process


def ephemeral_start(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """First port of the kernel's ephemeral range (its default when the file is unreadable)."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(tries: int = 200) -> int:
    """A port in [LOWEST, ephemeral start) that this host can bind right now."""
    top = ephemeral_start()
    if top - LOWEST < 100:
        raise RuntimeError(f"net.ipv4.ip_local_port_range starts at {top}: leave ports "
                           f"{LOWEST} and up free of it to start servers on")
    for _ in range(tries):
        port = random.randrange(LOWEST, top)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {LOWEST}-{top - 1} after {tries} tries")


if __name__ == "__main__":
    print(free_port())

"""Everything the driver does to paho-mqtt beyond its public API, in one place.

The driver's runtime pins paho-mqtt 2.2.0; `check_paho` fails loudly at start if the
private members used here have moved.

* `DriverClient` connects without ``bind()`` and without blocking (see its docstring), and
  asks the kernel to stamp what arrives on a plain TCP socket (``SO_TIMESTAMPNS``).
* `share_locks`: the process drives every client from one thread, so paho's seven
  per-client locks (~600 B a client; the budget is 5 KB per idle connected client) are
  replaced by one shared re-entrant lock: in one thread a re-entrant lock never blocks.
  paho's one ``acquire(False)`` (in ``_packet_queue``) is only reached when no
  ``on_socket_register_write`` callback is set, and the driver always sets one.
* `IDLE_IN_PACKET`: once the fast path reads a client's socket paho never reads it
  again, so the client's ~380 B ``_in_packet`` dict is replaced by one shared idle dict.
* `paho_handle` hands a packet the fast path read to paho's own handler (PINGRESP, ...).
* `stop_client` ends a client run by ``loop_start`` (the sampler's, the health check's).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import socket
import ssl
import sys
import threading
from collections.abc import Iterator

import paho.mqtt.client as mqtt

from .spec import ProcessSpec, SpecError

PAHO_LOCKS = ("_in_callback_mutex", "_callback_mutex", "_msgtime_mutex", "_out_message_mutex",
              "_in_message_mutex", "_reconnect_delay_mutex", "_mid_generate_mutex")
SHARED_LOCK = threading.RLock()  # one thread drives every client: re-entrant, never contended
# Linux's SO_TIMESTAMPNS (Python's socket module does not name it): every read of the
# socket carries the CLOCK_REALTIME time its newest bytes arrived (`receive.Reader`)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)


def _idle_in_packet() -> dict:
    return {"command": 0, "have_remaining": 0, "remaining_count": [], "remaining_mult": 1,
            "remaining_length": 0, "packet": bytearray(b""), "to_process": 0, "pos": 0}


IDLE_IN_PACKET = _idle_in_packet()  # shared by clients whose socket the fast path reads


def share_locks(client: mqtt.Client) -> None:
    """Replace a client's per-client locks by the process's one shared lock (memory)."""
    for name in PAHO_LOCKS:
        setattr(client, name, SHARED_LOCK)


class DriverClient(mqtt.Client):
    """paho's Client, opening its TCP connection without ``bind()`` and without blocking.

    paho binds every socket to ("", 0) before connecting, and an ephemeral-port ``bind()``
    scans the ports in use: 10,000 connects took 8 s in ``bind`` alone. A non-blocking
    connect also keeps one slow handshake (a SYN dropped by a full listen backlog waits
    a second) from stalling every other client on the loop; paho's CONNECT then waits in
    its queue until the socket is writable. TLS connects block: paho does the handshake
    inside ``connect()``.

    A plain TCP socket is stamped by the kernel (``SO_TIMESTAMPNS``): a message's receive
    time is when its bytes reached the socket, however long the read came after.
    """

    def _create_socket_connection(self) -> socket.socket:
        family, address = _resolve(self._host, self._port)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # writes are batched
            if self._ssl:
                sock.settimeout(self._connect_timeout)
                sock.connect(address)
                return sock
            if SO_TIMESTAMPNS is not None:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code not in (0, errno.EINPROGRESS):
                raise OSError(code, os.strerror(code))
            return sock
        except BaseException:
            sock.close()
            raise


@functools.lru_cache(maxsize=16)
def _resolve(host: str, port: int) -> tuple[int, tuple]:
    family, _type, _proto, _name, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM)[0]
    return family, address


SEND_BUFFER_BUDGET = 16 << 20  # kernel send buffer bytes for all publishers of a process
SEND_BUFFER_RANGE = (16 << 10, 1 << 20)


def send_buffer(spec: ProcessSpec) -> int:
    """SO_SNDBUF for publisher sockets (0: leave the kernel's autotuning).

    Loopback autotuning grows a send buffer to 4 MB: a driver running above the broker's
    rate then "publishes" gigabytes into 1000 sockets the broker has not read, and the
    backlog hides in the kernel. Bounded buffers keep it in the schedule, where messages
    cost nothing until sent and their lateness shows in ``pub_delay``.
    """
    if spec.sndbuf_bytes is not None:
        return spec.sndbuf_bytes
    share = SEND_BUFFER_BUDGET // max(1, len(spec.publishers))
    return min(max(share, SEND_BUFFER_RANGE[0]), SEND_BUFFER_RANGE[1])


def ssl_context(spec: ProcessSpec) -> ssl.SSLContext:
    """One TLS context for every client of the process (a context per client costs ~100 KB).
    A file it cannot load, or ciphers OpenSSL has none of, is a SpecError naming the field."""
    broker = spec.broker
    with _tls_field("broker.ca_file", broker.ca_file):
        context = ssl.create_default_context(cafile=broker.ca_file)
    if broker.cert_file:
        with _tls_field("broker.cert_file/key_file", f"{broker.cert_file}, {broker.key_file}"):
            context.load_cert_chain(broker.cert_file, broker.key_file)
    if broker.tls_version:  # that version only: a report's protocol, not the newest
        context.minimum_version = context.maximum_version = \
            ssl.TLSVersion[broker.tls_version.replace(".", "_")]
    if broker.ciphers:
        with _tls_field("broker.ciphers", broker.ciphers):
            context.set_ciphers(broker.ciphers)
    if broker.tls_insecure:
        context.check_hostname = False
    return context


@contextlib.contextmanager
def _tls_field(field: str, value: str | None) -> Iterator[None]:
    try:
        yield
    except OSError as exc:  # ssl.SSLError among them
        raise SpecError(f"{field}: cannot use {value!r} on this host "
                        f"({exc.strerror or exc}); fix the path or the value") from None


def at_packet_boundary(client: mqtt.Client) -> bool:
    """paho holds no partly read packet: the next byte on the socket starts a packet.

    paho reads exactly one packet at a time (1 byte, the length, then the body), so with
    its ``_in_packet`` empty nothing beyond the last packet has been read.
    """
    return client._in_packet["command"] == 0


def hand_over_reading(client: mqtt.Client) -> None:
    """paho will not read this client's socket again: drop its per-client read state."""
    client._in_packet = IDLE_IN_PACKET


def check_paho() -> None:
    """Fail early if the private paho members the socket sharing relies on have moved."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    for name in ("_in_packet", "_packet_handle", "_ping_t") + PAHO_LOCKS:
        if not hasattr(client, name):
            raise RuntimeError(f"paho-mqtt lacks Client.{name}: the driver needs paho-mqtt 2.2.0")


def stop_client(client: mqtt.Client) -> None:
    """Disconnect a client run by ``loop_start`` and wait for its network thread, which the
    DISCONNECT wakes. paho 2.2's ``loop_stop`` raises AttributeError when that thread ends
    between its check and its join (paho.mqtt.python#872): then there is nothing to wait for.
    """
    client.disconnect()
    with contextlib.suppress(AttributeError):
        client.loop_stop()


def paho_handle(client: mqtt.Client, command: int, body: bytes) -> int:
    """Hand one complete packet read by the fast path to paho's own handler."""
    client._in_packet = {"command": command, "have_remaining": 1, "remaining_count": [],
                         "remaining_mult": 1, "remaining_length": len(body),
                         "packet": bytearray(body), "to_process": 0, "pos": 0}
    try:
        return int(client._packet_handle())
    finally:
        client._in_packet = IDLE_IN_PACKET

"""Sessions and sockets: many paho clients on one epoll loop, sharing each socket with the
fast path without ever interleaving bytes.

paho owns every MQTT session: it encodes CONNECT/SUBSCRIBE/PINGREQ/DISCONNECT, handles
CONNACK/SUBACK/PINGRESP and decides about keepalive. It is driven only through
``loop_read``/``loop_write``/``loop_misc`` from this loop (never ``loop_start`` or
``loop()``, so no thread or socket pair per client and no ``select()`` over 1024+ fds).

Who touches a socket, and when (the fast path is `tasks.driver.send` and `tasks.driver.receive`):

* Writes. paho's ``on_socket_register_write`` callback is set, so paho never sends from
  inside ``publish``/``subscribe``/``disconnect``/keepalive: it only queues and calls the
  callback (``Conn.paho_pending``). Bytes reach the socket only in `Sessions.flush`:
  raw bytes (``Conn.out``) are sent only while paho has no partly written packet
  (``paho_turn`` is False), and ``loop_write`` is called only when ``Conn.out`` is empty.
  ``paho_turn`` stays True from the first ``loop_write`` until paho's queue is empty, so a
  packet paho started is finished before a raw byte follows it; ``Conn.out`` only ever
  holds whole packets, so emptying it ends on a packet boundary. While paho has something
  queued the scheduler stops appending publishes, so a keepalive PINGREQ waits at most
  for one output buffer (``Scheduler.out_limit``).
* Reads. paho reads until the client is ready (CONNACK, and SUBACK for subscribers).
  paho reads exactly one packet at a time (1 byte, the length, then the body), so when
  its ``_in_packet`` is empty the stream is on a packet boundary and the fast path takes
  the socket over (``Conn.raw``): from then on only `receive.Reader` reads it. It handles
  PUBLISH/PUBACK/PUBREC/PUBREL/PUBCOMP of the packet ids it owns and hands every other
  packet (PINGRESP, SUBACK, ...) to paho's own handler (`paho_handle`), so paho's
  keepalive state stays right.

Memory: the bar is 5 KB per idle connected client and a bare paho Client is ~4.3 KB, so
`Conn` has slots, allocates its buffers on first use, and `tasks.driver.paho_glue` shares
paho's per-client locks and idle ``_in_packet`` between clients. Every use of paho's
private members is in `tasks.driver.paho_glue`.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import ssl
import struct
import time

import paho.mqtt.client as mqtt

from .accounting import C_CONNECTS_FAILED, C_CONNECTS_OK, C_ERRORS, Accounting, Track
from .paho_glue import (
    DriverClient,
    at_packet_boundary,
    hand_over_reading,
    send_buffer,
    share_locks,
    ssl_context,
)
from .spec import ProcessSpec, PublisherSpec, SubscriberSpec

NEW, CONNECTING, CONNECTED, READY, DEAD = range(5)
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_ERR = select.EPOLLERR | select.EPOLLHUP
# struct tcp_info (linux/tcp.h, Linux 4.6+): tcpi_data_segs_in, the segments with data
_DATA_SEGS_IN = struct.Struct("I")
_DATA_SEGS_IN_AT = 152
_READABLE = select.EPOLLIN | _ERR


class Conn:
    """One client: its paho session, socket and fast-path state (slots: ~5 KB budget)."""

    __slots__ = (
        "spec", "role", "index", "client", "sock", "fd", "tls", "state", "raw", "closing",
        "out", "rest", "paho_pending", "paho_turn", "want_out", "connect_ns", "subscribe_ns",
        "tracks", "q2", "qos", "inflight", "next_pid", "seq", "first", "interval", "total",
        "tmpl", "parked", "scheduled", "held", "solo",
    )

    def __init__(self, spec: PublisherSpec | SubscriberSpec, role: str, index: int,
                 client: mqtt.Client, tls: bool) -> None:
        self.spec, self.role, self.index, self.client, self.tls = spec, role, index, client, tls
        self.sock: socket.socket | None = None
        self.fd = -1
        self.state = NEW
        self.raw = self.closing = self.paho_pending = self.paho_turn = self.want_out = False
        self.out: bytearray | None = None  # raw bytes to send, whole packets; made on first use
        self.rest = b""  # a partial packet left over from the last read
        self.connect_ns = self.subscribe_ns = 0
        self.tracks: dict[int, Track] | None = None  # subscriber: publisher -> Track
        self.q2: set[int] | None = None  # subscriber: QoS 2 packet ids received, not released
        self.qos = spec.qos
        self.inflight: dict[int, int] | None = None  # publisher: packet id -> sent ns
        self.next_pid = 1
        self.seq = self.first = self.total = 0
        self.interval = 0.0
        self.tmpl = None
        self.solo = False  # publisher: QoS 0 on one topic (Scheduler.run's short path)
        self.parked = False  # publisher: out of the schedule until Scheduler.wake
        self.scheduled = False  # publisher: has an entry in the scheduler's heap
        self.held = 0  # last sequence number counted as held back by a full window


class Sessions:
    """The epoll loop over every client of the process, and the paho side of each."""

    def __init__(self, spec: ProcessSpec, acct: Accounting) -> None:
        self.spec = spec
        self.acct = acct
        self.epoll = select.epoll()
        self._epfd = self.epoll.fileno()
        self.by_fd: dict[int, Conn] = {}
        self.conns: list[Conn] = []
        self.reader = None  # a receive.Reader, set by the engine (avoids an import cycle)
        self._pass_at = 0.0  # monotonic time the last epoll pass that had events began
        self.on_window = None  # scheduler hook: a parked publisher may go on
        self.progress = 0  # paho callbacks run: tells readable() when to stop calling loop_read
        self.connecting = 0  # CONNECT sent, no CONNACK yet (pacing)
        self.unready = 0  # opened, neither ready nor dead
        self.granted: dict[int, int] = {}  # the QoS the broker's SUBACKs granted -> how many
        self.first_connect_at: float | None = None
        self.last_connack_at: float | None = None
        # TCP segments with data received on the plain TCP sockets the fast path read, and
        # the reader's (kernel-stamped) reads of them, up to close_all (segments None if the
        # kernel does not count them). Each read takes at least one segment, so segments
        # less reads is how many reads at most took more than one: the only ones whose
        # older messages got a newer segment's arrival time (`receive.Reader.arrived`).
        # A loose bound: the segments include each socket's CONNACK and SUBACK.
        self.segments_in: int | None = 0
        self.stamped_reads = 0
        self.ssl_context = ssl_context(spec) if spec.broker.tls else None
        self.tls_seen: dict | None = None  # {version, cipher} the first handshake agreed
        self.sndbuf = send_buffer(spec)
        # one bound method object per callback, shared by every client (memory)
        self._callbacks = {
            "on_connect": self._on_connect, "on_subscribe": self._on_subscribe,
            "on_message": self._on_message, "on_disconnect": self._on_disconnect,
            "on_socket_register_write": self._on_register_write,
            "on_socket_unregister_write": self._on_unregister_write,
            "on_socket_close": self._on_socket_close,
        }

    # ---- clients -----------------------------------------------------------------------
    def new(self, client_spec: PublisherSpec | SubscriberSpec, role: str) -> Conn:
        """A client (not connected yet): its paho session with the driver's callbacks."""
        clean = client_spec.clean_session
        if clean is None:
            clean = self.spec.clean_session
        client = DriverClient(mqtt.CallbackAPIVersion.VERSION2,
                              client_id=client_spec.client_id, clean_session=clean,
                              protocol=mqtt.MQTTv311)
        conn = Conn(client_spec, role, len(self.conns), client, self.ssl_context is not None)
        client.user_data_set(conn)
        share_locks(client)
        for name, callback in self._callbacks.items():
            setattr(client, name, callback)
        broker = self.spec.broker
        if broker.username:
            client.username_pw_set(broker.username, broker.password)
        if self.ssl_context is not None:
            client.tls_set_context(self.ssl_context)
            client.tls_insecure_set(broker.tls_insecure)
        self.conns.append(conn)
        return conn

    def open(self, conn: Conn) -> None:
        """Start the TCP connect and queue CONNECT (callers pace this, see the engine)."""
        broker = self.spec.broker
        conn.connect_ns = time.time_ns()
        if self.first_connect_at is None:
            self.first_connect_at = conn.connect_ns / 1e9
        try:
            conn.client.connect(broker.host, broker.port, keepalive=self.spec.keepalive_s)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self.acct.count(C_CONNECTS_FAILED)
            self.acct.event("connect_failed", conn.spec.client_id,
                            code=getattr(exc, "errno", None) or 0,
                            error=f"{type(exc).__name__}: {exc}")
            conn.state = DEAD
            return
        conn.state = CONNECTING
        self.connecting += 1
        self.unready += 1
        conn.sock = conn.client.socket()
        conn.fd = conn.sock.fileno()
        self.by_fd[conn.fd] = conn
        self.epoll.register(conn.fd, _IN)
        if conn.role == "pub" and self.sndbuf:
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
        self.flush(conn)

    # ---- paho callbacks ----------------------------------------------------------------
    def _on_register_write(self, client, conn: Conn, sock) -> None:
        conn.paho_pending = True  # paho queued a packet: flush() lets it write in turn
        if conn.fd in self.by_fd:
            self.arm(conn, True)

    def _on_unregister_write(self, client, conn: Conn, sock) -> None:
        conn.paho_pending = False

    def _on_socket_close(self, client, conn: Conn, sock) -> None:
        """paho closes a socket itself (a write error, a keepalive timeout, a DISCONNECT
        written): count what it received first. A socket `drop` closed (and counted) or one
        close_all counted before its DISCONNECT is not counted again."""
        self._count_segments(conn)

    def _on_connect(self, client, conn: Conn, flags, reason, properties) -> None:
        self.progress += 1
        now = time.time_ns()
        if reason.is_failure:
            self.acct.count(C_CONNECTS_FAILED, now_ns=now)
            self.acct.event("connect_refused", conn.spec.client_id, code=int(reason.value),
                            reason=str(reason))
            self.drop(conn)  # no longer connecting, nor waited on
            return
        self.connecting -= 1
        conn.state = CONNECTED
        self.last_connack_at = now / 1e9
        if conn.tls and self.tls_seen is None:
            sock = client.socket()  # an ssl.SSLSocket, its handshake done
            self.tls_seen = {"version": sock.version(), "cipher": (sock.cipher() or [None])[0]}
        self.acct.count(C_CONNECTS_OK, now_ns=now)
        self.acct.observe("connect", (now - conn.connect_ns) // 1000, now)
        if conn.role == "sub":
            conn.subscribe_ns = time.time_ns()
            client.subscribe([(topic, conn.qos) for topic in conn.spec.topics])
        else:
            self._ready(conn)

    def _on_subscribe(self, client, conn: Conn, mid, reasons, properties) -> None:
        self.progress += 1
        now = time.time_ns()
        if any(r.is_failure for r in reasons):
            self.acct.count(C_ERRORS, now_ns=now)
            self.acct.event("subscribe_refused", conn.spec.client_id,
                            codes=[int(r.value) for r in reasons])
            self.drop(conn)  # it would receive nothing: not waited on, nor counted again
            return
        for reason in reasons:
            self.granted[int(reason.value)] = self.granted.get(int(reason.value), 0) + 1
        self.acct.observe("subscribe", (now - conn.subscribe_ns) // 1000, now)
        self._ready(conn)

    def _ready(self, conn: Conn) -> None:
        if conn.state != READY:
            conn.state = READY
            self.unready -= 1

    def _on_message(self, client, conn: Conn, message) -> None:
        self.progress += 1
        if conn.tracks is None:
            conn.tracks = {}
        self.acct.deliver(conn.tracks, message.payload, message.qos, time.time_ns())

    def _on_disconnect(self, client, conn: Conn, flags, reason, properties) -> None:
        if not conn.closing:  # a disconnect we did not ask for (e.g. keepalive timeout)
            self.lost(conn, int(reason.value), str(reason))

    # ---- sockets -----------------------------------------------------------------------
    def arm(self, conn: Conn, want_out: bool) -> None:
        """Ask epoll for writability only while something waits to be written."""
        if want_out != conn.want_out:
            conn.want_out = want_out
            try:
                self.epoll.modify(conn.fd, _IN | _OUT if want_out else _IN)
            except OSError:
                pass

    def flush(self, conn: Conn) -> None:
        """Write what is pending on a socket, raw bytes and paho's packets never interleaved."""
        out = conn.out
        if out and not (conn.paho_turn or conn.paho_pending or conn.want_out or conn.parked):
            try:  # the common case, kept short: raw bytes only, socket not known to be full
                sent = conn.sock.send(out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent = 0
            except OSError as exc:
                self.lost(conn, exc.errno or 0, f"send: {exc}")
                return
            if sent == len(out):
                out.clear()
                return
            del out[:sent]
        while conn.state != DEAD:
            if out and not conn.paho_turn:
                try:
                    sent = conn.sock.send(out)
                except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    sent = 0
                except OSError as exc:
                    self.lost(conn, exc.errno or 0, f"send: {exc}")
                    return
                if sent:
                    del out[:sent]
                if out:
                    self.arm(conn, True)
                    return
                if conn.parked and self.on_window is not None:
                    self.on_window(conn)
            if conn.paho_pending:
                if conn.state == CONNECTING and self._connect_failed(conn):
                    return
                conn.paho_turn = True
                rc = conn.client.loop_write()
                if rc != mqtt.MQTT_ERR_SUCCESS:
                    if not conn.closing:
                        self.lost(conn, int(rc), mqtt.error_string(rc))
                    return
                if conn.client.want_write():
                    self.arm(conn, True)
                    return
                conn.paho_turn = conn.paho_pending = False
                if conn.parked and self.on_window is not None:
                    self.on_window(conn)
                if out:
                    continue
            self.arm(conn, False)
            return

    def readable(self, conn: Conn, events: int = 0) -> None:
        """Bytes (or an error) on a socket: paho reads until the fast path takes over."""
        if conn.raw:
            self.reader.read(conn)
            return
        if events & _ERR and conn.state == CONNECTING and self._connect_failed(conn):
            return
        client = conn.client
        for _ in range(64):  # paho reads one packet per call
            before = self.progress
            rc = client.loop_read()
            if conn.state == DEAD:
                return
            if rc != mqtt.MQTT_ERR_SUCCESS:
                self.lost(conn, int(rc), mqtt.error_string(rc))
                return
            if conn.state == READY and at_packet_boundary(client):
                conn.raw = True  # the fast path reads from now on
                hand_over_reading(client)
                if conn.paho_pending:
                    self.flush(conn)
                self.reader.tick()
                self.reader.read(conn)  # TLS may hold decrypted bytes epoll cannot see
                return
            if self.progress == before:
                break  # nothing complete arrived (or no callback for it): epoll says when
        if conn.paho_pending:
            self.flush(conn)

    def _connect_failed(self, conn: Conn) -> bool:
        """A non-blocking TCP connect that failed (e.g. refused), reported with its errno.

        Checked before paho touches the socket: paho would report any socket error as
        "Unspecified error".
        """
        code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self.lost(conn, code, os.strerror(code))
        return bool(code)

    def poll(self, timeout: float, precise: bool = False) -> None:
        """Service every socket that is ready, waiting at most `timeout` seconds.

        ``epoll.poll`` rounds its timeout up to whole milliseconds, which made publishes
        ~0.5 ms late on average. With `precise` (waiting for a publish's intended time),
        ``select()`` on the epoll descriptor itself (a low fd, made first) waits with
        microsecond resolution, then ``poll(0)`` fetches the events: one more syscall per
        wake, so only then.

        A backlogged reader asks to hold (`receive.Reader.hold_s`): the next pass starts no
        sooner than that after the last one, or when `timeout` (a publish due) ends first.
        """
        epoll, reader = self.epoll, self.reader
        if reader.hold_s:
            hold = self._pass_at + reader.hold_s - time.monotonic()
            if hold > 0:
                time.sleep(min(hold, timeout))
                if hold >= timeout:
                    return
                timeout = 0
        if precise and timeout > 0 and self._epfd < 1024:
            if not select.select((self._epfd,), (), (), timeout)[0]:
                return
            timeout = 0
        by_fd, read = self.by_fd, reader.read
        events_list = epoll.poll(timeout, 4096)
        if not events_list:
            return
        self._pass_at = time.monotonic()
        reader.tick()
        handled = 0
        readable, writable, dead = _READABLE, _OUT, DEAD
        for fd, events in events_list:
            conn = by_fd.get(fd)
            if conn is None:
                continue
            handled += 1
            if not handled & 31:
                reader.tick()
            if events & readable:
                if conn.raw:
                    read(conn)
                else:
                    self.readable(conn, events)
            if events & writable and conn.state != dead:
                self.flush(conn)
        reader.end_pass()

    def housekeeping(self, start: int, stop: int) -> None:
        """paho's keepalive (PINGREQ, PINGRESP timeout) for a slice of the clients."""
        for conn in self.conns[start:stop]:
            if conn.state in (CONNECTED, READY) and not conn.closing:
                rc = conn.client.loop_misc()
                if rc != mqtt.MQTT_ERR_SUCCESS and conn.state != DEAD:
                    self.lost(conn, int(rc), mqtt.error_string(rc))

    def lost(self, conn: Conn, code: int, reason: str = "") -> None:
        """A connection the broker refused (a failed connect), or closed or dropped once
        established (an error), with its event."""
        if conn.state == DEAD or conn.closing:
            return
        if conn.state == CONNECTING:  # e.g. refused: the TCP connect completes asynchronously
            self.acct.count(C_CONNECTS_FAILED)
            self.acct.event("connect_failed", conn.spec.client_id, code=int(code), error=reason)
        else:
            self.acct.count(C_ERRORS)
            self.acct.event("connection_lost", conn.spec.client_id, code=int(code),
                            reason=reason)
        self.drop(conn)

    def drop(self, conn: Conn) -> None:
        """Forget a connection: out of epoll, socket closed (no event: callers report)."""
        if conn.state == CONNECTING:
            self.connecting -= 1
        if conn.state in (CONNECTING, CONNECTED):
            self.unready -= 1
        conn.state = DEAD
        if self.by_fd.get(conn.fd) is conn:
            del self.by_fd[conn.fd]
            try:
                self.epoll.unregister(conn.fd)
            except OSError:
                pass
        if conn.sock is not None:
            self._count_segments(conn)
            try:
                conn.sock.close()
            except OSError:
                pass

    def _count_segments(self, conn: Conn) -> None:
        """Add a plain TCP socket's segments to `segments_in`, once: close_all counts every
        live socket before its DISCONNECT (and marks it closing), and a socket already
        closed (by paho, or by `drop`) was counted as it closed."""
        sock = conn.sock
        if (conn.raw and not conn.tls and not conn.closing and sock is not None
                and sock.fileno() != -1 and self.segments_in is not None):
            segments = data_segments(sock)
            self.segments_in = None if segments is None else self.segments_in + segments

    def close_all(self, bound_s: float = 2.0) -> None:
        """Send DISCONNECT on every live connection after its pending bytes, within a bound."""
        deadline = time.monotonic() + bound_s
        for conn in self.conns:  # paho closes a socket once its DISCONNECT is written
            if conn.state != DEAD:
                self._count_segments(conn)
        self.stamped_reads = self.reader.reads
        for conn in self.conns:
            if conn.state in (CONNECTED, READY):
                conn.closing = True
                conn.client.disconnect()  # queued: written by flush() in turn
                self.flush(conn)
        while time.monotonic() < deadline and any(
                c.state != DEAD and c.client.want_write() for c in self.conns if c.closing):
            self.poll(0.01)
        for conn in self.conns:
            if conn.state != DEAD:
                self.drop(conn)
        self.epoll.close()


def data_segments(sock: socket.socket) -> int | None:
    """TCP segments with data an open socket has received (tcp_info), None if the kernel
    does not count them."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError as exc:
        if exc.errno in (errno.ENOPROTOOPT, errno.EOPNOTSUPP):
            return None
        raise
    if len(info) < _DATA_SEGS_IN_AT + _DATA_SEGS_IN.size:
        return None
    return _DATA_SEGS_IN.unpack_from(info, _DATA_SEGS_IN_AT)[0]

"""The receive path: many packets parsed per read, each message's time kept.

Profiling paho on one loop showed its per-message cost (packet objects, locks, a
callback; one ``recv(1)`` per header byte), not the broker, was what a paho-only driver
measured. Here one ``recvmsg_into`` of up to 1 MiB goes into a buffer shared by every
client, then every complete packet in it is parsed in one loop with local variables. The
send path is `tasks.driver.send`.

A message's receive time is when its bytes reached the socket: on plain TCP the kernel
stamps every read with the arrival time of its newest segment (``SO_TIMESTAMPNS``, set
by `paho_glue.DriverClient`), so a read that comes later does not make it late. Over TLS
(no stamp through the SSL layer) it is when epoll reported the socket (`Reader.tick`).
A read that drained more than one segment gives its older messages the newer segment's
time; ``summary.json`` counts reads and TCP segments received, which bounds how many did.

Reads are prompt: a socket is read as soon as epoll reports it. Only when the system is
backlogged (the freshest message a whole epoll pass read had arrived `HOLD_FROM_US` late;
on plain TCP that is the broker's lag, not the reader's) does the next pass wait, for at most that latency times the histogram's own relative error
(`MAX_RELATIVE_ERROR`, 1/128) and never more than `HOLD_MAX_S`. A backlogged reader that
reads each socket as soon as one message arrives pays a system call and a TCP ACK per
message, and with 1000 sockets that cost is taken from the broker it is measuring; holding
lets each read take several messages (`Reader.hold_s`, counted in ``summary.json``). A
spec's ``read_hold_us`` puts a floor under every hold after a pass that read messages
(passes at least that far apart, start to start, for the whole process's loop: acks wait
too), for capacity stages. A hold does not make a stamped receive time late, but it is not
free for latency either: the broker (Nagle on) sends a socket's next message only once the
last one is ACKed, and the ACK goes with the read, so a message due on a socket whose last
segment is still unread arrives when the read has been (bench/README.md, bench_driver.py).
"""

from __future__ import annotations

import socket
import ssl
import struct
import time

import paho.mqtt.client as mqtt

from .accounting import (
    C_ACKED,
    C_DUPLICATED,
    C_LOST,
    C_OUT_OF_ORDER,
    C_RECEIVED,
    MAX_VALUE_US,
    Accounting,
    Track,
    sequence,
)
from . import limits
from .histogram import MAX_RELATIVE_ERROR
from .paho_glue import paho_handle
from .session import DEAD, Conn, Sessions
from .wire import HEADER, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, ack

RECV_BYTES = 1 << 20
READ_BUDGET = 16 * RECV_BYTES  # a socket's reads in one epoll pass (`Reader._read_more`)
HOLD_FROM_US = 50_000  # below this latency reads are never held
HOLD_MAX_S = limits.READ_HOLD_US.limit / 1e6  # a hold never stalls keepalive and the clock
_NOTHING_READ = 1 << 62
_TIMESPEC = struct.Struct("@ll")  # struct timespec: time_t and long seconds, nanoseconds
_STAMP_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)  # one of them as ancillary data per read
_unpack_header = struct.Struct(HEADER.format[:-1]).unpack_from  # without the sent time
assert PUBLISH == 0x30 and MAX_VALUE_US == (1 << 40) - 1  # inlined as literals in parse()


class Reader:
    """Reads and parses everything arriving on sockets the fast path owns."""

    def __init__(self, sessions: Sessions, acct: Accounting, min_hold_s: float = 0.0) -> None:
        self.sessions = sessions
        self.acct = acct
        self.min_hold_s = min_hold_s  # ProcessSpec.read_hold_us: every pass that read messages
        self.buf = bytearray(RECV_BYTES)
        self.view = memoryview(self.buf)
        self.bufs = (self.buf,)
        self.reads = 0  # reads that returned bytes with the kernel's stamp (plain TCP)
        self.second = -1
        self.freshest_us = _NOTHING_READ  # lowest latency of a read's last message, this pass
        self.hold_s = 0.0  # how long the next epoll pass waits after this one began
        self.held_passes = 0
        self.hold_max_s = 0.0
        # QoS 2 publishes the broker acknowledged with a PUBACK, as QoS 1 (RabbitMQ's MQTT
        # plugin does): each is done there, its pub_ack latency to that PUBACK
        self.qos2_pubacks = 0
        self.tick()

    def tick(self) -> None:
        """Read the clock once for a batch of sockets (the loop calls it per wake-up).

        Without the kernel's stamp (TLS), a receive time is when epoll reported the bytes
        (refreshed every 32 sockets), not when this process got round to parsing them, and
        the second's counter row and histograms are looked up once, not per socket.
        """
        now = time.time_ns()
        self.now = self.polled_ns = now
        self.now_us = now // 1000
        second = now // 1_000_000_000
        if second != self.second:
            acct = self.acct
            self.second = second
            self.row = acct.row(second)
            self.e2e = acct.hist(second, "e2e")
            self.acks = acct.hist(second, "pub_ack")
            acct.roll(second)

    def read(self, conn: Conn) -> None:
        """Read and handle what a socket the fast path owns has (called per epoll event)."""
        if not (conn.tls or conn.rest):  # the common case, kept short: it runs per wake-up
            buf = self.buf
            try:
                n, stamp, _, _ = conn.sock.recvmsg_into(self.bufs, _STAMP_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                self.sessions.lost(conn, exc.errno or 0, f"recv: {exc}")
                return
            if n == 0:
                self.sessions.lost(conn, int(mqtt.MQTT_ERR_CONN_LOST), "closed by the broker")
                return
            self.arrived(stamp)
            pos = self.parse(conn, buf, n)
            if pos < n:
                conn.rest = bytes(buf[pos:n])
            if conn.out and conn.state != DEAD:
                self.sessions.flush(conn)
            if n < RECV_BYTES or conn.state == DEAD:
                return  # drained; epoll reports the next bytes
        self._read_more(conn)

    def _read_more(self, conn: Conn) -> None:
        """Reads with a partial packet left over, over TLS, or while the buffer fills.

        A TLS read returns one record (a message or a few), so a short read does not say the
        socket is drained. Prompt passes read one record each (epoll reports the socket again
        at once); a held pass (`hold_s`: the reader is backlogged, or a spec's
        ``read_hold_us``) reads until the SSL layer says the kernel has nothing more. Held
        passes that stopped at one record read fewer messages than came (from ~64 ms behind
        at 2000 msgs/s: a hold is 1/128 of the lag), fell further behind and held longer:
        after a 0.1 s stall of the process, ~170 a second were read of 2000.
        """
        sock = conn.sock
        budget = READ_BUDGET  # bytes a pass, bounded: other sockets get their turn
        while budget > 0 or (conn.tls and sock.pending()):
            rest = conn.rest
            k = len(rest)
            buf, view = self.buf, self.view
            if k + 65536 > len(buf):  # a packet bigger than the shared buffer
                buf = bytearray(k + RECV_BYTES)
                view = memoryview(buf)
            if k:
                buf[:k] = rest
                target = view[k:]
            else:
                target = buf
            room = len(buf) - k
            try:
                if conn.tls:
                    n, stamp = sock.recv_into(target), ()
                else:
                    n, stamp, _, _ = sock.recvmsg_into((target,), _STAMP_BYTES)
            except (BlockingIOError, ssl.SSLWantReadError):
                return
            except ssl.SSLWantWriteError:
                self.sessions.arm(conn, True)
                return
            except OSError as exc:
                self.sessions.lost(conn, exc.errno or 0, f"recv: {exc}")
                return
            if n == 0:
                self.sessions.lost(conn, int(mqtt.MQTT_ERR_CONN_LOST), "closed by the broker")
                return
            self.arrived(stamp)
            end = k + n
            pos = self.parse(conn, buf, end)
            conn.rest = bytes(buf[pos:end]) if pos < end else b""
            if conn.state == DEAD:
                return
            if conn.out:
                self.sessions.flush(conn)
            budget -= n
            if n < room and not (conn.tls and (self.hold_s or sock.pending())):
                return  # drained (or a prompt pass over TLS); epoll reports the next bytes

    def arrived(self, stamp: list) -> None:
        """Take a read's receive time from the kernel's stamp (the arrival of its newest
        segment), or from the last poll if the read came without one (TLS)."""
        if stamp:
            self.reads += 1
            seconds, nanoseconds = _TIMESPEC.unpack(stamp[0][2])
            now = seconds * 1_000_000_000 + nanoseconds
        else:
            now = self.polled_ns
        self.now = now
        self.now_us = now // 1000

    def parse(self, conn: Conn, buf: bytearray, end: int) -> int:
        """Handle every complete packet in buf[:end]; returns where the first partial starts."""
        acct = self.acct
        now, now_us, e2e, acks = self.now, self.now_us, self.e2e, self.acks
        tag = acct.tag
        accepting = acct.accepting
        tracks = conn.tracks
        out = conn.out  # None until an ack must be written (idle clients stay small)
        received = lost = dup = ooo = acked = early = 0
        i = 0
        while i + 2 <= end:
            b0 = buf[i]
            rl = buf[i + 1]
            j = i + 2
            if rl & 0x80:  # multi-byte remaining length; two bytes cover packets < 16 KB
                if j >= end:
                    break
                b = buf[j]
                j += 1
                rl = (rl & 0x7F) | ((b & 0x7F) << 7)
                if b & 0x80:
                    rl, j = _long_length(buf, j, end, rl)
                    if rl == -2:
                        self.sessions.lost(conn, int(mqtt.MQTT_ERR_PROTOCOL), "bad length")
                        return end
                    if rl < 0:
                        break
            nxt = j + rl
            if nxt > end:
                break
            kind = b0 & 0xF0
            if kind == 0x30:  # PUBLISH
                qos = (b0 >> 1) & 3
                p = j + 2 + ((buf[j] << 8) | buf[j + 1])
                if qos:
                    pid = (buf[p] << 8) | buf[p + 1]
                    p += 2
                    if out is None:
                        out = conn.out = bytearray()
                    if qos == 1:
                        out += ack(PUBACK, pid)
                    else:
                        out += ack(PUBREC, pid)
                        q2 = conn.q2
                        if q2 is None:
                            q2 = conn.q2 = set()
                        if pid in q2:
                            i = nxt
                            continue  # a resend of a message already delivered once
                        q2.add(pid)
                if accepting:
                    if nxt - p >= 32:  # shorter: not one of ours (a stray, as another tag)
                        mtag, publisher, seq, intended = _unpack_header(buf, p)
                        if mtag == tag:
                            received += 1
                            v = now_us - intended
                            if v < 128:
                                if v < 0:  # received before it was sent, by the clocks
                                    early += 1
                                bucket = v if v > 0 else 0
                            else:
                                if v >> 40:
                                    v = (1 << 40) - 1  # MAX_VALUE_US
                                s = v.bit_length() - 7
                                bucket = (s << 6) + (v >> s)
                            e2e[bucket] += 1
                            if tracks is None:
                                tracks = conn.tracks = {}
                            track = tracks.get(publisher)
                            if track is None:
                                track = tracks[publisher] = Track(qos)
                            if seq == track.last + 1:
                                track.last = seq
                            else:
                                g, d, o = sequence(track, seq)
                                lost += g
                                dup += d
                                ooo += o
            elif kind == PUBACK or kind == PUBCOMP or kind == PUBREC:
                pid = (buf[j] << 8) | buf[j + 1]
                inflight = conn.inflight
                if inflight is None or pid not in inflight:
                    paho_handle(conn.client, b0, bytes(buf[j:nxt]))
                elif kind == PUBREC:
                    if out is None:
                        out = conn.out = bytearray()
                    out += ack(PUBREL, pid)
                else:
                    if kind == PUBACK and conn.qos == 2:  # the broker downgraded it to QoS 1
                        self.qos2_pubacks += 1
                    sent = inflight.pop(pid)
                    acked += 1
                    v = (now - sent) // 1000
                    if v < 128:
                        bucket = v if v > 0 else 0
                    else:
                        s = v.bit_length() - 7
                        bucket = (s << 6) + (v >> s)
                    acks[bucket] += 1
            elif kind == PUBREL and conn.q2 is not None and (
                    (buf[j] << 8) | buf[j + 1]) in conn.q2:
                pid = (buf[j] << 8) | buf[j + 1]
                conn.q2.discard(pid)
                if out is None:
                    out = conn.out = bytearray()
                out += ack(PUBCOMP, pid)
            else:  # PINGRESP, SUBACK, paho's own QoS flows: paho's state, paho's handler
                rc = paho_handle(conn.client, b0, bytes(buf[j:nxt]))
                if rc:
                    self.sessions.lost(conn, rc, mqtt.error_string(rc))
                    return end
            i = nxt
        if received:
            lag = now_us - intended  # of the newest message read: the freshest in the buffer
            if lag < self.freshest_us:
                self.freshest_us = lag
            row = self.row
            row[C_RECEIVED] += received
            if early:
                acct.e2e_before_sent += early
            if lost or dup or ooo:
                row[C_LOST] += lost
                row[C_DUPLICATED] += dup
                row[C_OUT_OF_ORDER] += ooo
        if acked:
            self.row[C_ACKED] += acked
            if conn.parked:
                self.sessions.on_window(conn)
        return i

    def end_pass(self) -> None:
        """After an epoll pass: hold the next one only if even its freshest message was late,
        or by `min_hold_s` after any pass that read messages (a spec's ``read_hold_us``)."""
        freshest, self.freshest_us = self.freshest_us, _NOTHING_READ
        hold = 0.0
        if freshest < _NOTHING_READ:
            if freshest >= HOLD_FROM_US:
                hold = min(freshest * MAX_RELATIVE_ERROR / 1e6, HOLD_MAX_S)
            hold = max(hold, self.min_hold_s)
        self.hold_s = hold
        if hold:
            self.held_passes += 1
            if hold > self.hold_max_s:
                self.hold_max_s = hold


def _long_length(buf: bytearray, j: int, end: int, rl: int) -> tuple[int, int]:
    """Rest of a 3-4 byte remaining length: (length, next index), -1 partial, -2 invalid."""
    shift = 14
    while j < end:
        b = buf[j]
        j += 1
        rl |= (b & 0x7F) << shift
        if not b & 0x80:
            return rl, j
        shift += 7
        if shift > 21:
            return -2, j
    return -1, j

"""The data path: open-loop publishing in batches and parsing many packets per read.

Profiling paho on one loop showed its per-message cost (packet objects, locks, a
callback and a ``send`` per message; one ``recv(1)`` per header byte on the way in), not
the broker, was what a paho-only driver measured. Here, per client:

* publishing: messages due by now are encoded into the client's output buffer by
  patching a pre-encoded PUBLISH (`wire.Template`) with one ``struct.pack_into`` each,
  then written with one ``send`` per client per tick;
* receiving: one ``recvmsg_into`` of up to 1 MiB into a buffer shared by every client,
  then every complete packet in it is parsed in one loop with local variables.

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

Rate control is open-loop: message k of a publisher is *intended* at
``first + (k-1) * interval`` whether or not the previous one could be sent; latency is
measured from that time and the lag of the actual send is recorded as ``pub_delay``.
With a spec's ``tick_us`` the loop runs the schedule at most once per tick, so a message
leaves up to about a tick late (half a tick at the median), plus the wake-up's own lag.
``pub_delay`` and a QoS 1/2 message's ack timer start when the tick's run begins; its
writes follow the encoding of every due client (1.4-1.5 us each in bench_scheduler.py at
1000 x 50 msgs/s, more at 10,000 clients and in a real run), which that figure does not
include.
A publisher whose output buffer is full, whose paho session has a packet to write
(keepalive) or whose in-flight window is full is parked until `Scheduler.wake`; its
messages are then sent late, and the lateness shows in ``pub_delay``/``delay_overruns``.
"""

from __future__ import annotations

import heapq
import socket
import ssl
import struct
import time

import paho.mqtt.client as mqtt

from .accounting import (
    C_ACKED,
    C_DELAY_OVERRUNS,
    C_DUPLICATED,
    C_ERRORS,
    C_INFLIGHT_FULL,
    C_LOST,
    C_OUT_OF_ORDER,
    C_PUBLISHED,
    C_RECEIVED,
    MAX_VALUE_US,
    Accounting,
    Track,
    sequence,
)
from . import limits
from .histogram import MAX_RELATIVE_ERROR
from .output import DELAY_OVERRUN_US
from .paho_glue import paho_handle
from .session import DEAD, Conn, Sessions
from .wire import HEADER, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, Template, ack

RECV_BYTES = 1 << 20
READ_BUDGET = 16 * RECV_BYTES  # a socket's reads in one epoll pass (`Reader._read_more`)
HOLD_FROM_US = 50_000  # below this latency reads are never held
HOLD_MAX_S = limits.READ_HOLD_US.limit / 1e6  # a hold never stalls keepalive and the clock
_NOTHING_READ = 1 << 62
_TIMESPEC = struct.Struct("@ll")  # struct timespec: time_t and long seconds, nanoseconds
_STAMP_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)  # one of them as ancillary data per read
OUT_BUDGET = 16 << 20  # bytes queued in output buffers of all publishers of a process
OUT_RANGE = (16 << 10, 128 << 10)  # per client: parked above this many bytes
BATCH = 256  # messages encoded per client per tick at most (fairness between clients)
_GOLDEN = 0.6180339887498949
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
        received = lost = dup = ooo = acked = 0
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
                    if nxt - p < 32:
                        self.row[C_ERRORS] += 1
                    else:
                        mtag, publisher, seq, intended = _unpack_header(buf, p)
                        if mtag == tag:
                            received += 1
                            v = now_us - intended
                            if v < 128:
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
                elif conn.qos == 2 and kind == PUBACK:
                    paho_handle(conn.client, b0, bytes(buf[j:nxt]))
                else:
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


class Scheduler:
    """Open-loop publishing for every publisher of the process, one heap of due times."""

    def __init__(self, sessions: Sessions, acct: Accounting, publishers: list[Conn],
                 start_ns: int, end_ns: int, max_inflight: int) -> None:
        self.sessions = sessions
        self.acct = acct
        self.max_inflight = max_inflight
        self.heap: list[tuple[int, int, Conn]] = []  # (intended ns of message seq+1, index, conn)
        self.out_limit = min(max(OUT_BUDGET // max(1, len(publishers)), OUT_RANGE[0]),
                             OUT_RANGE[1])
        self.second = -1  # the counter row and pub_delay histogram of this second:
        self.row: list[int] = []  # looked up once per tick (`run`), not per client
        self.delays: list[int] = []
        for conn in publishers:
            spec = conn.spec
            conn.interval = 1e9 / spec.rate
            conn.first = start_ns + int(conn.interval * phase(spec.publisher_index))
            conn.total = _messages_before(conn.first, conn.interval, end_ns)
            if spec.topic_cycle:  # one template (and stream index) per topic: `fill_cycle`
                conn.tmpl = [Template(topic, spec.qos, spec.payload_bytes, acct.tag,
                                      spec.publisher_index + k)
                             for k, topic in enumerate(spec.topic_cycle)]
            else:
                conn.tmpl = Template(spec.topic, spec.qos, spec.payload_bytes, acct.tag,
                                     spec.publisher_index)
            conn.out = conn.out if conn.out is not None else bytearray()
            conn.solo = not spec.qos and not spec.topic_cycle
            if spec.qos:
                conn.inflight = {}
            if conn.total and conn.state != DEAD:
                conn.scheduled = True
                self.heap.append((conn.first, conn.index, conn))  # index: ties, never conn
        heapq.heapify(self.heap)
        sessions.on_window = self.wake

    def next_due(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def run(self, now: int) -> None:
        """Encode and send every message due by `now` (each client at most once).

        Every due client is filled first and the sockets are written afterwards, back to
        back: a write that finds the broker asleep pays to wake it (on loopback, in this
        process's system time), and writes spaced by encoding work let it fall asleep
        between them. With a tick (`ProcessSpec.tick_us`) that cut the broker's context
        switches per message from 0.20 to 0.07 at 1000 publishers x 50 msgs/s.

        The rated case, one QoS 0 message of a one-topic publisher due (``conn.solo``), is
        written out here rather than in `fill`: its intended time is the heap entry's key,
        and the call and the recomputations it saves were a quarter of the scheduler's
        Python (bench_scheduler.py: 1.9 -> 1.45 us a message at 1000 x 50 msgs/s).
        """
        heap = self.heap
        later = []
        second = now // 1_000_000_000
        if second != self.second:
            self.second = second
            self.row = self.acct.row(second)
            self.delays = self.acct.hist(second, "pub_delay")
        filled = []
        published = 0
        pop, replace, fill, flush = heapq.heappop, heapq.heapreplace, self.fill, self.sessions.flush
        delays, limit, sent_us = self.delays, self.out_limit, now // 1000
        while heap:
            entry = heap[0]
            due = entry[0]
            if due > now:
                break
            conn = entry[2]
            if conn.state == DEAD or conn.parked:
                conn.scheduled = False
                pop(heap)
                continue
            if conn.solo and not conn.paho_pending:
                seq = conn.seq + 1
                after = conn.first + int(seq * conn.interval)  # the next message's time
                out = conn.out
                if after > now and len(out) < limit:  # only this one due, room for it
                    tmpl = conn.tmpl
                    at = len(out) + tmpl.patch_at
                    out += tmpl.packet
                    tmpl.patch(out, at, seq, due // 1000, sent_us)
                    conn.seq = seq
                    v = (now - due) // 1000
                    if v < 128:
                        delays[v if v > 0 else 0] += 1
                    else:
                        self._late(v)
                    published += 1
                    filled.append(conn)
                    if seq < conn.total:
                        replace(heap, (after, entry[1], conn))
                    else:
                        conn.scheduled = False
                        pop(heap)
                    continue
            index = entry[1]
            n = fill(conn, now)
            if n:
                published += n
                filled.append(conn)
            if conn.state == DEAD or conn.parked or conn.seq >= conn.total:
                conn.scheduled = False
                pop(heap)
                continue
            due = conn.first + int(conn.seq * conn.interval)
            if due > now:  # its next turn is in a later run: one sift instead of two
                replace(heap, (due, index, conn))
            else:  # still behind: once a run, so not before this one ends
                pop(heap)
                later.append((due, index, conn))
        for conn in filled:  # back to back, after the encoding work
            flush(conn)
        self.row[C_PUBLISHED] += published
        for item in later:
            heapq.heappush(heap, item)

    def wake(self, conn: Conn) -> None:
        """A parked publisher may go on (buffer drained, paho done, or window opened)."""
        if (conn.parked and conn.state != DEAD and not conn.paho_pending
                and len(conn.out) < self.out_limit and conn.seq < conn.total
                and (conn.inflight is None or len(conn.inflight) < self.max_inflight)):
            conn.parked = False
            if not conn.scheduled:
                conn.scheduled = True
                heapq.heappush(self.heap, (conn.first + int(conn.seq * conn.interval),
                                           conn.index, conn))

    def _window(self, conn, seq: int, n: int, inflight) -> int:
        """How many of `n` QoS 1/2 messages the in-flight window lets out now; 0 parks the
        connection until acks free it. Each held-back message is counted once."""
        room = self.max_inflight - len(inflight)
        if room >= n:
            return n
        if seq + room + 1 > conn.held:
            conn.held = seq + room + 1
            self.row[C_INFLIGHT_FULL] += 1
        if room <= 0:
            conn.parked = True
            return 0
        return room

    def _late(self, v: int) -> None:
        """Count a publish sent `v` us (128 or more) after its intended time in pub_delay's
        log buckets (the histogram's layout; the loops count under 128 us inline), and as an
        overrun past DELAY_OVERRUN_US."""
        b = v.bit_length() - 7
        self.delays[(b << 6) + (v >> b) if b < 34 else -1] += 1
        if v > DELAY_OVERRUN_US:
            self.row[C_DELAY_OVERRUNS] += 1

    def fill(self, conn: Conn, now: int) -> int:
        """Append the messages of `conn` due by `now`; returns how many (`run` counts them
        as published)."""
        if conn.tmpl.__class__ is list:
            return self.fill_cycle(conn, now)
        out = conn.out
        limit = self.out_limit
        if conn.paho_pending or len(out) >= limit:
            conn.parked = True
            return 0
        first, interval, seq = conn.first, conn.interval, conn.seq
        n = min(_intended_by(first, interval, now), conn.total) - seq  # due by now
        if n <= 0:
            return 0
        tmpl = conn.tmpl
        inflight = conn.inflight
        size = len(tmpl.packet)
        if n > 1:  # a backlog: bounded per tick and by the output buffer
            n = min(n, BATCH, (limit - len(out)) // size + 1)
        if inflight is not None:
            n = self._window(conn, seq, n, inflight)
            if n <= 0:
                return 0
        delays = self.delays
        sent_us = now // 1000
        patch = tmpl.patch
        at = len(out) + tmpl.patch_at
        out += tmpl.packet * n
        late = self._late
        if inflight is None:
            for s in range(seq + 1, seq + n + 1):
                due = first + int((s - 1) * interval)
                patch(out, at, s, due // 1000, sent_us)
                at += size
                v = (now - due) // 1000
                if v < 128:
                    delays[v if v > 0 else 0] += 1
                else:
                    late(v)
        else:
            pid = conn.next_pid
            tag, publisher = tmpl.tag, tmpl.publisher
            for s in range(seq + 1, seq + n + 1):
                while pid in inflight:
                    pid = pid + 1 if pid < 65535 else 1
                inflight[pid] = now
                due = first + int((s - 1) * interval)
                patch(out, at, pid, tag, publisher, s, due // 1000, sent_us)
                pid = pid + 1 if pid < 65535 else 1
                at += size
                v = (now - due) // 1000
                if v < 128:
                    delays[v if v > 0 else 0] += 1
                else:
                    late(v)
            conn.next_pid = pid
        conn.seq = seq + n
        return n


    def fill_cycle(self, conn: Conn, now: int) -> int:
        """`fill` for a publisher cycling over topics (``topic_cycle``): message s goes to
        stream (s-1) % N with sequence number (s-1) // N + 1 in that stream. A plain loop:
        topic cycling is for fan-out patterns, where the subscribers, not this, are many.
        """
        out = conn.out
        limit = self.out_limit
        if conn.paho_pending or len(out) >= limit:
            conn.parked = True
            return 0
        first, interval, seq = conn.first, conn.interval, conn.seq
        n = min(_intended_by(first, interval, now), conn.total) - seq
        if n <= 0:
            return 0
        tmpls = conn.tmpl
        cycle = len(tmpls)
        if n > 1:
            n = min(n, BATCH, (limit - len(out)) // len(tmpls[seq % cycle].packet) + 1)
        inflight = conn.inflight
        if inflight is not None:
            n = self._window(conn, seq, n, inflight)
            if n <= 0:
                return 0
        delays = self.delays
        sent_us = now // 1000
        late = self._late
        pid = conn.next_pid
        for s in range(seq + 1, seq + n + 1):
            tmpl = tmpls[(s - 1) % cycle]
            stream_seq = (s - 1) // cycle + 1
            at = len(out) + tmpl.patch_at
            out += tmpl.packet
            due = first + int((s - 1) * interval)
            if inflight is None:
                tmpl.patch(out, at, stream_seq, due // 1000, sent_us)
            else:
                while pid in inflight:
                    pid = pid + 1 if pid < 65535 else 1
                inflight[pid] = now
                tmpl.patch(out, at, pid, tmpl.tag, tmpl.publisher, stream_seq, due // 1000,
                           sent_us)
                pid = pid + 1 if pid < 65535 else 1
            v = (now - due) // 1000
            if v < 128:
                delays[v if v > 0 else 0] += 1
            else:
                late(v)
        if inflight is not None:
            conn.next_pid = pid
        conn.seq = seq + n
        return n


def phase(publisher_index: int) -> float:
    """Where in its interval (0..1) a publisher's first message falls: golden-ratio
    spacing, so any number of publishers spread evenly over the interval, as a fleet of
    independent clients does, instead of all sending on the same tick."""
    return (publisher_index * _GOLDEN) % 1.0


def stream_last_seqs(spec, seq: int) -> dict[str, int]:
    """The last sequence number of each stream of a publisher that sent `seq` messages."""
    cycle = len(spec.topic_cycle)
    if not cycle:
        return {str(spec.publisher_index): seq}
    return {str(spec.publisher_index + k): (seq - k + cycle - 1) // cycle for k in range(cycle)}


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


def _intended_by(first: int, interval: float, t: int) -> int:
    """How many messages of a publisher are intended at or before t (message k at
    first + int((k-1) * interval), the heap's key): the float division alone can come out
    one short when t is a message's intended nanosecond, or one over."""
    if t < first:
        return 0
    count = int((t - first) / interval) + 1
    while first + int(count * interval) <= t:
        count += 1
    while count > 0 and first + int((count - 1) * interval) > t:
        count -= 1
    return count


def _messages_before(first: int, interval: float, end_ns: int) -> int:
    """How many messages of a publisher are intended before end_ns."""
    return _intended_by(first, interval, end_ns - 1)

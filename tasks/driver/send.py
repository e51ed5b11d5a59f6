"""The send path: open-loop publishing in batches, one heap of due times.

Profiling paho on one loop showed its per-message cost (packet objects, locks, a
callback and a ``send`` per message), not the broker, was what a paho-only driver
measured. Here the messages of a client due by now are encoded into its output buffer by
patching a pre-encoded PUBLISH (`wire.Template`) with one ``struct.pack_into`` each, then
written with one ``send`` per client per tick. The receive path is `tasks.driver.receive`.

Rate control is open-loop: message k of a publisher is *intended* at
``first + (k-1) * interval`` whether or not the previous one could be sent; latency is
measured from that time and the lag of the actual send is recorded as ``pub_delay``.
With a spec's ``tick_us`` the loop runs the schedule at most once per tick, so a message
leaves up to about a tick late (half a tick at the median), plus the wake-up's own lag;
``delay_overruns`` counts the sends later than that (`output.overrun_after_us`).
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

from .accounting import (
    C_DELAY_OVERRUNS,
    C_INFLIGHT_FULL,
    C_PUBLISHED,
    Accounting,
)
from .output import overrun_after_us
from .session import DEAD, Conn, Sessions
from .wire import Template

OUT_BUDGET = 16 << 20  # bytes queued in output buffers of all publishers of a process
OUT_RANGE = (16 << 10, 128 << 10)  # per client: parked above this many bytes
BATCH = 256  # messages encoded per client per tick at most (fairness between clients)
_GOLDEN = 0.6180339887498949
# A heap entry is one int, (intended ns - start_ns) << INDEX_BITS | client index: the same
# order as a (time, index) tuple, compared in one step (tuples compare element by element:
# bench_scheduler.py at 10,000 x 5 msgs/s, 2.88 -> 2.49 us a message; at 1000 x 50 no gain)
INDEX_BITS = 20  # a process's client indexes (limits.DRIVER_HOST_CLIENTS is far below)
INDEX_MASK = (1 << INDEX_BITS) - 1


class Scheduler:
    """Open-loop publishing for every publisher of the process, one heap of due times."""

    def __init__(self, sessions: Sessions, acct: Accounting, publishers: list[Conn],
                 start_ns: int, end_ns: int, max_inflight: int, tick_us: int = 0) -> None:
        self.sessions = sessions
        self.overrun_us = overrun_after_us(tick_us)  # sends later than this count as overruns
        self.acct = acct
        self.max_inflight = max_inflight
        self.heap: list[int] = []  # one key (INDEX_BITS) per scheduled publisher: its next message
        self.start_ns = start_ns
        size = max((c.index for c in publishers), default=-1) + 1
        if size > INDEX_MASK + 1:
            raise ValueError(f"{size} clients in one driver process: at most {INDEX_MASK + 1}")
        self.by_index: list[Conn | None] = [None] * size
        for conn in publishers:
            self.by_index[conn.index] = conn
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
                self.heap.append(self._key(conn.first, conn))
        heapq.heapify(self.heap)
        sessions.on_window = self.wake

    def next_due(self) -> int | None:
        return (self.heap[0] >> INDEX_BITS) + self.start_ns if self.heap else None

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
        start, by_index = self.start_ns, self.by_index
        stop = ((now - start + 1) << INDEX_BITS)  # keys below this are due by now
        while heap:
            entry = heap[0]
            if entry >= stop:
                break
            index = entry & INDEX_MASK
            conn = by_index[index]
            due = (entry >> INDEX_BITS) + start
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
                        replace(heap, ((after - start) << INDEX_BITS) | index)
                    else:
                        conn.scheduled = False
                        pop(heap)
                    continue
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
                replace(heap, ((due - start) << INDEX_BITS) | index)
            else:  # still behind: once a run, so not before this one ends
                pop(heap)
                later.append(((due - start) << INDEX_BITS) | index)
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
                heapq.heappush(self.heap,
                               self._key(conn.first + int(conn.seq * conn.interval), conn))

    def _key(self, due: int, conn: Conn) -> int:
        """The heap key of `conn`'s message intended at `due` (`run` writes it inline)."""
        return ((due - self.start_ns) << INDEX_BITS) | conn.index

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
        overrun past `overrun_us`."""
        b = v.bit_length() - 7
        self.delays[(b << 6) + (v >> b) if b < 34 else -1] += 1
        if v > self.overrun_us:
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


def stream_unacked(spec, seq: int, unacked: int) -> dict[str, int]:
    """How many of a publisher's last `unacked` messages (of `seq` sent) each of its
    streams holds: the messages the broker has not acknowledged are its last ones, since
    acknowledgements come in the order the messages were sent (MQTT 3.1.1, 4.6). Streams
    with none are left out."""
    cycle = max(len(spec.topic_cycle), 1)
    out: dict[str, int] = {}
    for k in range(seq - unacked + 1, seq + 1):
        stream = str(spec.publisher_index + (k - 1) % cycle)
        out[stream] = out.get(stream, 0) + 1
    return out


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

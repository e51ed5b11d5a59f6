"""The load engine: many paho clients on one selector loop, open-loop publishing.

paho owns every MQTT session (CONNECT, SUBSCRIBE, acks, keepalive); this loop owns the
sockets. paho's own ``loop()``/``loop_start()`` is never called, so no ``select()`` over
1024+ fds and no thread per client: we call ``loop_read``/``loop_write``/``loop_misc``.

Every message carries ``HEADER``: a tag of the run and stage, the publisher's global
index, its sequence number, the intended send time and the actual send time (Unix
microseconds). End-to-end latency is measured from the intended time, so a stalled
publisher cannot hide latency (no coordinated omission); the actual-minus-intended lag is
recorded separately as ``pub_delay``.
"""

from __future__ import annotations

import heapq
import json
import platform
import resource
import selectors
import ssl
import struct
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt

from .histogram import bucket_of
from .output import COUNTER_COLUMNS, DELAY_OVERRUN_US, READY_FILE, START_FILE, RawWriter, write_json
from .spec import ProcessSpec

HEADER = struct.Struct("!IIQqq")  # run tag, publisher index, sequence, intended us, sent us
_COL = {name: i for i, name in enumerate(COUNTER_COLUMNS[1:])}
_GOLDEN = 0.6180339887498949


def run_tag(run_id: str, stage_id: str) -> int:
    return zlib.crc32(f"{run_id}/{stage_id}".encode())


@dataclass
class _Client:
    spec: object
    role: str  # "pub" | "sub"
    mqtt: mqtt.Client
    fd: int = -1
    connected: bool = False
    dead: bool = False
    connect_ns: int = 0
    subscribe_ns: int = 0
    subscribed: bool = False
    seq: int = 0
    inflight: dict[int, int] = field(default_factory=dict)  # mid -> sent ns
    writing: bool = False


@dataclass
class _SeqTrack:
    last: int = 0
    missing: set[int] = field(default_factory=set)


class Engine:
    """Runs one ProcessSpec and writes the raw files through a RawWriter."""

    def __init__(self, spec: ProcessSpec, out_dir: Path) -> None:
        self.spec = spec
        self.out_dir = Path(out_dir)
        self.writer = RawWriter(self.out_dir)
        self.selector = selectors.DefaultSelector()
        self.by_fd: dict[int, _Client] = {}
        self.clients: list[_Client] = []
        self.counts: dict[int, list[int]] = defaultdict(lambda: [0] * len(_COL))
        self.hist: dict[tuple[int, str], dict[int, int]] = defaultdict(dict)
        self.tracks: dict[tuple[str, int], _SeqTrack] = defaultdict(_SeqTrack)
        self.tag = run_tag(spec.run_id, spec.stage_id)
        self.progress = 0  # packets handled by callbacks; tells loop_read when to stop
        self.accepting = True  # False after the drain: late messages are not counted
        self.status = "ok"
        self.windows: dict[str, int] = {}

    # ---- accounting -------------------------------------------------------------------
    def count(self, name: str, n: int = 1, now_ns: int | None = None) -> None:
        second = (now_ns if now_ns is not None else time.time_ns()) // 1_000_000_000
        self.counts[second][_COL[name]] += n

    def observe(self, kind: str, value_us: int, now_ns: int) -> None:
        hist = self.hist[(now_ns // 1_000_000_000, kind)]
        bucket = bucket_of(value_us)
        hist[bucket] = hist.get(bucket, 0) + 1

    def event(self, kind: str, client: _Client | None = None, **fields) -> None:
        record = {"t": time.time(), "event": kind, **fields}
        if client is not None:
            record["client_id"] = client.spec.client_id
        self.writer.event(record)

    # ---- paho callbacks -------------------------------------------------------------
    def _on_connect(self, client, state: _Client, flags, reason, properties) -> None:
        now = time.time_ns()
        self.progress += 1
        if reason.is_failure:
            self.count("connects_failed", now_ns=now)
            self.count("errors", now_ns=now)
            self.event("connect_refused", state, code=int(reason.value), reason=str(reason))
            self._drop(state)
            return
        state.connected = True
        self.count("connects_ok", now_ns=now)
        self.observe("connect", (now - state.connect_ns) // 1000, now)
        if state.role == "sub":
            topics = [(topic, state.spec.qos) for topic in state.spec.topics]
            state.subscribe_ns = time.time_ns()
            client.subscribe(topics)

    def _on_subscribe(self, client, state: _Client, mid, reasons, properties) -> None:
        now = time.time_ns()
        self.progress += 1
        if any(r.is_failure for r in reasons):
            self.count("errors", now_ns=now)
            self.event("subscribe_refused", state, codes=[int(r.value) for r in reasons])
            return
        state.subscribed = True
        self.observe("subscribe", (now - state.subscribe_ns) // 1000, now)

    def _on_publish(self, client, state: _Client, mid, reason, properties) -> None:
        sent = state.inflight.pop(mid, None)
        if sent is None:  # QoS 0 completions are not acks
            return
        now = time.time_ns()
        self.progress += 1
        self.count("acked", now_ns=now)
        self.observe("pub_ack", (now - sent) // 1000, now)

    def _on_message(self, client, state: _Client, message) -> None:
        now = time.time_ns()
        self.progress += 1
        if not self.accepting:
            return
        payload = message.payload
        if len(payload) < HEADER.size:
            self.count("errors", now_ns=now)
            return
        tag, publisher, seq, intended_us, _sent_us = HEADER.unpack_from(payload)
        if tag != self.tag:
            return  # a stray message from another run or stage
        self.count("received", now_ns=now)
        self.observe("e2e", now // 1000 - intended_us, now)
        self._track(state, publisher, seq, now)

    def _track(self, state: _Client, publisher: int, seq: int, now: int) -> None:
        track = self.tracks[(state.spec.client_id, publisher)]
        if seq == track.last + 1:
            track.last = seq
        elif seq > track.last:
            gap = range(track.last + 1, seq)
            track.missing.update(gap)
            self.count("lost", len(gap), now_ns=now)
            track.last = seq
        elif seq in track.missing:
            track.missing.discard(seq)
            self.count("out_of_order", now_ns=now)
        else:
            self.count("duplicated", now_ns=now)

    def _on_disconnect(self, client, state: _Client, flags, reason, properties) -> None:
        self.progress += 1
        if not state.dead:  # a disconnect we did not ask for
            self._lost(state, int(reason.value), str(reason))

    # ---- sockets --------------------------------------------------------------------
    def _drop(self, state: _Client) -> None:
        state.dead = True
        state.connected = False
        if state.fd in self.by_fd:
            try:
                self.selector.unregister(state.fd)
            except (KeyError, ValueError, OSError):
                pass
            del self.by_fd[state.fd]

    def _new_client(self, spec, role: str) -> _Client:
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=spec.client_id,
            clean_session=self.spec.clean_session, protocol=mqtt.MQTTv311,
        )
        state = _Client(spec=spec, role=role, mqtt=client)
        client.user_data_set(state)
        client.max_inflight_messages_set(0)  # our own window counts inflight_full events
        client.max_queued_messages_set(0)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_disconnect = self._on_disconnect
        broker = self.spec.broker
        if broker.username:
            client.username_pw_set(broker.username, broker.password)
        if broker.tls:
            client.tls_set(ca_certs=broker.ca_file, cert_reqs=ssl.CERT_REQUIRED)
        return state

    def _open(self, state: _Client) -> None:
        broker = self.spec.broker
        state.connect_ns = time.time_ns()
        try:
            state.mqtt.connect(broker.host, broker.port, keepalive=self.spec.keepalive_s)
        except (OSError, ssl.SSLError) as exc:
            self.count("connects_failed")
            self.count("errors")
            self.event("connect_failed", state, error=f"{type(exc).__name__}: {exc}")
            state.dead = True
            return
        sock = state.mqtt.socket()
        state.fd = sock.fileno()
        self.by_fd[state.fd] = state
        self.selector.register(sock, selectors.EVENT_READ, state)
        self._want_write(state)

    def _want_write(self, state: _Client) -> None:
        wants = state.mqtt.want_write()
        if wants != state.writing and state.fd in self.by_fd:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if wants else 0)
            self.selector.modify(state.mqtt.socket(), events, state)
            state.writing = wants

    def poll(self, timeout: float) -> None:
        """Service every socket that is ready, waiting at most `timeout` seconds."""
        for key, events in self.selector.select(timeout):
            state: _Client = key.data
            if events & selectors.EVENT_READ:
                for _ in range(256):  # paho reads about one packet per call
                    before = self.progress
                    rc = state.mqtt.loop_read()
                    if rc != mqtt.MQTT_ERR_SUCCESS or state.dead:
                        if not state.dead:
                            self._lost(state, rc)
                        break
                    if self.progress == before:
                        break
            if not state.dead and events & selectors.EVENT_WRITE:
                if state.mqtt.loop_write() not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_AGAIN):
                    self._lost(state, mqtt.MQTT_ERR_CONN_LOST)
            if not state.dead:
                self._want_write(state)

    def _lost(self, state: _Client, code: int, reason: str = "") -> None:
        if not state.dead:
            self.count("errors")
            self.event("connection_lost", state, code=int(code), reason=reason)
            self._drop(state)

    def _housekeeping(self) -> None:
        for state in self.clients:
            if not state.dead and state.fd in self.by_fd:
                if state.mqtt.loop_misc() != mqtt.MQTT_ERR_SUCCESS:
                    self._lost(state, mqtt.MQTT_ERR_CONN_LOST)

    # ---- phases ---------------------------------------------------------------------
    def connect_all(self) -> None:
        """Open every client at the paced rate, then wait for CONNACKs and SUBACKs."""
        pending = [self._new_client(s, "sub") for s in self.spec.subscribers]
        pending += [self._new_client(p, "pub") for p in self.spec.publishers]
        self.clients = list(pending)
        interval = 1.0 / self.spec.connect_rate
        deadline = time.monotonic() + self.spec.connect_timeout_s
        next_at = time.monotonic()
        queue = list(reversed(pending))
        while time.monotonic() < deadline:
            waiting = [c for c in self.clients if not c.dead and c.fd >= 0 and not self._ready(c)]
            if not queue and not waiting:
                break
            now = time.monotonic()
            while queue and now >= next_at and len(waiting) < self.spec.max_pending_connects:
                state = queue.pop()
                self._open(state)
                waiting.append(state)
                next_at += interval
            self.poll(0.005)
        for state in self.clients:
            if not state.dead and not self._ready(state):
                self.count("connects_failed" if not state.connected else "errors")
                self.event("not_ready", state, connected=state.connected)
                self._drop(state)

    @staticmethod
    def _ready(state: _Client) -> bool:
        return state.connected and (state.role == "pub" or state.subscribed)

    def wait_for_start(self) -> int | None:
        """Report readiness, then wait for the orchestrator's common start time."""
        ready = sum(1 for c in self.clients if self._ready(c))
        write_json(self.out_dir / READY_FILE, {"ready": ready, "clients": len(self.clients)})
        start_file = self.out_dir / START_FILE
        deadline = time.monotonic() + self.spec.start_timeout_s
        last_misc = 0.0
        while time.monotonic() < deadline:
            if start_file.exists():
                try:
                    return int(json.loads(start_file.read_text())["start_at"])
                except (ValueError, KeyError):
                    pass  # half-written: read again on the next tick
            self.poll(0.05)
            if time.monotonic() - last_misc > 1.0:
                self._housekeeping()
                last_misc = time.monotonic()
        self.event("no_start", timeout_s=self.spec.start_timeout_s)
        return None

    def publish_until(self, start_at: int) -> None:
        """Publish open-loop from start_at until the end of the measure window, then drain."""
        pub_end = start_at + self.spec.warmup_s + self.spec.measure_s
        self.windows = {"start": start_at, "measure_start": start_at + self.spec.warmup_s,
                        "measure_end": pub_end, "end": pub_end + self.spec.drain_s}
        publishers = [c for c in self.clients if c.role == "pub"]
        pad = {c.spec.payload_bytes: bytes(c.spec.payload_bytes - HEADER.size) for c in publishers}
        heap = []
        for state in publishers:
            interval = 1_000_000_000 / state.spec.rate
            phase = int(interval * ((state.spec.publisher_index * _GOLDEN) % 1.0))
            heap.append((start_at * 1_000_000_000 + phase, interval, id(state), state))
        heapq.heapify(heap)
        while time.time() < start_at:
            self.poll(min(0.05, max(0.0, start_at - time.time())))
        end_ns = pub_end * 1_000_000_000
        last_misc = time.monotonic()
        while heap and heap[0][0] < end_ns:
            now = time.time_ns()
            sent = 0
            while heap and heap[0][0] <= now and heap[0][0] < end_ns and sent < 2000:
                due, interval, key, state = heap[0]
                if self._send(state, due, pad[state.spec.payload_bytes]):
                    heapq.heapreplace(heap, (due + interval, interval, key, state))
                    sent += 1
                elif state.dead:
                    heapq.heappop(heap)
                else:  # window full: retry this message on the next tick
                    heapq.heapreplace(heap, (due + 1, interval, key, state))
                    break
            if heap:
                wait = (heap[0][0] - time.time_ns()) / 1e9
                self.poll(min(max(wait, 0.0), 0.01))
            if time.monotonic() - last_misc > 1.0:
                self._housekeeping()
                last_misc = time.monotonic()
        drain_end = self.windows["end"]
        while time.time() < drain_end:
            self.poll(0.02)
            if time.monotonic() - last_misc > 1.0:
                self._housekeeping()
                last_misc = time.monotonic()
        self.accepting = False

    def _send(self, state: _Client, due_ns: int, pad: bytes) -> bool:
        if state.dead or not state.connected:
            return False
        qos = state.spec.qos
        if qos and len(state.inflight) >= self.spec.max_inflight:
            self.count("inflight_full")
            return False
        now = time.time_ns()
        state.seq += 1
        header = HEADER.pack(self.tag, state.spec.publisher_index, state.seq,
                             int(due_ns) // 1000, now // 1000)
        info = state.mqtt.publish(state.spec.topic, header + pad, qos=qos)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            state.seq -= 1
            self._lost(state, info.rc)
            return False
        if qos:
            state.inflight[info.mid] = now
        self.count("published", now_ns=now)
        lag_us = int(now - due_ns) // 1000
        self.observe("pub_delay", lag_us, now)
        if lag_us > DELAY_OVERRUN_US:
            self.count("delay_overruns", now_ns=now)
        self._want_write(state)
        return True

    def disconnect_all(self) -> None:
        for state in self.clients:
            if not state.dead and state.connected:
                state.connected = False
                state.dead = True  # a requested disconnect is not an error
                state.mqtt.disconnect()
                state.mqtt.loop_write()
            self._drop(state)
        self.selector.close()

    # ---- whole stage ----------------------------------------------------------------
    def run(self) -> dict:
        raise_fd_limit()
        started = time.time()
        try:
            self.connect_all()
            start_at = self.wait_for_start()
            if start_at is None:
                self.status = "no_start"
            else:
                self.publish_until(start_at)
        except Exception as exc:  # the partial result is still written, with the error
            self.status = "error"
            self.event("driver_error", error=f"{type(exc).__name__}: {exc}")
        finally:
            self.disconnect_all()
        return self.finish(started)

    def finish(self, started: float) -> dict:
        self.writer.counters({s: dict(zip(_COL, row)) for s, row in self.counts.items()})
        self.writer.histograms(self.hist)
        totals = {name: sum(row[i] for row in self.counts.values()) for name, i in _COL.items()}
        if self.status == "ok" and totals["errors"]:
            self.status = "partial"
        summary = {
            "run_id": self.spec.run_id, "stage_id": self.spec.stage_id,
            "host": self.spec.host, "proc": self.spec.proc, "status": self.status,
            "windows": self.windows, "totals": totals,
            "unique_received": totals["received"] - totals["duplicated"],
            "missing_at_end": sum(len(t.missing) for t in self.tracks.values()),
            "last_seq": {str(c.spec.publisher_index): c.seq for c in self.clients if c.role == "pub"},
            "clients": {"publishers": len(self.spec.publishers),
                        "subscribers": len(self.spec.subscribers)},
            "versions": {"paho_mqtt": _paho_version(), "python": platform.python_version()},
            "clock": {"source": "time.time_ns", "offset_s": None},
            "elapsed_s": round(time.time() - started, 3),
            "config": self.spec.echo(),
        }
        self.writer.summary(summary)
        return summary


def _paho_version() -> str:
    import paho.mqtt

    return paho.mqtt.__version__


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit; returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else 1_048_576
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft

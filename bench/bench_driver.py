"""Driver speed and memory against MQTT.js, side by side in one run.

    .state/venv/bin/python bench/bench_driver.py [--quick] [--reps 3] [--only SCENARIO ...]
        [--held-us US ...] [--no-memory]

Starts its own Mosquitto on a free loopback port (ANCHORS config: max_queued_messages
1000000, max_inflight_messages 0), installs MQTT.js into bench/node_modules from the
committed package-lock.json if it is missing, then for every scenario runs perfpipe's
driver (``python -m tasks.driver``, the same process the pipeline starts) and an MQTT.js
process doing the same thing, interleaved, ``--reps`` times, and prints the medians.

Scenarios (256-byte payloads):
  pub-q0-cN   N publishers in one process, QoS 0, as fast as the socket takes it
              (perfpipe: an open-loop rate far above what the broker accepts). MQTT.js
              cannot bound its sockets' kernel send buffers, so with 1000 clients the
              broker also drains, inside the window, what MQTT.js wrote during the warm-up:
              that flatters MQTT.js's msgs per CPU-second, never perfpipe's
  pub-q0-c1000-r50k, pub-q0-c10000-r45k  1000 publishers at a fixed 50K msgs/s in total
              (50 per client), 10,000 at 45K (4.5 per client): the shape of IBM's tests,
              many clients at a low rate each. Both tools: one message per send, so
              per-message system calls dominate; bar 1.2x MQTT.js (issue #18). The
              10,000-client row was 50K (5 per client) until 2026-11-27: a 200 ms gap
              between a client's messages is the broker socket's minimum RTO, past which
              Linux ACKs the next segments at once, in the sender's system time, so that
              row swung with each tool's send jitter; at 4.5 per client a gap is past it
              unless a send is more than 22 ms later than the client's one before, as
              IBM's 1 msg/s always is (bench/ack_regime.py). MQTT.js publishes what is due
              on a 2 ms timer (`JS_TICK_US`), and perfpipe gets the same as its tick_us:
              each tool's send lateness is printed. Beside them the floor,
              bench/floor_sender.py, a CPython loop of select() and send() and nothing
              else, at the same tick: the most any Python sender can make of the row (its
              bound); and each message at its intended time (tick_us 0, the driver's
              default): perfpipe, and the floor doing the same
  pub-q1-c100 100 publishers, QoS 1, 1000 in flight per client
  sub-q0-cN   N subscribers in one process on one topic, fed by a separate perfpipe
              publisher process at 150K deliveries/s in total (fan-out 150K/N msgs/s).
              Beside them, perfpipe reading in passes `--held-us` apart (read_hold_us:
              fewer, larger reads; receive times still the kernel's stamps, deliveries
              waiting for the reads' ACKs), with the e2e p50 and, for both, the share of
              reads that may have taken more than one TCP segment; and "floor",
              bench/floor_reader.py, a CPython loop of epoll and recv_into and nothing
              else, reading as early as epoll allows: what a reader's own work per message
              has to do with the bars (not a bound: a reader that spends more per message
              reads later, in larger reads, and can cost itself and the broker less). For every
              tool, the broker's side of its sockets (`SendQueue`, from ss -ti): data
              segments per delivered message and how long deliveries waited in its socket
              send queue
A publish figure is counted by the broker (``$SYS/broker/publish/messages/received``,
``sys_interval 1``): what a tool hands to its sockets is not what the broker took, since
kernel buffers of 1000 sockets hold seconds of traffic. Only the $SYS updates inside the
measure window count (`window_rate`): Mosquitto 2.0 sends them about every 2 s whatever
sys_interval says, and the first one after the window can come after the tools stopped,
which read 6-14% low where no backlog kept the broker busy; each run prints that old
figure beside the new one. Subscribe rows: bar 1.2x MQTT.js, and the broker's CPU per
delivered message with perfpipe subscribing at most 1.1x what it is with MQTT.js. A subscribe figure is what the
tool received. CPU is the tool's user+sys from /proc over the measure window. Before
each run the bench waits for the broker to go idle, so no run pays for the previous
one's backlog. The ratio is perfpipe msgs per CPU-second
over MQTT.js msgs per CPU-second, the median of the per-repetition ratios (each
repetition runs both tools the same minute). Broker CPU is shown next to each tool: at
full rate it should be the broker, not the driver, that is saturated.

Reading the subscribe rows: perfpipe reads a socket as soon as epoll reports it (its
receive time, the kernel's stamp of the bytes' arrival, is what e2e latency is measured
against; a read late by its own work does not move it), so at fan-out rates of 150-1500
msgs/s per socket most reads return one to a few messages, and the kernel sends a TCP
ACK from the reader's context for each read that drains a socket (system time, counted
against the driver). MQTT.js's event loop turns take tens of milliseconds at 100-1000
sockets, so it reads ~30 messages per system call (with receive times as late), and
(as far as perf shows) that ACK work is then mostly done in the broker's context. Measured
here at 100 subscribers: perfpipe's user time per message is about half of MQTT.js's, its
system time about two to three times as much. At 1000 subscribers the broker cannot keep
up with the feed and messages arrive late (hundreds of ms); perfpipe then holds each
epoll pass for 1/128 of that latency (the histogram's own error, `receive.Reader.end_pass`),
which took perfpipe from 118-124K to 164-170K msgs per CPU-second there (3 repetitions each),
the broker delivering 143-147K/s instead of 103-109K/s. Never while messages are < 50 ms late.

Memory: RSS per connection from one driver process holding 1,000 then 5,000 idle
connected clients ((RSS5000 - RSS1000) / 4000), and a 10,000-client connect check.
Traffic goes only to 127.0.0.1; every process has a time bound.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
from tasks.driver.histogram import percentile  # noqa: E402
from tasks.driver.limits import MAX_RATE  # noqa: E402
from tasks.driver.wire import Template  # noqa: E402
from tasks.ports import free_port  # noqa: E402
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
FEED_RATE = 150_000  # deliveries/s into the subscribing process
PAYLOAD = 256
DELIVERY_BYTES = len(Template("bench/s", 0, PAYLOAD, 0, 0).packet)  # a subscribe row's PUBLISH
SUBSCRIBE = ("sub-q0-c1", "sub-q0-c100", "sub-q0-c1000")
JS_NODELAY = False  # --js-nodelay
PP_TICK_US: int | None = None  # --pp-tick-us
# MQTT.js's rated clients publish what is due on a timer of this period (a Node load tool's
# way); perfpipe gets the same as its tick_us on the fixed-rate rows: like for like, the
# same send granularity (each tool's lateness is printed)
JS_TICK_US = 2000
# Beside the two tools, "tool@field=value" runs a tool with that spec field set. Fixed-rate
# rows: the floor (bench/floor_sender.py) at perfpipe's tick, the bound on the row's bar
# for a CPython sender, then perfpipe sending each message at its intended time (tick_us 0,
# the driver's default) and the floor doing the same; subscribe rows: a reader that does
# nothing per message (bench/floor_reader.py) reading as early as it can, then perfpipe reading in
# passes --held-us apart (deliveries wait for the reads; the driver's default is 0)
FLOOR = "floor"
ON_TIME = ("perfpipe@tick_us=0", "floor@tick_us=0")
HELD_READ_US = (1000,)  # --held-us


def held_tools(holds) -> tuple[str, ...]:
    """The "tool@field=value" names of perfpipe reading in passes each of `holds` us apart."""
    return tuple(f"perfpipe@read_hold_us={us}" for us in holds)


def tool_variant(name: str) -> tuple[str, dict[str, int]]:
    """"perfpipe@tick_us=0" -> ("perfpipe", {"tick_us": 0}); a plain name, no settings."""
    tool, _, setting = name.partition("@")
    field, _, value = setting.partition("=")
    return tool, ({field: int(value)} if setting else {})


HELD = held_tools(HELD_READ_US)
# the IBM shape: many clients, low rate; 10,000 x 4.5/s: gaps past the broker's RTO, as
# IBM's 1 msg/s (5/s sits on it: bench/ack_regime.py)
FIXED_RATE = ("pub-q0-c1000-r50k", "pub-q0-c10000-r45k")
# perfpipe msgs per CPU-second over MQTT.js's, at least (issue #18); everything else: 1.0
BARS = {"pub-q1-c100": 0.5, **dict.fromkeys(FIXED_RATE, 1.2), **dict.fromkeys(SUBSCRIBE, 1.2)}
# broker CPU per delivered message with perfpipe subscribing over that with MQTT.js, at most
BROKER_BARS = dict.fromkeys(SUBSCRIBE, 1.1)


def cpu_ticks(pid: int) -> int:
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[int, int]:
    """(user, system) CPU ticks of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def wakeups(pid: int) -> int:
    """How many times a process has gone to sleep and been woken (its voluntary context
    switches, all threads'): on the publish rows, each is a send that found the broker
    idle and paid to wake it."""
    return sum(int(line.split()[1]) for status in Path(f"/proc/{pid}/task").glob("*/status")
               for line in status.read_text().splitlines()
               if line.startswith("voluntary_ctxt_switches"))


def us_per_message(figure: dict) -> tuple[float, float, float]:
    """(tool, tool's system time, broker) CPU microseconds per message of one run
    (`run_once`'s figure), from its own per-message figures (per_cpu_s, broker_per_10k)."""
    return (1e6 / figure["per_cpu_s"], 1e4 * figure["sys_pct"] / figure["rate"],
            100 * figure["broker_per_10k"])


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the broker


class Broker:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        conf = workdir / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                        "persistence false\nmax_queued_messages 1000000\n"
                        "max_inflight_messages 0\nlog_dest none\nsys_interval 1\n")
        binary = "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() \
            else shutil.which("mosquitto")
        if not binary:
            sys.exit("mosquitto is not installed (apt-get install mosquitto)")
        self.process = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        sys.exit(f"mosquitto did not listen on {self.port}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def settle(self, limit_s: float = 60.0) -> None:
        """Wait until the broker is idle (< 5% CPU over 0.5 s): no backlog from the last run."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            before = cpu_ticks(self.pid)
            time.sleep(0.5)
            if (cpu_ticks(self.pid) - before) / TICKS < 0.025:
                return


class SysCounter:
    """The broker's count of PUBLISH packets received, from $SYS (updated every second)."""

    TOPIC = "$SYS/broker/publish/messages/received"

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt

        self.samples: list[tuple[float, int]] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-sys")
        self.client.on_message = lambda c, u, m: self.samples.append(
            (time.time(), int(m.payload)))
        self.client.on_connect = lambda c, u, f, r, p: c.subscribe(self.TOPIC)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        deadline = time.monotonic() + 5
        while not self.samples and time.monotonic() < deadline:
            time.sleep(0.05)

    def rate(self, start: float, end: float) -> float:
        """msgs/s between the first and the last update inside [start, end]
        (`window_rate`)."""
        return window_rate(self.samples, start, end)

    def bracketing_rate(self, start: float, end: float) -> float:
        """What the bench counted before: from the last update at or before `start` to the
        first after `end`. Mosquitto 2.0 updates $SYS about every 2 s whatever sys_interval
        says, so that update often comes after the tools stopped, and the idle seconds
        count: printed beside `rate` to show the bias, never judged."""
        deadline = time.time() + 3
        while not any(t >= end for t, _ in self.samples) and time.time() < deadline:
            time.sleep(0.05)
        before = [s for s in self.samples if s[0] <= start] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= end] or self.samples[-1:]
        (t0, v0), (t1, v1) = before[-1], after[0]
        return (v1 - v0) / (t1 - t0) if t1 > t0 else 0.0

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class SendQueue:
    """The broker's side of all its established sockets over the measure window (the
    subscribers', and the feeders' and the $SYS client's, which carry next to nothing), from
    `ss -ti` (tcp_info), whichever tool reads them: data segments sent, bytes sent, and
    bytes written but not yet sent (``notsent``: under Nagle, waiting for the reader's ACK
    of the last segment; or for the congestion or receive window), sampled every `PERIOD`
    s in a thread. By Little's law the mean not-sent backlog over the bytes sent per second
    is how long a delivered byte waited in the broker's socket send queue: the delivery
    delay a reader's ACK pattern makes, which no receive time can see (a broker that falls
    behind also queues deliveries in its own memory first; this does not see that)."""

    PERIOD = 0.2  # a fork of ss each time: 60 samples in a 12 s window
    FIELDS = ("bytes_sent", "data_segs_out", "notsent")
    UNMEASURED = {"segs_per_msg": None, "queue_wait_ms": None}  # publish rows, or ss failed

    def __init__(self, port: int, start: float, end: float) -> None:
        import threading

        self.port, self.start, self.end = port, start, end
        self.samples: list[tuple[float, dict[str, dict[str, int]]]] = []
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sample(self) -> dict[str, dict[str, int]]:
        """{peer address: {field: value}} of every established socket on the broker's port."""
        text = subprocess.run(["ss", "-tinH", "state", "established",
                               f"( sport = :{self.port} )"], capture_output=True, text=True,
                              timeout=10, check=True).stdout
        sockets, peer = {}, None
        for line in text.splitlines():
            if line and not line[0].isspace():  # "Recv-Q Send-Q local peer"
                peer = line.split()[-1]
            elif peer is not None:  # the socket's tcp_info line
                sockets[peer] = {f: int(m.group(1)) if (m := re.search(rf"\b{f}:(\d+)", line))
                                 else 0 for f in self.FIELDS}
                peer = None
        return sockets

    def _run(self) -> None:
        try:
            sleep_until(self.start)
            while True:
                now = time.time()
                self.samples.append((now, self.sample()))
                if now >= self.end:
                    return
                time.sleep(min(self.PERIOD, max(0.0, self.end - time.time())))
        except (OSError, subprocess.SubprocessError) as exc:
            self.error = f"ss: {exc}"

    def result(self) -> dict:
        """Data segments per delivered message and the mean wait (ms) of a delivered byte
        in the broker's socket send queue, over the sockets open the whole window; None
        if ss failed, the window had no deliveries, or no sample came at its end."""
        self.thread.join(30)
        if self.error or len(self.samples) < 2 or self.samples[-1][0] < self.end:
            why = self.error or "no samples over the window"
            print(f"  the broker's send queue not measured: {why}")
            return dict(self.UNMEASURED)
        (t0, first), (t1, last) = self.samples[0], self.samples[-1]
        kept = first.keys() & last.keys()
        delta = lambda f: sum(last[p][f] - first[p][f] for p in kept)  # noqa: E731
        sent = delta("bytes_sent")
        if sent <= 0 or t1 <= t0:
            return dict(self.UNMEASURED)
        backlog = statistics.fmean(sum(s["notsent"] for s in sockets.values())
                                   for _, sockets in self.samples)
        return {"segs_per_msg": delta("data_segs_out") / (sent / DELIVERY_BYTES),
                "queue_wait_ms": 1000 * backlog / (sent / (t1 - t0))}


def window_rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """msgs/s from a counter's (receive time, value) updates, between the first and the
    last update inside [start, end]: only seconds in which both tools were sending count.
    0.0 when fewer than two updates fell inside (a window too short for $SYS's period)."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        return 0.0
    (t0, v0), (t1, v1) = inside[0], inside[-1]
    return (v1 - v0) / (t1 - t0)


def ensure_mqttjs() -> None:
    if (BENCH / "node_modules" / "mqtt" / "package.json").exists():
        return
    if not shutil.which("npm"):
        sys.exit("npm is needed for the MQTT.js side (apt-get install npm)")
    command = ["npm", "ci"] if (BENCH / "package-lock.json").exists() else ["npm", "install"]
    print(f"installing MQTT.js: {' '.join(command)} in {BENCH}", flush=True)
    subprocess.run(command + ["--no-audit", "--no-fund"], cwd=BENCH, check=True, timeout=300)


# ---- the two tools ---------------------------------------------------------------------
class Perfpipe:
    """One `python -m tasks.driver` process, run through its ready/start file protocol."""

    name = "perfpipe"

    def __init__(self, workdir: Path, spec: dict) -> None:
        self.out = workdir / f"pp-{spec['stage_id']}-{time.monotonic_ns()}"
        self.out.mkdir(parents=True)
        (self.out / "spec.json").write_text(json.dumps(spec))
        self.log = open(self.out / "driver.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tasks.driver", "--spec", str(self.out / "spec.json"),
             "--out", str(self.out)], cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.process.pid

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"driver exited early: {(self.out / 'driver.log').read_text()}")
        return (self.out / "ready.json").exists()

    def start(self, windows: dict) -> None:
        (self.out / "start.json").write_text(json.dumps({"start_at": windows["start"]}))

    def result(self, windows: dict, column: str) -> dict:
        """`column` counted in the measure window, errors, send lateness p50/p90/p99 (us),
        the e2e p50 (us), the longest read hold (ms) and the share of kernel-stamped reads
        that may have taken more than one TCP segment (%, an upper bound: their older
        messages got a newer segment's arrival time); None where nothing was measured."""
        self.process.wait(60)
        self.log.close()
        window = range(windows["measure_start"], windows["measure_end"])
        with open(self.out / "counters.csv") as handle:
            rows = list(csv.DictReader(handle))
        count = sum(int(r[column]) for r in rows if int(r["second"]) in window)
        errors = sum(int(r["errors"]) for r in rows)
        delays: dict[int, int] = {}
        e2e: dict[int, int] = {}
        with open(self.out / "histograms.csv") as handle:
            for r in csv.DictReader(handle):
                kind = {"pub_delay": delays, "e2e": e2e}.get(r["kind"])
                if kind is not None and int(r["second"]) in window:
                    bucket = int(r["bucket"])
                    kind[bucket] = kind.get(bucket, 0) + int(r["count"])
        late = {f"p{q}": percentile(delays, q) for q in (50, 90, 99)} if delays else None
        hold = json.loads((self.out / "summary.json").read_text())["read_hold"]
        reads, segments = hold["stamped_reads"], hold["segments_in"]
        return {"count": count, "errors": errors, "late_us": late,
                "e2e_p50_us": percentile(e2e, 50) if e2e else None,
                "hold_max_ms": hold["max_ms"],
                "multi_segment_pct": (100 * max(0, segments - reads) / reads
                                      if reads and segments is not None else None)}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


class MqttJs:
    """One Node process running bench/mqttjs_bench.js."""

    name = "mqtt.js"
    command = ["node", str(BENCH / "mqttjs_bench.js")]

    def __init__(self, config: dict) -> None:
        self.process = subprocess.Popen([*self.command, json.dumps(config)], cwd=BENCH, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        self.pid = self.process.pid
        self._ready = False

    def ready(self) -> bool:
        if not self._ready:
            line = self.process.stdout.readline()  # blocks until READY (bounded by caller)
            if not line:
                raise RuntimeError(f"{self.name} exited before it was ready")
            self._ready = line.strip() == "READY"
        return self._ready

    def start(self, windows: dict) -> None:
        self.process.stdin.write(json.dumps(windows) + "\n")
        self.process.stdin.flush()

    def result(self, windows: dict, column: str) -> dict:
        """As `Perfpipe.result`, from the JSON line the process prints."""
        line = self.process.stdout.readline()
        self.process.wait(30)
        doc = json.loads(line)
        return {"count": int(doc["count"]), "errors": int(doc["errors"]),
                "late_us": doc.get("late_us"), "e2e_p50_us": None, "hold_max_ms": None,
                "multi_segment_pct": None}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


class Floor(MqttJs):
    """bench/floor_sender.py: the least a CPython sender can spend (same protocol)."""

    name = "floor"
    command = [sys.executable, str(BENCH / "floor_sender.py")]


class FloorReader(MqttJs):
    """bench/floor_reader.py: a reader that does nothing per message (same protocol)."""

    name = "floor"
    command = [sys.executable, str(BENCH / "floor_reader.py")]


# ---- scenarios -------------------------------------------------------------------------
def driver_spec(stage: str, port: int, *, pubs: int = 0, subs: int = 0, qos: int = 0,
                rate: float = 0.0, topic: str = "bench/p/{i}", sub_topic: str = "bench/s",
                timing: dict, first_index: int = 1, prefix: str = "pp") -> dict:
    return {
        "run_id": "bench", "stage_id": stage, "host": "localhost", "proc": 0,
        "broker": {"host": "127.0.0.1", "port": port},
        "publishers": [{"client_id": f"{prefix}-p{i}", "topic": topic.format(i=i),
                        "publisher_index": first_index + i, "qos": qos, "rate": rate,
                        "payload_bytes": PAYLOAD} for i in range(pubs)],
        "subscribers": [{"client_id": f"{prefix}-s{i}", "topics": [sub_topic], "qos": qos}
                        for i in range(subs)],
        "max_inflight": 1000, "connect_rate": 20000.0, "max_pending_connects": 64,
        "start_timeout_s": 120.0, **timing,
    }


def tick_for(scenario: str) -> int:
    """perfpipe's tick_us on a row: --pp-tick-us if given, else MQTT.js's timer on the
    fixed-rate rows and 0 (each message at its intended time) elsewhere."""
    if PP_TICK_US is not None:
        return PP_TICK_US
    return JS_TICK_US if scenario in FIXED_RATE else 0


def run_undisturbed(tool: str, scenario: str, broker: Broker, sys_counter: SysCounter,
                    workdir: Path, timing: dict, label: str) -> dict:
    """`run_once`, run again (at most 3 times in all) while a run is disturbed: nothing
    counted, or errors. The last figure is returned either way."""
    for _ in range(3):
        figure = run_once(tool, scenario, broker, sys_counter, workdir, timing)
        if figure["rate"] > 0 and not figure["errors"]:
            break
        print(f"  {label} {scenario} {tool}: disturbed run ({figure}), running it again",
              flush=True)
    return figure


def run_once(tool_name: str, scenario: str, broker: Broker, sys_counter: SysCounter,
             workdir: Path, timing: dict) -> dict:
    role, q, c, *rated = scenario.split("-")
    fixed = int(rated[0][1:-1]) * 1000 if rated else 0  # "r50k": 50,000 msgs/s in total
    tool_name, overrides = tool_variant(tool_name)
    tick_us = overrides.get("tick_us", tick_for(scenario))
    qos, clients = int(q[1:]), int(c[1:])
    port, broker_pid = broker.port, broker.pid
    broker.settle()
    procs = []
    feeder = None
    if role == "pub":
        column = "acked" if qos else "published"
        if tool_name == "perfpipe":
            # flat out: an open-loop rate far above what the broker accepts (at most the
            # driver's own per-publisher limit)
            rate = fixed / clients if fixed else min(3_000_000 / clients, MAX_RATE)
            spec = driver_spec(scenario, port, pubs=clients, qos=qos, rate=rate, timing=timing)
            tool = Perfpipe(workdir, {**spec, "tick_us": tick_us, **overrides})
        elif tool_name == "floor":
            if set(overrides) - {"tick_us"}:
                raise ValueError(f"{tool_name}: only tick_us can be set, not {overrides}")
            tool = Floor({"port": port, "clients": clients, "rate": fixed / clients,
                          "tick_us": tick_us, "payload": PAYLOAD, "prefix": f"floor-{scenario}"})
        else:
            tool = MqttJs({"port": port, "mode": "pub", "clients": clients, "qos": qos,
                           "payload": PAYLOAD, "topic": "bench/p", "inflight": 1000,
                           "prefix": f"js-{scenario}",
                           "rate": fixed / clients if fixed else 0,
                           "tick_ms": JS_TICK_US / 1000, "nodelay": JS_NODELAY})
    else:
        column = "received"
        # 10 feeding publishers; the broker fans each message out to every subscriber
        feed = driver_spec(scenario, port, pubs=10, rate=FEED_RATE / clients / 10,
                           topic="bench/s", timing=timing, prefix="feed")
        feed["tick_us"] = 1000  # batches: the feeder must not be what limits the rate
        feeder = Perfpipe(workdir, feed)
        if tool_name == "perfpipe":
            tool = Perfpipe(workdir, {**driver_spec(scenario, port, subs=clients, qos=qos,
                                                    timing=timing), **overrides})
        elif tool_name == "floor":
            if qos or overrides:
                raise ValueError(f"{tool_name}: QoS 0 and no settings, not {overrides}")
            tool = FloorReader({"port": port, "clients": clients, "topic": "bench/s",
                                "delivery_bytes": DELIVERY_BYTES, "prefix": f"floor-{scenario}"})
        else:
            tool = MqttJs({"port": port, "mode": "sub", "clients": clients, "qos": qos,
                           "topic": "bench/s", "prefix": f"js-{scenario}"})
    procs = [tool] + ([feeder] if feeder else [])
    try:
        deadline = time.monotonic() + 120
        for proc in procs:
            while not proc.ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.name} not ready in 120 s")
                time.sleep(0.05)
        start = int(time.time()) + 2
        windows = {"start": start, "measure_start": start + timing["warmup_s"],
                   "measure_end": start + timing["warmup_s"] + timing["measure_s"]}
        windows["end"] = windows["measure_end"] + timing["drain_s"]
        # the feeder's windows come from its own spec (same timing, same start)
        for proc in procs:
            proc.start(windows)
        queue = (SendQueue(port, windows["measure_start"], windows["measure_end"])
                 if role == "sub" else None)
        sleep_until(windows["measure_start"])
        t0, tool0, broker0 = time.time(), cpu_split(tool.pid), cpu_ticks(broker_pid)
        woken0 = wakeups(broker_pid)
        sleep_until(windows["measure_end"])
        t1, tool1, broker1 = time.time(), cpu_split(tool.pid), cpu_ticks(broker_pid)
        woken1 = wakeups(broker_pid)
        measured = tool.result(windows, column)
        if feeder:
            feeder.result(windows, "published")
    finally:
        for proc in procs:
            proc.kill()
    bracketing = None
    if role == "pub":
        rate = sys_counter.rate(windows["measure_start"], windows["measure_end"])
        bracketing = sys_counter.bracketing_rate(windows["measure_start"], windows["measure_end"])
    else:
        rate = measured["count"] / timing["measure_s"]
    cpu_share = (sum(tool1) - sum(tool0)) / TICKS / (t1 - t0)
    sys_share = (tool1[1] - tool0[1]) / TICKS / (t1 - t0)
    broker_share = (broker1 - broker0) / TICKS / (t1 - t0)
    return {"rate": rate, "cpu_pct": 100 * cpu_share, "sys_pct": 100 * sys_share,
            "tool_count_rate": measured["count"] / (t1 - t0), "bracketing_rate": bracketing,
            "per_cpu_s": rate / cpu_share if cpu_share > 0 else float("inf"),
            "broker_pct": 100 * broker_share, "errors": measured["errors"],
            "late_us": measured["late_us"], "hold_max_ms": measured["hold_max_ms"],
            "multi_segment_pct": measured["multi_segment_pct"],
            "e2e_p50_us": measured["e2e_p50_us"],
            **(queue.result() if queue else SendQueue.UNMEASURED),
            # broker CPU-seconds per 10,000 messages it took or delivered
            "broker_per_10k": 10_000 * broker_share / rate if rate > 0 else float("inf"),
            "broker_wakes_per_msg": ((woken1 - woken0) / (rate * (t1 - t0)) if rate > 0
                                     else float("inf"))}


def sleep_until(unix_s: float) -> None:
    while (left := unix_s - time.time()) > 0:
        time.sleep(min(left, 0.5))


# ---- memory ------------------------------------------------------------------------------
def idle_rss(port: int, workdir: Path, clients: int, tool_name: str) -> tuple[int, float]:
    """RSS of one process holding `clients` idle connected subscribers, and its connect time."""
    began = time.monotonic()
    if tool_name == "perfpipe":
        spec = driver_spec(f"idle{clients}", port, subs=clients,
                           sub_topic="bench/idle", timing={"warmup_s": 0, "measure_s": 1,
                                                           "drain_s": 0},
                           prefix=f"idle{clients}")
        tool = Perfpipe(workdir, spec)
    else:
        tool = MqttJs({"port": port, "mode": "sub", "clients": clients, "qos": 0,
                       "topic": "bench/idle", "prefix": f"jsidle{clients}"})
    try:
        deadline = time.monotonic() + 180
        while not tool.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tool.name}: {clients} clients not ready in 180 s")
            time.sleep(0.05)
        connect_s = time.monotonic() - began
        time.sleep(1.0)  # settle
        rss = rss_bytes(tool.pid)
        start = int(time.time()) + 1
        tool.start({"start": start, "measure_start": start, "measure_end": start + 1,
                    "end": start + 1})
        tool.result({"measure_start": start, "measure_end": start + 1}, "received")
        return rss, connect_s
    finally:
        tool.kill()


def connect_check(port: int, workdir: Path, clients: int) -> dict:
    spec = driver_spec("connect10k", port, subs=clients, sub_topic="bench/idle",
                       timing={"warmup_s": 0, "measure_s": 1, "drain_s": 0}, prefix="c10k")
    tool = Perfpipe(workdir, spec)
    try:
        deadline = time.monotonic() + 180
        while not tool.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{clients} clients not ready in 180 s")
            time.sleep(0.05)
        rss = rss_bytes(tool.pid)
        start = int(time.time()) + 1
        tool.start({"start": start})
        tool.process.wait(60)
    finally:
        tool.kill()
    summary = json.loads((tool.out / "summary.json").read_text())
    phase = summary["connect_phase"]
    return {"connected": phase["connected"], "clients": phase["clients"],
            "errors": summary["totals"]["errors"], "duration_s": phase["duration_s"],
            "rss": rss, "status": summary["status"], "fd_limit": summary.get("fd_limit")}


# ---- report ------------------------------------------------------------------------------
def tools_for(scenario: str) -> list[str]:
    extra = (FLOOR, *ON_TIME) if scenario in FIXED_RATE else (FLOOR, *HELD) \
        if scenario in SUBSCRIBE else ()
    return ["perfpipe", "mqtt.js", *extra]


def print_precise(scenario: str, rows: dict[str, list[dict]], reps: int) -> None:
    """A fixed-rate row's send lateness, and its bound when each message leaves on time."""
    med = lambda tool: statistics.median(r["per_cpu_s"] for r in rows[tool])  # noqa: E731
    ratio = lambda a, b: statistics.median(  # noqa: E731
        x["per_cpu_s"] / max(y["per_cpu_s"], 1e-9) for x, y in zip(rows[a], rows[b]))
    print(f"{scenario} (median of {reps}), send lateness p50/p99: perfpipe at tick_us "
          f"{tick_for(scenario)} {late_text(median_late(rows['perfpipe']))}, MQTT.js "
          f"{late_text(median_late(rows['mqtt.js']))}")
    print(f"  the floor at the same tick (select and send only, the most a CPython sender can "
          f"make of the row): {fmt(med(FLOOR))} msgs/CPU-s "
          f"({late_text(median_late(rows[FLOOR]))}), over MQTT.js "
          f"{ratio(FLOOR, 'mqtt.js'):.2f}; perfpipe over the floor {ratio('perfpipe', FLOOR):.2f}")
    pp0, floor0 = ON_TIME
    print(f"  each message at its intended time (tick_us 0): perfpipe "
          f"{fmt(med(pp0))} msgs/CPU-s ({late_text(median_late(rows[pp0]))}), "
          f"the floor {fmt(med(floor0))} ({late_text(median_late(rows[floor0]))}; select and "
          f"send only, bench/floor_sender.py): "
          f"floor over MQTT.js {ratio(floor0, 'mqtt.js'):.2f}, perfpipe over the floor "
          f"{ratio(pp0, floor0):.2f}, over MQTT.js {ratio(pp0, 'mqtt.js'):.2f}")


def print_held(scenario: str, rows: dict[str, list[dict]], reps: int) -> None:
    """A subscribe row's receive times, and the same row read in held passes: what reading
    as late as MQTT.js does buys, and what it costs. Receive times are the kernel's stamps
    either way (late only for a read that took more than one segment, whose share is
    bounded here); a hold's cost is the broker's: it sends a socket's next segment once the
    last is ACKed, and the ACK goes with the read, so deliveries wait in its send queue
    (`SendQueue` measures that wait for every tool, MQTT.js too)."""
    med = lambda tool, key: statistics.median(  # noqa: E731
        [r[key] for r in rows[tool] if r[key] is not None] or [float("nan")])
    ratio = lambda a, b, key: statistics.median(  # noqa: E731
        x[key] / max(y[key], 1e-12) for x, y in zip(rows[a], rows[b]))
    print(f"{scenario} (median of {reps}): perfpipe's e2e p50 "
          f"{med('perfpipe', 'e2e_p50_us') / 1000:.2f} ms, longest read hold "
          f"{med('perfpipe', 'hold_max_ms'):.2f} ms, kernel-stamped reads that may have taken "
          f"more than one TCP segment <= {med('perfpipe', 'multi_segment_pct'):.1f}%")
    print(f"  the floor (epoll and recv only, bench/floor_reader.py: a reader that does nothing "
          f"per message, reading as early as it can): {fmt(med(FLOOR, 'per_cpu_s'))} "
          f"msgs/CPU-s, over MQTT.js {ratio(FLOOR, 'mqtt.js', 'per_cpu_s'):.2f}; broker per "
          f"message over MQTT.js's {ratio(FLOOR, 'mqtt.js', 'broker_per_10k'):.2f}; perfpipe "
          f"over the floor {ratio('perfpipe', FLOOR, 'per_cpu_s'):.2f}")
    for held in HELD:
        print(f"  reading in passes {tool_variant(held)[1]['read_hold_us']} us apart "
              "(read_hold_us): "
              f"{fmt(med(held, 'per_cpu_s'))} msgs/CPU-s, over MQTT.js "
              f"{ratio(held, 'mqtt.js', 'per_cpu_s'):.2f}; broker per message over MQTT.js's "
              f"{ratio(held, 'mqtt.js', 'broker_per_10k'):.2f}; e2e p50 "
              f"{med(held, 'e2e_p50_us') / 1000:.2f} ms; reads over one segment <= "
              f"{med(held, 'multi_segment_pct'):.1f}%")
    print("  the broker's side (ss -ti on its sockets, SendQueue): data segments per delivered "
          "message / mean wait of a delivered byte in its socket send queue / broker CPU-s per 10K:")
    for tool in ("perfpipe", FLOOR, *HELD, "mqtt.js"):
        print(f"    {tool:<28} {med(tool, 'segs_per_msg'):.2f} / "
              f"{med(tool, 'queue_wait_ms'):.3f} ms / {med(tool, 'broker_per_10k'):.4f}")


def late_text(late: dict | None) -> str:
    if not late:
        return "-"
    return f"{late['p50'] / 1000:.2f}/{late['p99'] / 1000:.2f} ms"


def median_late(rows: list[dict]) -> dict | None:
    """The per-repetition send lateness percentiles' medians (None if a tool gave none)."""
    lates = [r["late_us"] for r in rows if r["late_us"]]
    if not lates:
        return None
    return {key: statistics.median(late[key] for late in lates) for key in lates[0]}


def fmt(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}K"
    return f"{value:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s warm-up, 4 s window")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="scenarios to run (default: all)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory checks")
    parser.add_argument("--js-nodelay", action="store_true",
                        help="MQTT.js publishers with TCP_NODELAY, as perfpipe's (Node leaves "
                        "Nagle on, which batches small publishes by waiting for ACKs)")
    parser.add_argument("--pp-tick-us", type=int, default=None,
                        help="perfpipe publishers wake at most every N us (the driver's "
                        f"tick_us; default: MQTT.js's timer, {JS_TICK_US} us, on the "
                        "fixed-rate rows, 0 (each message at its intended time) elsewhere)")
    parser.add_argument("--held-us", type=int, nargs="+", default=list(HELD_READ_US),
                        help="subscribe rows: also run perfpipe reading in passes this many "
                        f"us apart (read_hold_us), one run per value (default: {HELD_READ_US[0]})")
    args = parser.parse_args(argv)
    global JS_NODELAY, PP_TICK_US, HELD
    JS_NODELAY, PP_TICK_US = args.js_nodelay, args.pp_tick_us
    HELD = held_tools(args.held_us)
    timing = ({"warmup_s": 1, "measure_s": 4, "drain_s": 1} if args.quick
              else {"warmup_s": 3, "measure_s": 12, "drain_s": 1})
    scenarios = ["pub-q0-c1", "pub-q0-c100", "pub-q0-c1000", *FIXED_RATE, "pub-q1-c100",
                 *SUBSCRIBE]
    if args.only:
        scenarios = [s for s in scenarios if s in args.only]
    raise_nofile()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # still stop broker and tools
    ensure_mqttjs()
    workdir = Path(tempfile.mkdtemp(prefix="perfpipe-bench-"))
    broker = Broker(workdir)
    sys_counter = SysCounter(broker.port)
    results: dict[str, dict[str, list[dict]]] = {s: {t: [] for t in tools_for(s)}
                                                 for s in scenarios}
    ok = True
    try:
        for rep in range(args.reps):
            for scenario in scenarios:
                order = tools_for(scenario)[::1 if rep % 2 == 0 else -1]
                for tool in order:
                    figure = run_undisturbed(tool, scenario, broker, sys_counter, workdir,
                                             timing, f"rep {rep + 1}")
                    results[scenario][tool].append(figure)
                    print(f"  rep {rep + 1} {scenario:<17} {tool:<8} {fmt(figure['rate']):>7} "
                          f"msgs/s  cpu {figure['cpu_pct']:5.1f}% (sys {figure['sys_pct']:4.1f}%)  "
                          f"{fmt(figure['per_cpu_s']):>7} msgs/CPU-s  "
                          f"broker {figure['broker_pct']:5.1f}% "
                          f"({figure['broker_per_10k']:.3f} CPU-s/10K)  errors {figure['errors']}  "
                          + (f"send late p50/p99 {late_text(figure['late_us'])}, broker woke "
                             f"{figure['broker_wakes_per_msg']:.3f}/msg  "
                             if figure["late_us"] and scenario in FIXED_RATE else "")
                          + (f"e2e p50 {figure['e2e_p50_us'] / 1000:.2f} ms, longest read hold "
                             f"{figure['hold_max_ms']:.2f} ms, reads over one segment <= "
                             f"{figure['multi_segment_pct']:.1f}%  "
                             if figure["e2e_p50_us"] and figure["multi_segment_pct"] is not None
                             else "")
                          + (f"broker sent {figure['segs_per_msg']:.2f} segments/msg, "
                             f"waited {figure['queue_wait_ms']:.3f} ms in its socket send queue  "
                             if figure["segs_per_msg"] is not None else "")
                          + f"(tool counted {fmt(figure['tool_count_rate'])}/s"
                          + (f"; $SYS from the update before the window to the one after: "
                             f"{fmt(figure['bracketing_rate'])}/s, "
                             f"{100 * (figure['bracketing_rate'] / figure['rate'] - 1):+.1f}%"
                             if figure["bracketing_rate"] and figure["rate"] else "") + ")",
                          flush=True)
        print()
        print(f"median of {args.reps}; window {timing['measure_s']} s after "
              f"{timing['warmup_s']} s warm-up; payload {PAYLOAD} B; Mosquitto on loopback")
        header = (f"{'scenario':<31} | {'perfpipe msgs/s':>15} | {'pp CPU%':>7} | "
                  f"{'pp msgs/CPU-s':>13} | {'broker% (pp)':>12} | {'MQTT.js msgs/s':>14} | "
                  f"{'js CPU%':>7} | {'js msgs/CPU-s':>13} | {'broker% (js)':>12} | "
                  f"{'ratio':>5} | {'bar':>4} | ok   | {'broker/msg pp:js':>16} | {'bar':>4} | ok")
        print(header)
        print("-" * len(header))
        for scenario in scenarios:
            pp, js = results[scenario]["perfpipe"], results[scenario]["mqtt.js"]
            med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
            ratio = statistics.median(a["per_cpu_s"] / max(b["per_cpu_s"], 1e-9)
                                      for a, b in zip(pp, js))
            bar = BARS.get(scenario, 1.0)
            passed = ratio >= bar
            # what the broker spent per message with each tool on the other end
            broker_ratio = statistics.median(a["broker_per_10k"] / max(b["broker_per_10k"], 1e-12)
                                             for a, b in zip(pp, js))
            broker_bar = BROKER_BARS.get(scenario)
            broker_ok = broker_bar is None or broker_ratio <= broker_bar
            ok &= passed and broker_ok
            tick = tick_for(scenario)  # the perfpipe column's setting, where not the default
            label = f"{scenario}@tick_us={tick}" if tick else scenario
            print(f"{label:<31} | {fmt(med(pp, 'rate')):>15} | {med(pp, 'cpu_pct'):7.1f} | "
                  f"{fmt(med(pp, 'per_cpu_s')):>13} | {med(pp, 'broker_pct'):12.1f} | "
                  f"{fmt(med(js, 'rate')):>14} | {med(js, 'cpu_pct'):7.1f} | "
                  f"{fmt(med(js, 'per_cpu_s')):>13} | {med(js, 'broker_pct'):12.1f} | "
                  f"{ratio:5.2f} | {bar:4.1f} | {'yes' if passed else 'NO ':<4} | "
                  f"{broker_ratio:16.2f} | {'-' if broker_bar is None else f'{broker_bar:4.1f}':>4} | "
                  f"{'info' if broker_bar is None else 'yes' if broker_ok else 'NO'}")
        for scenario in scenarios:
            if scenario in FIXED_RATE:
                print_precise(scenario, results[scenario], args.reps)
            elif scenario in SUBSCRIBE:
                print_held(scenario, results[scenario], args.reps)
        if not args.no_memory:
            print()
            broker.settle()
            rss1, _ = idle_rss(broker.port, workdir, 1000, "perfpipe")
            rss5, t5 = idle_rss(broker.port, workdir, 5000, "perfpipe")
            per_conn = (rss5 - rss1) / 4000
            mem_ok = per_conn <= 5 * 1024
            ok &= mem_ok
            print(f"idle memory, perfpipe: RSS {rss1 / 2**20:.1f} MiB at 1000 clients, "
                  f"{rss5 / 2**20:.1f} MiB at 5000 -> {per_conn / 1024:.2f} KB per connection "
                  f"(bar 5 KB: {'yes' if mem_ok else 'NO'}); 5000 ready in {t5:.1f} s")
            js1, _ = idle_rss(broker.port, workdir, 1000, "mqtt.js")
            js5, _ = idle_rss(broker.port, workdir, 5000, "mqtt.js")
            print(f"idle memory, MQTT.js:  RSS {js1 / 2**20:.1f} MiB at 1000 clients, "
                  f"{js5 / 2**20:.1f} MiB at 5000 -> {(js5 - js1) / 4000 / 1024:.2f} KB per "
                  f"connection")
            check = connect_check(broker.port, workdir, 10_000)
            rate = check["connected"] / check["duration_s"] if check["duration_s"] else 0.0
            c_ok = check["connected"] == 10_000 and check["errors"] == 0
            ok &= c_ok
            print(f"10,000-client connect, one perfpipe process: {check['connected']} connected, "
                  f"{check['errors']} errors, first CONNECT to last CONNACK "
                  f"{check['duration_s']:.2f} s ({fmt(rate)}/s, paced: 64 pending), RSS "
                  f"{check['rss'] / 2**20:.1f} MiB, fd limit {check['fd_limit']}, "
                  f"status {check['status']} ({'yes' if c_ok else 'NO'})")
    finally:
        sys_counter.stop()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print("all bars met" if ok else "SOME BARS NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

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
              else, at the same tick: the least Python a sender can run a message (not a
              strict bound: its sends wake the broker more often than perfpipe's, and each
              wake-up costs the sender; bench/README.md); and each message at its
              intended time (tick_us 0, the driver's default): perfpipe, and the floor
              doing the same
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
measure window count (`broker_side.window_rate`): Mosquitto 2.0 sends them about every 2 s whatever
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

The broker and what is read from it (`Broker`, `SysCounter`, `SendQueue`, /proc) are in
bench/broker_side.py, the tools' processes in bench/load_tools.py; this file has the rows,
one run of a tool on a row (`run_once`), the bars and the report.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from broker_side import (  # noqa: E402
    TICKS, Broker, SendQueue, SysCounter, cpu_split, cpu_ticks, raise_nofile, rss_bytes,
    sleep_until, wakeups,
)
from load_tools import REPO, Floor, FloorReader, MqttJs, Perfpipe, ensure_mqttjs  # noqa: E402
from tasks.driver.limits import MAX_RATE  # noqa: E402
from tasks.driver.wire import Template  # noqa: E402

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
# rows: the floor (bench/floor_sender.py) at perfpipe's tick, the least Python a sender can
# run a message, then perfpipe sending each message at its intended time (tick_us 0,
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
SCENARIOS = ("pub-q0-c1", "pub-q0-c100", "pub-q0-c1000", *FIXED_RATE, "pub-q1-c100",
             *SUBSCRIBE)  # every row, in the order a full run takes them


def us_per_message(figure: dict) -> tuple[float, float, float]:
    """(tool, tool's system time, broker) CPU microseconds per message of one run
    (`run_once`'s figure), from its own per-message figures (per_cpu_s, broker_per_10k)."""
    return (1e6 / figure["per_cpu_s"], 1e4 * figure["sys_pct"] / figure["rate"],
            100 * figure["broker_per_10k"])


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


def disturbed(figure: dict) -> bool:
    """A run that counted nothing or had errors (`run_once`'s figure)."""
    return figure["rate"] <= 0 or bool(figure["errors"])


def run_undisturbed(tool: str, scenario: str, broker: Broker, sys_counter: SysCounter,
                    workdir: Path, timing: dict, label: str, repo: Path = REPO) -> dict:
    """`run_once`, run again (at most 3 times in all) while a run is disturbed: nothing
    counted, or errors. The last figure is returned either way."""
    for _ in range(3):
        figure = run_once(tool, scenario, broker, sys_counter, workdir, timing, repo)
        if not disturbed(figure):
            break
        print(f"  {label} {scenario} {tool}: disturbed run ({figure}), running it again",
              flush=True)
    return figure


def run_once(tool_name: str, scenario: str, broker: Broker, sys_counter: SysCounter,
             workdir: Path, timing: dict, repo: Path = REPO) -> dict:
    """One tool on one row against `broker`: its rate, CPU, the broker's CPU and what else
    the row measures. perfpipe's driver runs from `repo` (a subscribe row's feeder from
    this checkout)."""
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
            tool = Perfpipe(workdir, {**spec, "tick_us": tick_us, **overrides}, repo)
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
        feeder = Perfpipe(workdir, feed)  # this checkout's, whichever driver subscribes
        if tool_name == "perfpipe":
            tool = Perfpipe(workdir, {**driver_spec(scenario, port, subs=clients, qos=qos,
                                                    timing=timing), **overrides}, repo)
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
        queue = (SendQueue(port, windows["measure_start"], windows["measure_end"],
                           DELIVERY_BYTES) if role == "sub" else None)
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
    return {"window": (windows["measure_start"], windows["measure_end"]),
            "rate": rate, "cpu_pct": 100 * cpu_share, "sys_pct": 100 * sys_share,
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
    """A fixed-rate row's send lateness, and the floor sender at the tick and on time."""
    med = lambda tool: statistics.median(r["per_cpu_s"] for r in rows[tool])  # noqa: E731
    ratio = lambda a, b: statistics.median(  # noqa: E731
        x["per_cpu_s"] / max(y["per_cpu_s"], 1e-9) for x, y in zip(rows[a], rows[b]))
    print(f"{scenario} (median of {reps}), send lateness p50/p99: perfpipe at tick_us "
          f"{tick_for(scenario)} {late_text(median_late(rows['perfpipe']))}, MQTT.js "
          f"{late_text(median_late(rows['mqtt.js']))}")
    print(f"  the floor at the same tick (select and send only, the least Python a sender "
          f"can run a message): {fmt(med(FLOOR))} msgs/CPU-s "
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
    scenarios = list(SCENARIOS)
    if args.only:
        if unknown := [name for name in args.only if name not in SCENARIOS]:
            parser.error(f"--only: no row {', '.join(unknown)}; rows: {', '.join(SCENARIOS)}")
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

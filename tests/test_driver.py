"""The load driver against a real Mosquitto, run as `python -m tasks.driver` like on a host."""

from __future__ import annotations

import csv
import errno
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.driver import receive, send
from tasks.driver.accounting import C_PUBLISHED, Accounting
from tasks.driver.histogram import (
    MAX_RELATIVE_ERROR,
    bucket_bounds,
    bucket_of,
    percentile,
)
from tasks.driver.output import (
    COUNTERS_FILE,
    DELAY_OVERRUN_US,
    EVENTS_FILE,
    HISTOGRAMS_FILE,
    PROGRESS_FILE,
    READY_FILE,
    START_FILE,
    SUMMARY_FILE,
    RawWriter,
    overrun_after_us,
)
from tasks.driver.session import DEAD, READY, Conn, Sessions
from tasks.driver.wire import HEADER, Template
from tasks.ports import free_port, wait_listening
from tests.conftest import Broker

REPO = Path(__file__).resolve().parent.parent


def spec(port: int, *, qos: int = 0, publishers: int = 20, rate: float = 50.0,
         warmup: int = 1, measure: int = 4, drain: int = 2, topics: tuple = ("bench/#",),
         subscribers: int = 1, **extra) -> dict:
    return {
        "run_id": "test", "stage_id": f"q{qos}", "host": "localhost", "proc": 0,
        "broker": {"host": "127.0.0.1", "port": port},
        "publishers": [{"client_id": f"p{i}", "topic": "bench/t", "publisher_index": i + 1,
                        "qos": qos, "rate": rate} for i in range(publishers)],
        "subscribers": [{"client_id": f"s{i}", "topics": list(topics), "qos": qos}
                        for i in range(subscribers)],
        "warmup_s": warmup, "measure_s": measure, "drain_s": drain, **extra,
    }


def start_driver(document: dict, out: Path) -> subprocess.Popen:
    (out.parent / "spec.json").write_text(json.dumps(document))
    return subprocess.Popen([sys.executable, "-m", "tasks.driver", "--spec",
                             str(out.parent / "spec.json"), "--out", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def release(out: Path, process: subprocess.Popen, start_at: int | None = None) -> int:
    """Wait for the driver to be ready, then start it at `start_at` (default: the next
    whole second)."""
    deadline = time.monotonic() + 20
    while not (out / READY_FILE).exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "driver never got ready"
        time.sleep(0.05)
    start_at = start_at or int(time.time()) + 1
    (out / START_FILE).write_text(json.dumps({"start_at": start_at}))
    return start_at


def counters(out: Path) -> list[dict]:
    with open(out / COUNTERS_FILE) as handle:
        return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def histograms(out: Path) -> dict[str, dict[int, int]]:
    kinds: dict[str, dict[int, int]] = {}
    with open(out / HISTOGRAMS_FILE) as handle:
        for row in csv.DictReader(handle):
            counts = kinds.setdefault(row["kind"], {})
            counts[int(row["bucket"])] = counts.get(int(row["bucket"]), 0) + int(row["count"])
    return kinds


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / EVENTS_FILE).read_text().splitlines()]


def run_to_end(document: dict, out: Path, timeout: float = 30) -> tuple[int, dict]:
    process = start_driver(document, out)
    release(out, process)
    code = process.wait(timeout)
    assert "Traceback" not in process.stderr.read()
    return code, json.loads((out / SUMMARY_FILE).read_text())


@pytest.mark.alone
def test_rated_publish_delivers_within_two_percent_of_target(broker, tmp_path):
    out = tmp_path / "out"
    process = start_driver(spec(broker.port), out)
    start_at = release(out, process)
    assert process.wait(30) == 0, process.stderr.read()
    window = range(start_at + 1, start_at + 5)  # after the 1 s warm-up, 4 s
    received = sum(r["received"] for r in counters(out) if r["second"] in window)
    assert received / 4 == pytest.approx(20 * 50, rel=0.02)
    published = sum(r["published"] for r in counters(out) if r["second"] in window)
    assert published / 4 == pytest.approx(20 * 50, rel=0.02)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    phase = summary["connect_phase"]  # for a real connection rate in the aggregation
    assert phase["clients"] == phase["connected"] == 21
    assert phase["first_connect_at"] <= phase["last_connack_at"] < start_at
    assert phase["duration_s"] == pytest.approx(phase["last_connack_at"]
                                                - phase["first_connect_at"], abs=1e-5)
    kinds = histograms(out)  # one sample per message, per connect, per subscribe
    assert sum(kinds["e2e"].values()) == summary["totals"]["received"]
    assert sum(kinds["pub_delay"].values()) == summary["totals"]["published"]
    assert sum(kinds["connect"].values()) == 21 and sum(kinds["subscribe"].values()) == 1
    assert percentile(kinds["pub_delay"], 50) < 1000  # open-loop sends on time, unloaded
    cpu = summary["publish_cpu"]  # warm-up + window: 5 s, at 1,000 msg/s far from a core
    assert cpu["wall_s"] == pytest.approx(5, abs=0.5) and 0 < cpu["cpu_s"] < 0.5 * cpu["wall_s"]
    # its CPUs were idle some of that time, unless a neighbouring test kept them busy
    assert 0 <= cpu["cpus_idle_pct"] <= 100 and summary["cpus"]
    progress = json.loads((out / PROGRESS_FILE).read_text())
    assert progress["phase"] in ("publish", "drain") and progress["clients"] == 21


def hold_the_next_progress_write(out: Path, process: subprocess.Popen, seconds: float) -> bytes:
    """Make the driver's next write of progress.json wait `seconds`, as a busy disk may:
    its temporary file is made a FIFO, whose open for writing waits for a reader. Returns
    what was written through it."""
    fifo = out / (PROGRESS_FILE + ".tmp")
    deadline = time.monotonic() + 5
    while True:
        try:
            os.mkfifo(fifo)
            break
        except FileExistsError:  # the driver is writing it now: its rename comes next
            assert time.monotonic() < deadline, "progress.json.tmp stayed"
            time.sleep(0.001)
    time.sleep(seconds)
    assert process.poll() is None, "the driver ended while its write was held"
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # never blocks: the test cannot hang
    chunks: list[bytes] = []
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:  # the writer is in, its bytes not yet
                chunk = None
            if chunk:
                chunks.append(chunk)
            elif chunk == b"" and chunks:  # the writer closed after writing
                return b"".join(chunks)
            time.sleep(0.005)  # b"" before any bytes: the writer's open has not returned
    finally:
        os.close(fd)
    raise AssertionError(f"the held write did not finish within 10 s: {chunks}")


@pytest.mark.alone
def test_a_file_write_held_up_by_the_disk_leaves_sends_and_reads_on_time(broker, tmp_path):
    """The raw files are written behind the measuring loop: with progress.json's write held
    for 2 s mid-window, sends stay on time and nothing is lost. Written on the loop, the
    hold stopped it (a busy disk held a small write and rename for 0.63 s here, and CI
    saw a QoS 1 stage's loop stop for ~1.3 s with no other cause found)."""
    out = tmp_path / "out"
    process = start_driver(spec(broker.port, measure=3, drain=1), out)
    try:
        start_at = release(out, process)
        time.sleep(max(0.0, start_at + 1.2 - time.time()))
        written = json.loads(hold_the_next_progress_write(out, process, 2.0))
        assert process.wait(30) == 0, events(out)
    finally:
        process.kill()
    assert "Traceback" not in process.stderr.read()
    assert written["phase"] == "publish"  # the write held, then the later ones in order
    last = json.loads((out / PROGRESS_FILE).read_text())
    assert last["t"] > written["t"] + 1.0
    summary = json.loads((out / SUMMARY_FILE).read_text())
    totals = summary["totals"]
    assert totals["published"] == 20 * 50 * 4 == totals["received"]
    assert sum(r["published"] for r in counters(out)) == totals["published"]
    # on the loop, 2 s of 1,000 msgs/s went late; a stall of the whole process of up to
    # ~0.3 s on a shared host keeps p90 under 25 ms (the tick test's measure)
    kinds = histograms(out)
    assert percentile(kinds["pub_delay"], 90) < 25_000
    assert percentile(kinds["e2e"], 90) < 25_000


def test_a_raw_file_that_cannot_be_written_ends_the_stage_as_an_error_with_a_summary(
        broker, tmp_path):
    """A write that fails on the file thread is told to the loop at its next second: the
    stage stops as an error, says why in events.jsonl and still writes everything else."""
    out = tmp_path / "out"
    (out / COUNTERS_FILE).mkdir(parents=True)  # appending to it fails: a directory
    code, summary = run_to_end(spec(broker.port, measure=2, drain=1), out)
    assert code == 1 and summary["status"] == "error"
    errors = [e for e in events(out) if e["event"] == "driver_error"]
    assert errors and "IsADirectoryError" in errors[0]["error"], events(out)
    assert summary["windows"] and summary["totals"]["published"] > 0
    assert sum(histograms(out)["pub_delay"].values()) == summary["totals"]["published"]


@pytest.mark.alone
def test_a_tick_and_a_read_hold_make_sends_and_reads_late_by_what_they_say_losing_nothing(
        broker, tmp_path):
    """tick_us 20 ms: every message still goes (open loop, the last tick's too), up to 20 ms
    late, and the lateness is in pub_delay and in e2e latency, which is measured from the
    intended time. read_hold_us 2 ms: every read pass that took messages is held that long,
    and the summary says so."""
    out = tmp_path / "out"
    code, summary = run_to_end(spec(broker.port, publishers=100, measure=2, drain=1,
                                    tick_us=20_000, read_hold_us=2000), out)
    assert code == 0
    totals = summary["totals"]
    assert totals["published"] == 100 * 50 * 3  # every message of warm-up + window, exactly
    assert totals["received"] == totals["published"] and totals["lost"] == 0
    kinds = histograms(out)
    delay_p50 = percentile(kinds["pub_delay"], 50)
    assert 5_000 < delay_p50 < 15_000  # spread over the 20 ms between wake-ups
    # 90%: at 5,000 sends/s a stall of the whole process on a shared host makes its length
    # times 5,000 sends late on its own (CI saw p99 67 ms, then p95 49.9 ms). The driver
    # stopped 0.3 s mid-window (SIGSTOP) still gave p90 20.1 and 20.9 ms in two runs (p95
    # 157 and 167 ms; 0.4 s: p90 116 ms), and a tick 30 ms apart still fails it (p90
    # 27.0 ms, no stall).
    assert percentile(kinds["pub_delay"], 90) < 25_000
    assert percentile(kinds["e2e"], 50) > 0.8 * delay_p50  # the wait counts as latency
    # An overrun is a send later than the tick's own lateness and DELAY_OVERRUN_US more: as
    # many as pub_delay holds past 21 ms, up to the one bucket that straddles the limit (a
    # limit of 1 ms would count most sends of a 20 ms tick, far more than that).
    overruns = sum(r["delay_overruns"] for r in counters(out))
    limit = overrun_after_us(20_000)
    above = [(bucket_bounds(b), n) for b, n in kinds["pub_delay"].items()]
    assert (sum(n for (low, _), n in above if low > limit) <= overruns
            <= sum(n for (_, high), n in above if high - 1 > limit))
    late = sum(n for (low, _), n in above if low > DELAY_OVERRUN_US)
    assert late > totals["published"] / 2 > overruns  # most of a 20 ms tick is over 1 ms
    hold = summary["read_hold"]
    assert hold["held_passes"] > 100, hold
    # the floor, or more only where a backlog asked for it (1/128 of a pass's freshest
    # latency, which a stall of ~0.26 s or more makes exceed 2 ms)
    worst_ms = max(bucket_bounds(b)[1] for b in kinds["e2e"]) / 1000
    assert hold["max_ms"] == pytest.approx(2.0) or \
        2.0 < hold["max_ms"] <= worst_ms * MAX_RELATIVE_ERROR, (hold, worst_ms)


@pytest.mark.alone
@pytest.mark.parametrize("sockets, interval_ms", [(5, 50), (1, 15)])
def test_a_held_read_keeps_the_time_the_message_arrived(broker, tmp_path, sockets,
                                                         interval_ms):
    """Subscribers read in passes 20 ms apart, each fed on its own topic by another process.

    Five sockets, a message every 50 ms on each: most arrive while a read of another socket
    holds the pass, and wait in their socket up to 20 ms (the median ~10 ms, timed at the
    read). The receive time is the kernel's stamp of their arrival, so e2e latency is the
    broker's. One socket, a message every 15 ms: the broker (Nagle on) sends each only once
    the last is ACKed, and the ACK goes with the read, so the messages themselves arrive up
    to 20 ms late: the hold's cost to latency, which the stamp shows as it is. Each stamped
    read took at least one TCP segment, and the summary counts both.
    """
    start_at = int(time.time()) + 3
    topics = [f"held/{i}" for i in range(sockets)]
    documents = {
        "sub": spec(broker.port, publishers=0, subscribers=0, measure=2, drain=1,
                    read_hold_us=20_000),
        "pub": spec(broker.port, publishers=0, subscribers=0, measure=2, drain=1)}
    documents["sub"]["subscribers"] = [{"client_id": f"s{i}", "topics": [topic], "qos": 0}
                                       for i, topic in enumerate(topics)]
    documents["pub"]["publishers"] = [
        {"client_id": f"p{i}", "topic": topic, "publisher_index": i + 1, "qos": 0,
         "rate": 1000 / interval_ms} for i, topic in enumerate(topics)]
    processes = {}
    for name, document in documents.items():
        out = tmp_path / name / "out"
        out.mkdir(parents=True)
        processes[name] = (start_driver(document, out), out)
    for process, out in processes.values():
        release(out, process, start_at)
    for process, _ in processes.values():
        assert process.wait(30) == 0, process.stderr.read()
    out = processes["sub"][1]
    summary = json.loads((out / SUMMARY_FILE).read_text())
    received = summary["totals"]["received"]
    assert received >= 0.9 * 3 * sockets * 1000 / interval_ms and summary["totals"]["lost"] == 0
    hold = summary["read_hold"]
    assert hold["max_ms"] == 20.0 and hold["held_passes"] >= 0.4 * received, hold
    assert 0.4 * received <= hold["stamped_reads"] <= hold["segments_in"], hold
    e2e = histograms(out)["e2e"]
    if interval_ms > 20:
        assert percentile(e2e, 50) < 2_000, e2e
    else:
        assert 5_000 < percentile(e2e, 50) < 15_000, e2e


@pytest.mark.parametrize("qos", [1, 2])
def test_qos_1_and_2_lose_nothing_and_qos_2_never_duplicates(broker, tmp_path, qos):
    out = tmp_path / "out"
    process = start_driver(spec(broker.port, qos=qos, publishers=10, rate=100, measure=2,
                                drain=1), out)
    release(out, process)
    assert process.wait(30) == 0, process.stderr.read()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    sent = sum(summary["last_seq"].values())
    assert sent > 0
    assert summary["unique_received"] == sent
    assert summary["totals"]["acked"] == sent
    assert summary["unacked_at_end"] == 0
    assert summary["qos_judgement"]["violations"] == 0
    assert summary["qos_judgement"]["by_qos"][str(qos)]["unique"] == sent
    assert sum(histograms(out)["pub_ack"].values()) == sent
    if qos == 2:
        assert summary["totals"]["duplicated"] == 0
    assert summary["qos2_pubacks"] == 0  # Mosquitto completes QoS 2 with PUBREC, PUBCOMP
    assert summary["subscriptions_granted"] == {str(qos): 1}  # and grants what was asked


def test_broker_killed_mid_stage_gives_a_clean_partial_result(broker, tmp_path):
    out = tmp_path / "out"
    process = start_driver(spec(broker.port, measure=2, drain=1), out)
    release(out, process)
    time.sleep(1.5)
    broker.kill()
    code = process.wait(30)  # bounded: the stage ends on time even without a broker
    assert code == 1
    assert "Traceback" not in process.stderr.read()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["status"] == "partial"
    assert summary["totals"]["errors"] >= 21  # every client's connection was lost
    hold = summary["read_hold"]  # the lost sockets' segments are still counted
    assert hold["segments_in"] >= hold["stamped_reads"] > 0, hold
    events = [json.loads(line) for line in (out / EVENTS_FILE).read_text().splitlines()]
    assert sum(e["event"] == "connection_lost" for e in events) == 21


@pytest.mark.parametrize("field, value, message", [
    ("qos", 3, "publishers[0].qos: must be 0, 1 or 2"),
    ("rate", 0, "publishers[0].rate: must be at least 0.001"),
    ("payload_bytes", 8, "publishers[0].payload_bytes: must be >= 32"),
])
def test_bad_specs_are_rejected_naming_the_field(tmp_path, field, value, message):
    document = spec(1883)
    document["publishers"][0][field] = value
    process = start_driver(document, tmp_path / "out")
    assert process.wait(10) == 2
    assert message in process.stderr.read()


@pytest.mark.alone
def test_keepalive_and_raw_publishes_share_sockets_without_breaking_the_stream(broker, tmp_path):
    """paho's PINGREQ/PINGRESP interleave with batched raw publishes at packet boundaries.

    With a 1 s keepalive Mosquitto drops a client that is silent for 1.5 s, so the
    subscriber (which only receives) lives only if paho's PINGREQs are written and the
    PINGRESPs the fast path reads reach paho; a byte of one interleaved into a packet of
    the other would be a protocol error and a dropped connection.
    """
    out = tmp_path / "out"
    code, summary = run_to_end(spec(broker.port, publishers=10, rate=2000, warmup=0, measure=4,
                                    drain=1, keepalive_s=1), out)
    assert code == 0, events(out)
    assert summary["totals"]["errors"] == 0
    assert summary["unique_received"] == sum(summary["last_seq"].values()) > 40_000
    assert not [e for e in events(out) if e["event"] == "connection_lost"]


def test_shared_subscription_delivers_each_message_once_to_the_group(broker, tmp_path):
    out = tmp_path / "out"
    code, summary = run_to_end(spec(broker.port, qos=1, publishers=4, rate=100, warmup=0,
                                    measure=2, drain=1, subscribers=2,
                                    topics=("$share/g/bench/#",)), out)
    assert code == 0
    sent = sum(summary["last_seq"].values())
    assert summary["unique_received"] == sent > 0  # the group got each message once
    assert summary["totals"]["duplicated"] == 0


def test_aggregate_rate_is_split_over_the_processes_publishers(broker, tmp_path):
    out = tmp_path / "out"
    document = spec(broker.port, publishers=8, warmup=0, measure=2, drain=1,
                    aggregate_rate=400.0)
    code, summary = run_to_end(document, out)
    assert code == 0
    assert sum(summary["last_seq"].values()) == pytest.approx(400 * 2, abs=8)
    assert {p["rate"] for p in summary["config"]["publishers"]} == {50.0}


def test_a_refused_connection_is_counted_and_reported_not_raised(tmp_path):
    out = tmp_path / "out"
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code, summary = run_to_end(spec(port, publishers=2, warmup=0, measure=1, drain=0), out)
    assert code == 1
    assert summary["status"] == "partial"
    assert summary["totals"]["connects_failed"] == 3 and summary["totals"]["connects_ok"] == 0
    assert summary["totals"]["errors"] == 0  # a failed connect is counted once, there
    refused = [e for e in events(out) if e["event"] == "connect_failed"]
    assert len(refused) == 3 and all(e["code"] == errno.ECONNREFUSED for e in refused)


@pytest.mark.parametrize("path, value, message", [
    (("max_inflight",), 70_000, "max_inflight: must be 1..65535"),
    (("subscribers", 0, "topics", 0), "a/#/b", "subscribers[0].topics[0]: must be a topic filter"),
    (("subscribers", 0, "topics", 0), "$share//x", "subscribers[0].topics[0]: must be a topic"),
    (("broker", "port"), 0, "broker.port: must be 1..65535"),
    (("broker", "cert_file"), "c.pem", "broker.tls: must be true"),
    (("aggregate_rate",), -1, "aggregate_rate: must be > 0"),
    (("publishers", 1, "publisher_index"), "2", "publishers[1].publisher_index: must be int"),
    # a misspelt key would have left its field at the default, unsaid
    (("measure_seconds",), 60, "measure_seconds: not a field of this spec (did you mean 'measure_s'?)"),
    (("sample_rate",), 60, "sample_rate: not a field of this spec (known: run_id, stage_id"),
    (("publishers", 1, "payload_size"), 4096,
     "publishers[1].payload_size: not a field of this spec (did you mean 'payload_bytes'?)"),
    (("broker", "tls_ca"), "ca.pem", "broker.tls_ca: not a field of this spec (did you mean"),
    (("publishers", 1), 1, "publishers[1]: must be a JSON object, got 1"),
    # two publishers on one stream: one's messages would be the other's duplicates and gaps
    (("publishers", 2, "publisher_index"), 1,
     "publishers[2].publisher_index: stream 1 is publishers[0]'s too"),
    (("publishers", 0, "topic_cycle"), ["bench/t", "bench/b"],
     "publishers[1].publisher_index: stream 2 is publishers[0]'s too"),
])
def test_bad_nested_fields_are_rejected_naming_the_field(tmp_path, path, value, message):
    document = spec(1883)
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    process = start_driver(document, tmp_path / "out")
    assert process.wait(10) == 2
    assert message in process.stderr.read()


TEMPLATE = Template("t", 0, 64, tag=9, publisher=1)  # the driver's own PUBLISH encoding


class FastPathConn:
    """The fast path's view of a subscriber connection, nothing else."""

    tracks = out = inflight = q2 = None
    qos, parked = 0, False


def fast_path_reader(tmp_path: Path) -> receive.Reader:
    return receive.Reader(sessions=None, acct=Accounting(RawWriter(tmp_path), tag=9))


def publishes(intended_us: list[int]) -> bytearray:
    """One publisher's QoS 0 PUBLISH packets, sequence 1, 2, ..., intended at these times."""
    packets = bytearray()
    for seq, intended in enumerate(intended_us, 1):
        packet = bytearray(TEMPLATE.packet)
        TEMPLATE.patch(packet, TEMPLATE.patch_at, seq, intended, 0)
        packets += packet
    return packets


def test_fast_path_latency_buckets_and_percentiles_match_numpy(tmp_path, monkeypatch):
    """The parser inlines the histogram bucketing: it must agree with tasks.driver.histogram."""
    np = pytest.importorskip("numpy")
    now_ns = 1_800_000_000 * 10**9
    monkeypatch.setattr(receive.time, "time_ns", lambda: now_ns)  # pin the receive clock
    rng = np.random.default_rng(3)
    values = (rng.lognormal(7.0, 1.5, 20_000).astype(int) + 1).tolist() + [0, 1, 127, 128, 10**9]
    packets = publishes([now_ns // 1000 - value for value in values])
    reader = fast_path_reader(tmp_path)
    assert reader.parse(FastPathConn(), packets, len(packets)) == len(packets)
    counts = {b: c for b, c in enumerate(reader.acct.hists[(now_ns // 10**9, "e2e")]) if c}
    expected: dict[int, int] = {}
    for value in values:
        expected[bucket_of(value)] = expected.get(bucket_of(value), 0) + 1
    assert counts == expected
    for pct in (50, 90, 99, 99.9):
        exact = np.percentile(values, pct, method="inverted_cdf")
        assert abs(percentile(counts, pct) - exact) <= exact * MAX_RELATIVE_ERROR + 0.5


class TakesAll:
    """A socket stand-in that keeps every byte sent, so the packets can be read back, and
    refuses writes (a full socket) while `refusing`."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.refusing = False

    def send(self, data: bytearray) -> int:
        if self.refusing:
            raise BlockingIOError(errno.EAGAIN, "full")
        self.sent += data
        return len(data)


def test_the_scheduler_sends_every_message_once_at_the_first_run_at_or_after_its_time(
        tmp_path):
    """Open loop over simulated time, as the driver's loop calls `Scheduler.run`: 2 ms ticks,
    runs falling exactly on messages' intended nanoseconds, a 45 ms stall (two or three
    messages due at once: the backlog path), a socket that refuses writes for 30 ms, a
    publisher parked 40 ms for paho, one cycling over topics. Every message goes once, in
    order, stamped with its intended time, first + (k-1) * interval, and the time of the
    run that encoded it: the first at or after that time (after the park, for the parked
    one). pub_delay holds one count per message, in the bucket of that lag."""
    ms = 1_000_000
    start, end = 1_800_000_000 * 10**9, 1_800_000_001 * 10**9
    sessions = SimpleNamespace(on_window=None, epoll=select.epoll())
    sessions.flush = partial(Sessions.flush, sessions)
    sessions.arm = partial(Sessions.arm, sessions)
    conns = []
    for index in range(6):
        cycle = ["t/a", "t/b"] if index == 5 else []
        publisher = SimpleNamespace(rate=50 + 7 * index, publisher_index=10 * index,
                                    topic_cycle=cycle, qos=0, topic=f"t/{index}",
                                    payload_bytes=64)
        conn = Conn(publisher, "pub", index, None, False)
        conn.state, conn.raw, conn.sock = READY, True, TakesAll()
        conn.fd, write_end = os.pipe()  # for `arm`: epoll watches it for writability
        os.close(write_end)
        sessions.epoll.register(conn.fd, select.EPOLLIN)
        conns.append(conn)
    acct = Accounting(RawWriter(tmp_path), tag=7)
    scheduler = send.Scheduler(sessions, acct, conns, start, end, max_inflight=10)
    fills = []
    scheduler.fill = lambda conn, now: fills.append(conn) or send.Scheduler.fill(
        scheduler, conn, now)
    stall = range(start + 300 * ms, start + 345 * ms)
    exact = [c.first + int(k * c.interval) for c in conns[:5] for k in range(int(c.total))]
    runs = sorted({t for t in [*range(start, end + 1, 2 * ms), *exact[::3]] if t not in stall})
    full, parked = conns[2], conns[3]  # a full socket for 30 ms; paho's turn for 40 ms
    park = range(start + 400 * ms, start + 440 * ms)
    for now in runs:
        full.sock.refusing = start + 200 * ms <= now < start + 230 * ms
        if full.want_out and not full.sock.refusing:
            sessions.flush(full)  # what the loop does when epoll says it is writable
        parked.paho_pending = now in park
        if parked.parked and now >= park.stop:
            scheduler.wake(parked)  # what flush does once paho has written
        scheduler.run(now)
    assert full.want_out is False and not full.out and parked.parked is False
    for conn in conns:
        os.close(conn.fd)
    lags: dict[int, int] = {}
    for conn in conns:
        tmpl = conn.tmpl[0] if conn.spec.topic_cycle else conn.tmpl
        size, at = len(tmpl.packet), tmpl.patch_at - 8  # the header: tag, publisher first
        sent = [HEADER.unpack_from(conn.sock.sent, i + at)
                for i in range(0, len(conn.sock.sent), size)]
        assert len(sent) == conn.total == conn.seq > 40
        cycle = len(conn.spec.topic_cycle) or 1
        for k, (tag, publisher, seq, intended_us, sent_us) in enumerate(sent, 1):
            intended = conn.first + int((k - 1) * conn.interval)
            assert (tag, publisher, seq) == (7, conn.spec.publisher_index + (k - 1) % cycle,
                                             (k - 1) // cycle + 1)
            assert intended_us == intended // 1000
            sent_at = next(t for t in runs if t >= intended
                           and not (conn is parked and t in park))
            assert sent_us == sent_at // 1000, (conn.index, k)
            lag = bucket_of((sent_at - intended) // 1000)
            lags[lag] = lags.get(lag, 0) + 1
    recorded: dict[int, int] = {}
    for (_, kind), hist in acct.hists.items():
        for bucket, count in enumerate(hist):
            if kind == "pub_delay" and count:
                recorded[bucket] = recorded.get(bucket, 0) + count
    assert recorded == lags and max(lags) > bucket_of(40_000)  # the stall's backlog is in it
    assert sum(row[C_PUBLISHED] for row in acct.rows.values()) == sum(c.total for c in conns)
    # one-topic QoS 0 messages due one at a time do not go through fill (the short path);
    # a backlog, a park and a topic cycle do
    solo = [c for c in fills if c.solo]
    assert 0 < len(solo) < sum(c.total for c in conns[:5]) / 10 and parked in solo
    assert fills.count(conns[5]) > conns[5].total / 2


def test_a_reader_holds_only_when_even_its_freshest_message_was_late(tmp_path):
    """The hold after a pass is the freshest message's latency times the bucket error, capped."""
    reader = fast_path_reader(tmp_path)
    cases = (((900_000, 400_000), 0.4 * MAX_RELATIVE_ERROR), ((900_000, 20_000), 0.0),
             ((), 0.0), ((7200 * 10**6, 3600 * 10**6), receive.HOLD_MAX_S))
    for late_us, hold_s in cases:
        for subscriber_reads in (late_us[:1], late_us[1:]):  # two sockets in one pass
            if subscriber_reads:
                now_us = time.time_ns() // 1000
                buf = publishes([now_us - late for late in subscriber_reads])
                reader.tick()
                assert reader.parse(FastPathConn(), buf, len(buf)) == len(buf)
        reader.end_pass()
        # 400 ms late at best: about 400 ms / 128; a fresh message anywhere in the pass, or
        # nothing read: prompt reads; messages queued for an hour: capped, not 28 s
        assert reader.hold_s == pytest.approx(hold_s, rel=0.05)
    assert reader.held_passes == 2


def test_a_read_hold_pauses_after_every_pass_that_read_messages(tmp_path):
    """read_hold_us: a floor under the hold, after passes that read messages, never idle
    ones; the backlog rule still wins when it asks for more."""
    reader = fast_path_reader(tmp_path)
    reader.min_hold_s = 0.0005
    for late_us, hold_s in (((20_000,), 0.0005), ((), 0.0),
                            ((900_000,), 0.9 * MAX_RELATIVE_ERROR)):
        if late_us:
            buf = publishes([time.time_ns() // 1000 - late for late in late_us])
            reader.tick()
            reader.parse(FastPathConn(), buf, len(buf))
        reader.end_pass()
        assert reader.hold_s == pytest.approx(hold_s, rel=0.05)
    assert reader.held_passes == 2 and reader.hold_max_s == pytest.approx(0.9 / 128, rel=0.05)


@pytest.mark.alone
def test_a_backlog_is_read_in_held_passes_within_the_bucket_error_then_promptly(
        broker, tmp_path):
    """The broker stopped for 1.5 s, then draining its backlog: late messages, held reads.

    Every hold stays within 1/128 of the latency being measured, nothing is lost (QoS 1),
    and once the backlog is gone reads are prompt again (low latency in the last second).
    """
    out = tmp_path / "out"
    process = start_driver(spec(broker.port, qos=1, measure=5, drain=2), out)
    start_at = release(out, process)
    time.sleep(max(0.0, start_at + 2 - time.time()))
    os.kill(broker.process.pid, signal.SIGSTOP)
    time.sleep(1.5)
    os.kill(broker.process.pid, signal.SIGCONT)
    assert process.wait(30) == 0, process.stderr.read()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["qos_judgement"]["violations"] == 0
    assert summary["unique_received"] == summary["totals"]["published"] > 0
    hold = summary["read_hold"]
    assert hold["held_passes"] >= 1
    late = histograms(out)["e2e"]
    worst_us = bucket_bounds(max(late))[1]
    assert 1000 * hold["max_ms"] <= worst_us * MAX_RELATIVE_ERROR + 1
    assert worst_us > 1_000_000  # the stop was seen: messages 1.5 s late
    last = {}
    with open(out / HISTOGRAMS_FILE) as handle:
        for row in csv.DictReader(handle):
            if row["kind"] == "e2e" and int(row["second"]) == start_at + 5:
                last[int(row["bucket"])] = int(row["count"])
    assert last and percentile(last, 50) < 20_000  # caught up: prompt again


def own_mosquitto(tmp_path: Path, name: str, config: str):
    """A Mosquitto with a config of this test's own (the shared fixture's is plain). Its
    queue limit is the shared fixture's and perfpipe's own (`tasks.brokers.mosquitto`):
    Mosquitto's default of 1000 queued QoS 1 messages drops what a subscriber briefly
    behind would still receive, which a test that counts every message must not see."""
    binary = "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() \
        else shutil.which("mosquitto")
    assert binary, "mosquitto is not installed: run `make test`, which installs it"
    port = free_port()
    conf = tmp_path / f"{name}.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nmax_queued_messages 1000000\n{config}")
    log = open(tmp_path / f"{name}.log", "w")
    process = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    if not wait_listening(port, 10):
        process.kill()
        raise AssertionError((tmp_path / f"{name}.log").read_text())

    def stop() -> None:
        process.kill()
        process.wait(5)
        log.close()

    return port, stop


@pytest.fixture
def tls_broker(tmp_path):
    """Mosquitto with a TLS listener that requires a client certificate (certs made here)."""
    certs = tmp_path / "certs"
    certs.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt")
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (certs / f"{name}.ext").write_text(extra + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-out", f"{name}.crt",
                "-extfile", f"{name}.ext")
    port, stop = own_mosquitto(tmp_path, "tls", (
        f"allow_anonymous true\nuser root\ncafile {certs}/ca.crt\n"
        f"certfile {certs}/server.crt\nkeyfile {certs}/server.key\nrequire_certificate true\n"))
    yield port, certs
    stop()


def test_a_connack_refusal_is_counted_with_its_code(tmp_path):
    port, stop = own_mosquitto(tmp_path, "auth", "allow_anonymous false\n")
    try:
        out = tmp_path / "out"
        document = spec(port, publishers=2, warmup=0, measure=1, drain=0)
        document["broker"].update(username="u", password="secret-pw")
        code, summary = run_to_end(document, out)
    finally:
        stop()
    assert code == 1 and summary["status"] == "partial"
    assert summary["totals"]["connects_failed"] == 3 and summary["totals"]["errors"] == 0
    refused = [e for e in events(out) if e["event"] == "connect_refused"]
    assert len(refused) == 3 and {e["code"] for e in refused} == {135}  # not authorized
    assert "secret-pw" not in (out / SUMMARY_FILE).read_text()


def test_tls_with_a_client_certificate_and_a_cipher_choice_loses_nothing_after_a_stall(
        tls_broker, tmp_path):
    """The driver stopped for 0.3 s mid-window (as a shared host may) catches up over TLS.

    A TLS read returns one record; a reader that stopped there each pass fell behind for
    good after a stall (CI saw 483 of 1620 acked messages received): 2000 msgs/s came in,
    ~170 a second were read."""
    port, certs = tls_broker
    document = spec(port, qos=1, publishers=4, rate=500, warmup=0, measure=2, drain=1)
    document["broker"].update(tls=True, ca_file=str(certs / "ca.crt"),
                              cert_file=str(certs / "client.crt"),
                              key_file=str(certs / "client.key"),
                              tls_version="TLSv1.2", ciphers="ECDHE+AESGCM")
    out = tmp_path / "out"
    process = start_driver(document, out)
    start_at = release(out, process)
    time.sleep(max(0.0, start_at + 0.5 - time.time()))
    os.kill(process.pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert process.wait(30) == 0, events(out)
    assert "Traceback" not in process.stderr.read()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    sent = sum(summary["last_seq"].values())
    assert summary["unique_received"] == summary["totals"]["acked"] == sent > 3000
    assert "password" not in json.dumps(summary["config"])


def test_a_persistent_session_gets_what_was_published_while_it_was_away(broker, tmp_path):
    """clean_session false: QoS 1 messages queued by the broker arrive on reconnect.

    They arrive right after CONNACK, while paho still reads the socket (before the fast
    path takes it over), so this also covers deliveries on paho's side.
    """
    def stage(name: str, **document) -> dict:
        base = spec(broker.port, publishers=0, subscribers=0, warmup=0, measure=1, drain=1)
        return run_to_end({**base, **document, "stage_id": "persist"}, tmp_path / name)[1]

    away = {"client_id": "s-away", "topics": ["persist/#"], "qos": 1, "clean_session": False}
    stage("subscribe", subscribers=[away])
    published = stage("publish", publishers=[{"client_id": "p-away", "topic": "persist/t",
                                              "publisher_index": 1, "qos": 1, "rate": 100}])
    sent = published["last_seq"]["1"]
    assert sent > 0 and published["totals"]["acked"] == sent
    back = stage("return", subscribers=[away])
    assert back["unique_received"] == sent
    assert back["qos_judgement"]["violations"] == 0


@pytest.mark.parametrize("cycle", [False, True])
def test_a_full_inflight_window_holds_messages_back_counts_it_and_loses_nothing(
        broker, tmp_path, cycle):
    """max_inflight 1 at a rate one publisher cannot get acked in time: sends wait for
    acks (late, so pub_delay grows), each held message is counted once, none is lost."""
    document = spec(broker.port, qos=1, publishers=2, rate=4000, measure=2, max_inflight=1)
    if cycle:  # a publisher cycling over topics takes the other send path
        for i, p in enumerate(document["publishers"]):  # 3 streams each: indexes apart
            p.update(topic_cycle=[f"bench/c{n}" for n in range(3)], topic="bench/c0",
                     publisher_index=3 * i + 1)
    code, summary = run_to_end(document, tmp_path / "out")
    assert code == 0
    sent = sum(summary["last_seq"].values())
    assert 0 < summary["totals"]["inflight_full"] <= 2 * 3 * 4000
    assert summary["unique_received"] == sent == summary["totals"]["acked"]
    assert summary["qos_judgement"]["violations"] == 0


def test_a_refused_connack_or_suback_ends_that_client_at_once(tmp_path):
    """Fault: the broker refuses some CONNECTs (no credentials) and a SUBSCRIBE (its ACL).
    A refused CONNECT leaves the pending-connect count it took (it was taken twice, so each
    refusal let one more CONNECT than `max_pending_connects` out); a refused subscription
    is one error and its client is let go, not waited on for `connect_timeout_s` and
    counted a second time as not ready."""
    from tasks.driver.engine import Engine
    from tasks.driver.spec import parse_spec

    port, stop = own_mosquitto(tmp_path, "auth", "allow_anonymous false\n")
    try:
        document = spec(port, publishers=6, subscribers=0, max_pending_connects=2)
        engine = Engine(parse_spec(document), tmp_path / "refused")
        engine.connect_all()
        assert engine.sessions.connecting == 0 and engine.sessions.unready == 0
        engine.sessions.close_all()
    finally:
        stop()

    # Mosquitto 2.0.11 grants every subscription its ACLs would not deliver (acl_file
    # `deny`, dynamic security without a role): the refusal is made at paho's callback, the
    # SUBACK's return code 0x80 as paho hands it over
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    refused = ReasonCode(PacketTypes.SUBACK, identifier=0x80)
    running = Broker(tmp_path)
    try:
        engine = Engine(parse_spec(spec(running.port, publishers=1, connect_timeout_s=20)),
                        tmp_path / "suback")
        granted = engine.sessions._callbacks["on_subscribe"]
        engine.sessions._callbacks["on_subscribe"] = \
            lambda client, conn, mid, reasons, props: granted(client, conn, mid, [refused], props)
        started = time.monotonic()
        engine.connect_all()
        took = time.monotonic() - started
        engine.sessions.close_all()
    finally:
        running.kill()
    assert took < 5  # not connect_timeout_s
    assert [c.state for c in engine.sessions.conns if c.role == "sub"] == [DEAD]
    totals = engine.acct.totals()
    assert totals["errors"] == 1 and totals["connects_ok"] == 2, totals


def test_somebody_elses_messages_on_the_stage_topics_are_not_the_stage_errors(broker, tmp_path):
    """Somebody's messages on the subscribed topics, short or long, retained before the
    stage (read through paho) or sent inside it (read by the fast path), are not the
    stage's: not received, not errors (one short message used to make the stage invalid)."""
    def publish(*args: str) -> None:
        subprocess.run(["mosquitto_pub", "-p", str(broker.port), *args], check=True, timeout=10)

    publish("-r", "-t", "bench/retained-short", "-m", "on")
    publish("-r", "-t", "bench/retained-long", "-m", "x" * 64)
    late = threading.Timer(2.0, lambda: [publish("-t", "bench/t", "-m", m) for m in ("on", "y" * 64)])
    late.start()
    try:
        code, summary = run_to_end(spec(broker.port, publishers=2, rate=20.0, warmup=1, measure=2,
                                        drain=1), tmp_path / "out")
    finally:
        late.join()
        publish("-r", "-t", "bench/retained-short", "-n")
        publish("-r", "-t", "bench/retained-long", "-n")
    assert code == 0 and summary["status"] == "ok", summary["totals"]
    assert summary["totals"]["errors"] == 0
    assert summary["totals"]["received"] == sum(summary["last_seq"].values())


@pytest.mark.parametrize("broker, message", [
    ({"ca_file": "/nonexistent/ca.pem"}, "broker.ca_file: cannot use '/nonexistent/ca.pem'"),
    ({"ciphers": "NOPE-CIPHER", "tls_version": "TLSv1.2"}, "broker.ciphers: cannot use 'NOPE-CIPHER'"),
    ({"cert_file": "/nonexistent/c.pem"}, "broker.cert_file/key_file: cannot use"),
])
def test_tls_files_or_ciphers_the_host_cannot_use_are_rejected_naming_the_field(
        tmp_path, broker, message):
    """Read when the driver starts, before any client: said as a rejected spec (exit 2,
    the field named), not a traceback with no files written."""
    document = spec(1883)
    document["broker"].update(tls=True, **broker)
    process = start_driver(document, tmp_path / "out")
    assert process.wait(10) == 2
    stderr = process.stderr.read()
    assert message in stderr and "Traceback" not in stderr


def test_a_stage_held_to_tls_1_2_and_a_cipher_gets_them_and_records_what_it_got(
        tls_broker, tmp_path):
    """A report's protocol (MessageSight's CONNBURST.SEC: TLSv1.2, AES256-GCM-SHA384): the
    cipher list alone left TLS 1.3 on offer, which OpenSSL 3 takes, so the list changed
    nothing measured. The version is pinned, and the summary says what was agreed."""
    port, certs = tls_broker
    got = {}
    for name, pinned in (("pinned", {"tls_version": "TLSv1.2", "ciphers": "AES256-GCM-SHA384"}),
                         ("newest", {})):
        document = spec(port, publishers=1, warmup=0, measure=1, drain=0)
        document["broker"].update(tls=True, ca_file=str(certs / "ca.crt"),
                                  cert_file=str(certs / "client.crt"),
                                  key_file=str(certs / "client.key"), **pinned)
        code, summary = run_to_end(document, tmp_path / name)
        assert code == 0
        got[name] = summary["tls"]
    assert got["pinned"] == {"version": "TLSv1.2", "cipher": "AES256-GCM-SHA384"}
    assert got["newest"]["version"] == "TLSv1.3"

    document = spec(port)
    document["broker"].update(tls=True, ciphers="AES256-GCM-SHA384")
    process = start_driver(document, tmp_path / "refused")
    assert process.wait(10) == 2
    assert "broker.tls_version: ciphers apply to TLS 1.2 only" in process.stderr.read()


def test_messages_the_broker_never_acknowledged_are_missing_but_not_lost_promises(
        broker, tmp_path):
    """Fault: the broker stops (SIGSTOP) for the last second of a QoS 1 stage and its
    drain. The messages sent meanwhile were never acknowledged: missing, but QoS 1 promised
    them nothing, so they are not "lost at QoS 1, which promises delivery" (the validity
    gate's words, which void a stage and fail a search's probe as if the broker dropped
    messages it had taken). Each stream's unacknowledged messages are in the summary."""
    from tasks.analysis.validity import broken_promises, message_loss

    out = tmp_path / "out"
    # 50 in flight a publisher at most: each fills its window while the broker is stopped
    process = start_driver(spec(broker.port, qos=1, publishers=4, rate=100.0, warmup=0,
                                measure=3, drain=1, max_inflight=50), out)
    start_at = release(out, process)
    time.sleep(max(0.0, start_at + 1.5 - time.time()))
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        assert process.wait(30) in (0, 1)
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    by_stream = summary["unacked_by_stream"]
    assert sum(by_stream.values()) == summary["unacked_at_end"] == 4 * 50
    assert set(by_stream) <= set(summary["last_seq"])
    loss = message_loss([summary], {index: 1 for index in summary["last_seq"]})
    assert 4 * 50 * 0.75 <= loss.lost <= 4 * 50 + 4 and summary["missing_at_end"] == 0
    assert loss.unacked == min(4 * 50, loss.lost)  # all missing may be unacknowledged
    assert broken_promises(1, loss.lost, 0, loss.unacked) == []
    assert broken_promises(1, loss.lost, 0) == [  # what the gate said before
        f"{loss.lost} messages lost at QoS 1, which promises delivery"]


def test_deliveries_received_before_they_were_sent_by_the_clocks_are_counted(broker, tmp_path):
    """Fault: the publishing host's clock ahead of the subscribing host's (1 s here, so
    no load makes a delivery slower; a few ms, within what the clock check lets through,
    does the same to a fast broker). Each delivery's latency reads negative: it was
    counted as 0 us without a word, and the stage's e2e latency read 0.
    The subscriber counts them (`e2e_before_sent`), and the aggregation says so."""
    from spark.stage_files import StageFiles, _check_before_sent

    ahead = ("import sys, time; t = time.time_ns; time.time_ns = lambda: t() + 1_000_000_000; "
             "time.time = lambda: time.time_ns() / 1e9; "
             "from tasks.driver.__main__ import main; sys.exit(main(sys.argv[1:]))")
    publishing, subscribing = tmp_path / "pub" / "out", tmp_path / "sub" / "out"
    for out in (publishing, subscribing):
        out.parent.mkdir()
    document = spec(broker.port, publishers=4, subscribers=0, rate=50.0, warmup=0, measure=2,
                    drain=1)
    (publishing.parent / "spec.json").write_text(json.dumps(document))
    publisher = subprocess.Popen([sys.executable, "-c", ahead, "--spec",
                                 str(publishing.parent / "spec.json"), "--out", str(publishing)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    subscriber = start_driver({**spec(broker.port, publishers=0, warmup=0, measure=2, drain=1),
                               "proc": 1}, subscribing)
    start_at = release(subscribing, subscriber, int(time.time()) + 3)  # ahead of both clocks
    release(publishing, publisher, start_at)
    assert subscriber.wait(30) == 0 and publisher.wait(30) == 0, publisher.communicate()
    summaries = [json.loads((out / SUMMARY_FILE).read_text()) for out in (publishing, subscribing)]
    received = summaries[1]["totals"]["received"]
    assert received >= 4 * 50 * 2 * 0.9
    assert summaries[1]["e2e_before_sent"] == received
    assert histograms(subscribing)["e2e"].get(0, 0) >= summaries[1]["e2e_before_sent"]
    assert summaries[0]["e2e_before_sent"] == 0  # (it received nothing)
    stage = StageFiles("s", summaries=summaries)
    _check_before_sent(stage)
    (said,) = stage.problem_list()
    assert said.startswith(f"{summaries[1]['e2e_before_sent']:,} of {received:,} deliveries were "
                           "received before they were sent by the hosts' clocks")

"""The broker sampler's readings on real processes and a real HTTP endpoint: finding a
broker's processes without being told its pid, its CPU to the nanosecond, the host's
counters and pace, and a Prometheus endpoint's counters turned into rates."""

from __future__ import annotations

import contextlib
import csv
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tasks.driver import pace, procfs, sampler
from tasks.driver.broker_stats import PrometheusReader, evaluate, parse_prometheus
from tasks.driver.output import HOST_COLUMNS, HOST_FILE, SAMPLER_COLUMNS, SAMPLER_FILE

SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
# the stand-in broker lives until its fixture's teardown kills it (10 minutes at most, and
# no longer than the worker that started it): an `alone` test's call may wait for the
# other worker's test once its setup is done
FIXTURE_S = 600


def _child_runs(parent: int, program: bytes) -> bool:
    """Whether a child of `parent` runs `program`: until it has exec'd, a child still has
    its parent's command line."""
    for st in procfs.all_stats().values():
        if st.ppid == parent:
            with contextlib.suppress(OSError):
                if program in Path(f"/proc/{st.pid}/cmdline").read_bytes():
                    return True
    return False


@pytest.fixture
def spinning(tmp_path: Path):
    """A process busy on one CPU with a child of its own, its pid in a file: a stand-in
    for a broker somebody else started (a JVM and a helper)."""
    # a name of its own: another worker's test may run its own fake broker meanwhile
    script = tmp_path / f"fake-broker-{secrets.token_hex(4)}.py"
    script.write_text(f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                      f"'import time; time.sleep({FIXTURE_S})'])\n"
                      "import os, time\nparent = os.getppid()\n"
                      f"end = time.time() + {FIXTURE_S}\n"
                      "while time.time() < end and os.getppid() == parent: pass\n")
    process = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    (tmp_path / "broker.pid").write_text(f"{process.pid}\n")
    deadline = time.monotonic() + 20
    while not _child_runs(process.pid, f"time.sleep({FIXTURE_S})".encode()):  # forked, exec'd
        assert time.monotonic() < deadline and process.poll() is None, "no child started"
        time.sleep(0.02)
    yield process, tmp_path
    os.killpg(process.pid, 9)
    process.wait(5)


def reading(finder: procfs.ProcessFinder) -> procfs.ProcessReading:
    stats = procfs.all_stats()
    return procfs.read_processes(finder.find(stats), stats)


def test_a_broker_is_found_by_pid_file_session_or_command_line(spinning):
    process, folder = spinning
    (script,) = folder.glob("fake-broker-*.py")
    ways = [("pid", str(process.pid)), ("pid_file", str(folder / "broker.pid")),
            ("session", str(process.pid)), ("match", re.escape(script.name))]
    found = {way: procfs.ProcessFinder(way, value).find(procfs.all_stats()) for way, value in ways}
    assert len(found["pid"]) == 2 and process.pid in found["pid"]  # the process and its child
    assert found["pid_file"] == found["pid"] == found["session"]
    assert found["match"] == {process.pid}  # only the command line that matches
    with pytest.raises(ValueError, match="use one of pid, session, pid_file, unit, match"):
        procfs.ProcessFinder("name", "mosquitto")


@pytest.mark.alone
def test_cpu_is_read_in_nanoseconds_and_summed_over_the_processes(spinning):
    process, _ = spinning
    finder = procfs.ProcessFinder("pid", str(process.pid))
    before, started = reading(finder), time.time()
    time.sleep(1.0)
    after = reading(finder)
    elapsed = time.time() - started
    row = procfs.process_row(before, after, elapsed)
    assert row["processes"] == 2 and row["threads"] >= 2 and row["rss_bytes"] > 1_000_000
    assert 60 < row["cpu_pct"] < 105  # one busy process, the other asleep (a stall of the
    # busy one on a shared host takes its share of the second)
    assert row["cpu_pct"] == pytest.approx(row["cpu_user_pct"] + row["cpu_sys_pct"], abs=4)
    # schedstat's nanoseconds, not whole ticks (a busy second can be 100.00 either way)
    spent_ns = sum(after.cpu_ns[p] - before.cpu_ns[p] for p in before.cpu_ns)
    assert row["cpu_pct"] == round(100 * spent_ns / 1e9 / elapsed, 2)
    assert row["open_files"] >= 3


@pytest.mark.alone
def test_the_sampler_writes_the_processes_and_the_host(spinning, tmp_path):
    process, folder = spinning
    out = tmp_path / "sampler"
    assert sampler.main(["--pid-file", str(folder / "broker.pid"), "--host-counters",
                         "--until", str(time.time() + 2.5), "--out", str(out)]) == 0
    with open(out / SAMPLER_FILE) as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == SAMPLER_COLUMNS and len(rows) >= 2
    assert all(float(r["cpu_pct"]) > 50 and r["processes"] == "2" for r in rows)
    with open(out / HOST_FILE) as handle:
        host = list(csv.DictReader(handle))
    assert tuple(host[0]) == HOST_COLUMNS and [r["second"] for r in host] == [r["second"] for r in rows]
    assert all(float(r["cpu_pct"]) >= float(b["cpu_pct"]) * 0.8 for r, b in zip(host, rows))
    assert all(int(r["cpus"]) == os.cpu_count() and int(r["mem_used_bytes"]) > 0 for r in host)
    # the host's pace each second: CPU time of the fixed work, a few hundred us on a core
    assert all(10_000 < int(r["pace_ns"]) < 50_000_000 for r in host)
    # steal: % of one core, at most every CPU's whole second
    assert all(0 <= float(r["steal_pct"]) <= 100 * os.cpu_count() * 1.1 for r in host)


def test_a_sampler_stopped_early_writes_what_it_sampled(spinning, tmp_path):
    process, folder = spinning
    out = tmp_path / "sampler"
    run = subprocess.Popen([sys.executable, "-m", "tasks.driver.sampler", "--pid", str(process.pid),
                            "--host-counters", "--no-sys", "--until", str(time.time() + 60),
                            "--out", str(out)], cwd=Path(sampler.__file__).parents[2],
                           stderr=subprocess.PIPE, text=True)
    time.sleep(4)  # started, and a few seconds sampled
    run.terminate()
    _, err = run.communicate(timeout=10)
    assert run.returncode == 0, err
    for name in (SAMPLER_FILE, HOST_FILE):
        with open(out / name) as handle:
            assert len(list(csv.DictReader(handle))) >= 1, name


def test_the_host_is_read_from_proc_busy_with_steal_and_steal_apart(tmp_path, monkeypatch):
    (tmp_path / "net").mkdir()
    # cpu: user nice system idle iowait irq softirq steal guest guest_nice, each its own value
    (tmp_path / "stat").write_text("cpu  1 2 4 1000 2000 8 16 32 64 128\ncpu0 1 2 4 8\n")
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemFree: 1 kB\nMemAvailable: 40 kB\n")
    (tmp_path / "net" / "dev").write_text(
        "Inter-|\n face |\n    lo: 5 0 0 0 0 0 0 0 6 0 0 0 0 0 0 0\n"
        "  eth0: 7 0 0 0 0 0 0 0 9 0 0 0 0 0 0 0\n")
    monkeypatch.setattr(procfs, "PROC", tmp_path)
    reading = procfs.read_host()
    assert reading == procfs.HostReading(busy_ticks=1 + 2 + 4 + 8 + 16 + 32, steal_ticks=32,
                                         mem_used_bytes=60 * 1024, net_rx_bytes=7,
                                         net_tx_bytes=9)


def test_the_idle_share_of_a_drivers_cpus_is_read_per_cpu(tmp_path, monkeypatch):
    # cpuN: user nice system idle iowait irq softirq steal (guest columns left out)
    (tmp_path / "stat").write_text("cpu  9 0 0 9 0 0 0 0\ncpu0 10 0 0 30 10 0 0 0\n"
                                   "cpu1 50 0 0 0 0 0 0 50\nintr 1\n")
    monkeypatch.setattr(procfs, "PROC", tmp_path)
    assert procfs.cpus_ticks({0}) == (40, 50)  # idle and iowait are idle
    assert procfs.cpus_ticks({1}) == (0, 100)  # steal is busy
    assert procfs.cpus_ticks({0, 1}) == procfs.cpus_ticks(None) == (40, 150)
    assert procfs.cpus_ticks({7}) == (40, 150)  # none listed: every CPU
    assert procfs.idle_pct((40, 50), (70, 100)) == 60.0
    assert procfs.idle_pct((40, 50), (40, 50)) is None


def test_a_cpu_kept_busy_is_read_as_never_idle():
    cpu = max(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", SPIN],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        time.sleep(0.3)  # the interpreter started and spins
        before = procfs.cpus_ticks({cpu})
        time.sleep(0.5)
        assert procfs.idle_pct(before, procfs.cpus_ticks({cpu})) < 10
    finally:
        busy.kill()
        busy.wait(5)


def test_the_host_row_gives_busy_and_steal_in_percent_of_one_core():
    ticks = procfs.TICKS
    before = procfs.HostReading(busy_ticks=0, steal_ticks=0, mem_used_bytes=1,
                                net_rx_bytes=0, net_tx_bytes=0)
    after = procfs.HostReading(busy_ticks=3 * ticks, steal_ticks=ticks, mem_used_bytes=1,
                               net_rx_bytes=0, net_tx_bytes=0)
    row = procfs.host_row(before, after, 2.0)
    assert row["cpu_pct"] == 150.0 and row["steal_pct"] == 50.0


@pytest.mark.alone  # it compares CPU times a neighbouring test's load moves (1.55x once)
def test_the_pace_is_the_cpu_time_of_the_work_not_the_time_waited():
    small, large = pace.pace_ns(steps=20_000), pace.pace_ns(steps=200_000)
    assert 5 < large / small < 20  # ten times the work, about ten times the time
    # this process and a busy neighbour on one CPU: the work (about 10 ms a round) waits
    # for the CPU about as long as it runs, and that wait is not counted
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    neighbour = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        os.sched_setaffinity(neighbour.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.3)
        started = time.perf_counter_ns()
        shared = pace.pace_ns(steps=200_000)
        waited = time.perf_counter_ns() - started
    finally:
        os.sched_setaffinity(0, mine)
        neighbour.kill()
        neighbour.wait(5)
    assert waited > 1.5 * 3 * shared  # 3 rounds, each waiting for the CPU
    assert shared < 1.5 * large  # taking turns on a CPU does not make the work dearer
    with pytest.raises(ValueError, match="rounds and steps must be at least 1"):
        pace.pace_ns(rounds=0)


def test_the_pace_probe_gives_the_median_of_its_readings_since_the_last_take():
    probe = pace.PaceProbe()  # not started: readings as given
    for reading in (300, 100, 400, 200):
        probe.add(reading)
    assert probe.take() == 250 and probe.take() is None
    probe = pace.PaceProbe(every_s=0.02).start()  # one reading at once, then its thread's
    time.sleep(0.3)
    first = probe.take()
    probe.stop()
    probe.take()  # a reading that landed between the first take and the stop
    assert first is not None and 10_000 < first < 50_000_000
    assert probe.take() is None  # stopped: nothing read since


EXPOSITION = """# HELP erlang_vm_statistics_runtime_milliseconds runtime
# TYPE erlang_vm_statistics_runtime_milliseconds counter
erlang_vm_statistics_runtime_milliseconds {runtime}
rabbitmq_process_resident_memory_bytes 155275264
rabbitmq_queue_messages{{queue="a"}} 10
rabbitmq_queue_messages{{queue="b"}} 5
rabbitmq_connections 21
rabbitmq_global_messages_delivered_total {delivered}
broken_line NaN
"""


@pytest.mark.alone
def test_a_prometheus_endpoint_becomes_the_brokers_own_view():
    state = {"runtime": 1000.0, "delivered": 100}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = EXPOSITION.format(**state).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        metrics = parse_prometheus(EXPOSITION.format(**state))
        assert metrics["rabbitmq_queue_messages"] == 15  # summed over label sets
        assert "broken_line" not in metrics
        assert evaluate("erlang_vm_statistics_runtime_milliseconds*0.001", metrics) == 1.0
        assert evaluate("missing_metric*2", metrics) is None
        from tasks.brokers.rabbitmq import RabbitMQ

        reader = PrometheusReader(f"http://127.0.0.1:{server.server_port}/metrics",
                                  RabbitMQ.prometheus)
        first = reader.row()
        assert first["cpu_pct"] is None and first["delivered_per_s"] is None  # no rate yet
        assert (first["rss_bytes"], first["connections"], first["backlog"]) == (155275264, 21, 15)
        time.sleep(0.5)
        state.update(runtime=1250.0, delivered=1100)  # 250 ms of CPU, 1,000 deliveries
        second = reader.row()
        assert second["cpu_pct"] == pytest.approx(50, rel=0.2)
        assert second["delivered_per_s"] == pytest.approx(2000, rel=0.2)
        with pytest.raises(ValueError, match="prometheus columns"):
            PrometheusReader("http://x", {"temperature": "t"})
    finally:
        server.shutdown()

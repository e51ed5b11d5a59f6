"""The Mosquitto the driver benches measure, and what /proc, ss and $SYS say about it.

`Broker` starts one on a free loopback port with the ANCHORS settings; `SysCounter` reads
its own count of PUBLISH packets received from $SYS (only the updates inside a window
count, `window_rate`); `SendQueue` reads its side of the subscribers' sockets (ss -ti);
the functions read a process's CPU ticks, wake-ups and RSS from /proc. Used by
bench_driver.py and the scripts built on it (ack_regime.py, ab_driver.py).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tasks.driver.paho_glue import stop_client  # noqa: E402
from tasks.ports import free_port, wait_listening  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_ticks(pid: int) -> int:
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[int, int]:
    """(user, system) CPU ticks of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def wakeups(pid: int) -> int:
    """How many times a process has gone to sleep and been woken (its voluntary context
    switches, all threads'). On the fixed-rate rows nearly every one of the broker's is a
    send that found it idle and paid to wake it (its timers and $SYS add a few a second)."""
    return sum(int(line.split()[1]) for status in Path(f"/proc/{pid}/task").glob("*/status")
               for line in status.read_text().splitlines()
               if line.startswith("voluntary_ctxt_switches"))


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the broker


def acl_patterns(count: int) -> str:
    """An ACL file that makes each message cost the broker more and changes nothing else:
    one pattern that lets the bench read $SYS, `count` more patterns, none matching a
    published topic (each one, for every PUBLISH received and every delivery, a copy of
    the pattern with the client id put in, and a topic match: Mosquitto 2.0's
    mosquitto_acl_check_default), then one that allows every topic. A message is checked
    against `count` + 1 patterns before it is allowed."""
    return ("pattern read $SYS/#\n"
            + "".join(f"pattern readwrite perfpipe-acl/{i}/%c\n" for i in range(count))
            + "pattern readwrite #\n")


class Broker:
    def __init__(self, workdir: Path, acl: str | None = None) -> None:
        """A Mosquitto on a free loopback port; `acl`, the text of its ACL file."""
        self.port = free_port()
        conf = workdir / f"mosquitto-{self.port}.conf"
        extra = ""
        if acl is not None:
            acl_file = workdir / f"acl-{self.port}"
            acl_file.write_text(acl)
            acl_file.chmod(0o644)  # read by the user Mosquitto drops to when run as root
            workdir.chmod(workdir.stat().st_mode | 0o111)
            extra = f"acl_file {acl_file}\n"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                        "persistence false\nmax_queued_messages 1000000\n"
                        "max_inflight_messages 0\nlog_dest none\nsys_interval 1\n" + extra)
        binary = "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() \
            else shutil.which("mosquitto")
        if not binary:
            sys.exit("mosquitto is not installed (apt-get install mosquitto)")
        self.process = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        if not wait_listening(self.port, 10):
            self.stop()
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
        stop_client(self.client)


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

    def __init__(self, port: int, start: float, end: float, delivery_bytes: int) -> None:
        import threading

        self.port, self.start, self.end = port, start, end
        self.delivery_bytes = delivery_bytes  # one delivered PUBLISH, as sent
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
        return {"segs_per_msg": delta("data_segs_out") / (sent / self.delivery_bytes),
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


def sleep_until(unix_s: float) -> None:
    while (left := unix_s - time.time()) > 0:
        time.sleep(min(left, 0.5))

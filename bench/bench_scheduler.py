"""The driver's own Python per published message on a rated row, without the kernel's share.

    .state/venv/bin/python bench/bench_scheduler.py                 # 1000 clients x 50/s
    .state/venv/bin/python bench/bench_scheduler.py --clients 10000 --rate 5 --reps 7

bench_driver.py's fixed-rate rows measure all the CPU a tool spends per message, and there
the kernel's share (a `send` per message, which on loopback also wakes the broker) is about
three quarters and varies by +-15% from repetition to repetition: a change to the
scheduler's Python is lost in it. This runs the real `send.Scheduler` and `Accounting`
over simulated time, one `run` per tick as the driver's loop calls it, with a socket that
takes every byte at once (a stand-in: it measures the Python, not the kernel). It prints the
median CPU microseconds per message over the repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tasks.driver.accounting import Accounting  # noqa: E402
from tasks.driver.send import Scheduler  # noqa: E402
from tasks.driver.session import READY, Conn, Sessions  # noqa: E402

START_NS = 1_700_000_000 * 1_000_000_000


class TakesAll:
    """A socket whose send takes every byte (the stand-in for the kernel)."""

    def send(self, data: bytearray) -> int:
        return len(data)


class Loop:
    """The driver's `Sessions` as the scheduler sees it: its own `flush`, whose common case
    (raw bytes, sent whole) is all that runs against the stand-in socket."""

    on_window = None
    flush = Sessions.flush


def publishers(clients: int, rate: float, qos: int) -> list[Conn]:
    conns = []
    for index in range(clients):
        spec = SimpleNamespace(rate=rate, publisher_index=index, topic_cycle=None, qos=qos,
                               topic=f"bench/{index}", payload_bytes=256)
        conn = Conn(spec, "pub", index, None, False)
        conn.state, conn.raw, conn.sock, conn.out = READY, True, TakesAll(), bytearray()
        conns.append(conn)
    return conns


def us_per_message(clients: int, rate: float, tick_us: int, seconds: float) -> float:
    end_ns = START_NS + int(seconds * 1e9)
    conns = publishers(clients, rate, qos=0)
    scheduler = Scheduler(Loop(), Accounting(None, 7), conns, START_NS, end_ns,
                          max_inflight=100)
    now, cpu = START_NS, time.process_time()
    while now < end_ns:
        scheduler.run(now)
        now += tick_us * 1000
    cpu = time.process_time() - cpu
    return cpu / sum(conn.seq for conn in conns) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50, help="msgs/s per client")
    parser.add_argument("--tick-us", type=int, default=2000, help="bench_driver's fixed-rate tick")
    parser.add_argument("--seconds", type=float, default=10, help="simulated seconds a repetition")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    runs = [us_per_message(args.clients, args.rate, args.tick_us, args.seconds)
            for _ in range(args.reps)]
    print(f"{args.clients} clients x {args.rate:g} msgs/s, tick {args.tick_us} us: "
          f"{statistics.median(runs):.2f} us of Python per message (median of {args.reps}; "
          f"{min(runs):.2f}-{max(runs):.2f})")


if __name__ == "__main__":
    main()

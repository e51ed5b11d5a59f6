"""What a sender pays per message either side of the broker's quick-ACK threshold.

    .state/venv/bin/python bench/ack_regime.py [--rates 4.5 5 5.5] [--reps 3] [--clients 10000]
        [--tools floor perfpipe mqtt.js]

bench_driver.py's 10,000-client fixed-rate row, at 50K msgs/s in total (5 a client) until
2026-11-27, swung from run to run for every Python sender, perfpipe and the floor alike
(medians of 3 from 1.16 to 1.47 over the runs in bench/README.md, repetitions 1.07 to
1.58), and now runs at 4.5 a client. An
interval of 200 ms a client is the broker socket's
retransmission timeout on loopback (Linux's 200 ms minimum; `ss -ti` shows rto:200 on the
broker's side), and Linux's receiver goes into quick-ACK mode, an immediate ACK for each of
the next (up to) 16 segments, when data comes after a gap longer than that timeout
(`tcp_event_data_recv`; the gap is counted in jiffies, 4 ms here). On loopback that
immediate ACK is made in the softirq that runs inside the sender's own ``send`` while its
socket is locked, so the sender processes it on release (perf: ``tcp_ack`` under
``__release_sock`` in ``__sys_sendto``): system time of the sender's, taken off the broker,
which otherwise ACKs when it reads. A client whose message leaves later than the one before
by more than about a jiffy crosses the line, so at exactly 5 msgs/s a client the row
measured how steady the sender's sends were as much as what a send cost.

This runs the floor sender (bench/floor_sender.py) and perfpipe's driver, each at the
fixed-rate rows' 2 ms tick at every rate (``--tools``: any of bench_driver's names, MQTT.js
too, which always runs on its 2 ms timer; ``perfpipe@tick_us=0`` for another tick), at
rates per client either side of 5 (gaps of 222 and 182 ms at 4.5 and 5.5), alternated, against one
Mosquitto as bench/broker_side.py starts it, and prints the median CPU microseconds per message of
the tool and of the broker at each rate. Figures from one run only: this machine's own
level moves between runs by more than the threshold's effect.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_driver as bd  # noqa: E402
from broker_side import Broker, SysCounter, raise_nofile  # noqa: E402
from load_tools import ensure_mqttjs  # noqa: E402

TOOLS = ("floor", "perfpipe")  # at the fixed-rate rows' 2 ms tick (`main`), unless name@tick_us=N


def scenario(clients: int, rate: float) -> str:
    """bench_driver's fixed-rate row name for `clients` at `rate` msgs/s each."""
    total = clients * rate / 1000
    if total != int(total):
        raise SystemExit(f"--rates: {rate} x {clients} clients is not a whole number of "
                         "thousands of msgs/s (bench_driver's row names count in K)")
    return f"pub-q0-c{clients}-r{int(total)}k"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[4.5, 5.0, 5.5],
                        help="msgs/s per client")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS),
                        help="bench_driver's tool names: floor, perfpipe (both at a 2 ms tick "
                             "unless given as name@tick_us=N), mqtt.js (its 2 ms timer)")
    args = parser.parse_args()
    rows = [scenario(args.clients, rate) for rate in args.rates]
    raise_nofile()
    bd.PP_TICK_US = bd.JS_TICK_US  # every rate at the fixed-rate rows' tick, not only theirs
    if any(bd.tool_variant(tool)[0] == "mqtt.js" for tool in args.tools):
        ensure_mqttjs()
    timing = {"warmup_s": 3, "measure_s": 12, "drain_s": 1}
    workdir = Path(tempfile.mkdtemp(prefix="perfpipe-ack-"))
    broker = Broker(workdir)
    figures: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    try:
        sys_counter = SysCounter(broker.port)
        for rep in range(args.reps):
            order = [(t, r) for r in rows for t in args.tools]
            for tool, row in order if rep % 2 == 0 else reversed(order):
                figure = bd.run_undisturbed(tool, row, broker, sys_counter, workdir, timing,
                                            f"rep {rep + 1}")
                if bd.disturbed(figure):
                    print(f"  rep {rep + 1} {row} {tool}: disturbed three times, left out",
                          flush=True)
                    continue
                tool_us, sys_us, broker_us = bd.us_per_message(figure)
                figures.setdefault((tool, row), []).append((tool_us, sys_us, broker_us))
                print(f"  rep {rep + 1} {row} {tool}: {figure['rate'] / 1e3:.1f}K msgs/s, "
                      f"tool {tool_us:.2f} us/msg (sys {sys_us:.2f}), broker "
                      f"{broker_us:.2f} us/msg, send late p99 "
                      f"{(figure.get('late_us') or {}).get('p99', 0) / 1000:.2f} ms", flush=True)
    finally:
        broker.stop()
    print(f"\nmedian of {args.reps} (fewer where a run was left out), CPU microseconds per "
          "message (load generator / its system time / broker):")
    for rate, row in zip(args.rates, rows):
        cells = []
        for tool in args.tools:
            runs = figures.get((tool, row), [])
            if runs:
                tool_us, sys_us, broker_us = (statistics.median(x) for x in zip(*runs))
                of = f" ({len(runs)} runs)" if len(runs) < args.reps else ""
                cells.append(f"{tool} {tool_us:.2f} / {sys_us:.2f} / {broker_us:.2f}{of}")
        print(f"  {rate:g} msgs/s a client (a {1000 / rate:.0f} ms gap): " + "; ".join(cells))


if __name__ == "__main__":
    main()

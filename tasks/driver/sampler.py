"""Broker-side sampler: the broker's processes, its host and its own statistics, one row per
second over a stage, whether or not perfpipe started the broker.

    python -m tasks.driver.sampler --until UNIX_SECONDS --out DIR
        [--pid PID | --session SID | --pid-file FILE | --unit UNIT | --match REGEX]
        [--host-counters] [--sys HOST:PORT | --no-sys]
        [--prometheus URL --prom COLUMN=EXPRESSION ...]

Writes into DIR (columns in `tasks.driver.output`; a row's ``second`` is the whole Unix
second that just ended):
``broker.csv``        the broker's processes (`tasks.driver.procfs`: found again every second),
                      when a way to find them is given
``host.csv``          the host's own CPU, memory and network, with --host-counters: a broker
                      on a dedicated host is covered even when its processes cannot be found;
                      its pace (`tasks.driver.pace`): the median CPU time a fixed piece of
                      work took, read four times a second; and its steal (`procfs.read_host`)
``broker_stats.csv``  the broker's own view (`tasks.driver.broker_stats`): from $SYS
                      (--sys, or with --pid the broker's first plain listener read from its
                      ``-c`` config, as Mosquitto's) or from a Prometheus endpoint
``broker_sys.csv``    Mosquitto's $SYS values as published (``SYS_COLUMNS``), beside it
The first $SYS rows can be partial: the sampler starts from the values the broker retained,
and Mosquitto retains a figure for 60 s after it last changed. A missing count (connections,
subscriptions) is published within two updates, one too high for up to three updates
(`broker_stats.SysListener`); any other figure that has not moved (``pub_dropped``,
``heap_maximum``) stays empty until it does. When a source cannot be read the sampler
still writes the others and says why on stderr. SIGTERM stops it early, and it writes what
it sampled.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from . import pace, procfs
from .broker_stats import (
    SYS_COLUMNS,
    SYS_FILE,
    SYS_TOPICS,
    PrometheusReader,
    SysListener,
    broker_endpoint,
    sys_row,
    sys_stats,
)
from .output import (
    HOST_COLUMNS,
    HOST_FILE,
    SAMPLER_COLUMNS,
    SAMPLER_FILE,
    STATS_COLUMNS,
    STATS_FILE,
    write_csv,
)


class Sources:
    """What one sampler reads each second, and the rows it kept."""

    def __init__(self, finder: procfs.ProcessFinder | None, host_counters: bool,
                 sys_listener: SysListener | None, prometheus: PrometheusReader | None) -> None:
        self.finder, self.host_counters = finder, host_counters
        self.sys_listener, self.prometheus = sys_listener, prometheus
        self.rows: dict[str, list[dict]] = {"broker": [], "host": [], "stats": [], "sys": []}
        self.procs = self.host = None
        self.pace: pace.PaceProbe | None = None

    def start(self) -> None:
        self.procs = self._processes()
        self.host = procfs.read_host() if self.host_counters else None
        self.pace = pace.PaceProbe().start() if self.host_counters else None
        if self.prometheus is not None:
            self.prometheus.row()  # the first scrape: counters' rates start from here

    def _processes(self) -> procfs.ProcessReading | None:
        if self.finder is None:
            return None
        stats = procfs.all_stats()
        return procfs.read_processes(self.finder.find(stats), stats)

    def tick(self, second: int, seconds: float) -> None:
        if self.finder is not None:
            procs = self._processes()
            self.rows["broker"].append({"second": second,
                                        **procfs.process_row(self.procs, procs, seconds)})
            self.procs = procs
        if self.host_counters:
            host = procfs.read_host()
            self.rows["host"].append({"second": second, **procfs.host_row(self.host, host, seconds),
                                      "pace_ns": self.pace.take()})
            self.host = host
        if self.sys_listener is not None:
            previous = self.rows["sys"][-1] if self.rows["sys"] else None
            row = sys_row(second, self.sys_listener.snapshot(), previous)
            self.rows["sys"].append(row)
            self.rows["stats"].append({"second": second, **sys_stats(row)})
        elif self.prometheus is not None:
            self.rows["stats"].append({"second": second, **self.prometheus.row()})

    def write(self, out_dir: Path) -> None:
        if self.pace is not None:
            self.pace.stop()
        out_dir.mkdir(parents=True, exist_ok=True)

        def put(name: str, columns: tuple[str, ...], rows: list[dict]) -> None:
            write_csv(out_dir / name, columns,
                      [["" if r.get(c) is None else r[c] for c in columns] for r in rows])

        if self.finder is not None:
            put(SAMPLER_FILE, SAMPLER_COLUMNS, self.rows["broker"])
        if self.host_counters:
            put(HOST_FILE, HOST_COLUMNS, self.rows["host"])
        if any(r[c] is not None for r in self.rows["sys"] for c in SYS_TOPICS):
            put(SYS_FILE, SYS_COLUMNS, self.rows["sys"])
        if any(v is not None for r in self.rows["stats"] for k, v in r.items() if k != "second"):
            put(STATS_FILE, STATS_COLUMNS, self.rows["stats"])


class Stopped(Exception):
    """SIGTERM: stop sampling, and write what was sampled."""


def _stop(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: the files are written next
    raise Stopped


def sample(sources: Sources, until: float, out_dir: Path) -> int:
    """Sample every second, on whole seconds, until `until` (or `Stopped`), then write the
    files; returns the seconds sampled. A stop in the middle of a second can leave that
    second in one file and not in another."""
    ticks = 0
    try:
        sources.start()
        last_t = time.time()
        while time.time() < until:
            time.sleep(1.0 - (time.time() % 1.0))
            now = time.time()
            sources.tick(int(now) - 1, now - last_t)
            last_t, ticks = now, ticks + 1
            if sources.finder is not None and not sources.procs.ticks \
                    and sources.finder.way in ("pid", "session"):
                break  # the broker perfpipe started is gone
    except Stopped:
        pass
    if signal.getsignal(signal.SIGTERM) is _stop:  # a first SIGTERM now: the files go on
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (main() restores the handler after)
    sources.write(out_dir)
    return ticks


def _finder(args: argparse.Namespace) -> procfs.ProcessFinder | None:
    for way in procfs.WAYS:
        if getattr(args, way) is not None:
            return procfs.ProcessFinder(way, str(getattr(args, way)))
    return None


def _sys_listener(args: argparse.Namespace) -> SysListener | None:
    if args.no_sys or args.prometheus:
        return None
    if args.sys:
        host, _, port = args.sys.rpartition(":")
        endpoint = (host or "127.0.0.1", int(port))
    elif args.pid is not None:
        endpoint = broker_endpoint(args.pid)
        if endpoint is None:
            print(f"sampler: no plain listener found for pid {args.pid}: no $SYS samples",
                  file=sys.stderr)
            return None
    else:
        return None
    try:
        return SysListener(*endpoint)
    except (OSError, ImportError) as exc:
        print(f"sampler: no $SYS samples from {endpoint[0]}:{endpoint[1]}: {exc}", file=sys.stderr)
        return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tasks.driver.sampler", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--until", type=float, required=True, help="stop at this Unix time")
    p.add_argument("--out", type=Path, required=True)
    ways = p.add_mutually_exclusive_group()
    ways.add_argument("--pid", type=int, help="the broker process and its descendants")
    ways.add_argument("--session", type=int, help="every process of this session id")
    ways.add_argument("--pid-file", dest="pid_file", help="the pid in this file, and descendants")
    ways.add_argument("--unit", help="every process of this systemd unit")
    ways.add_argument("--match", help="every process whose command line matches this regex")
    p.add_argument("--host-counters", action="store_true",
                   help="also this host's CPU, memory, network, pace and steal (host.csv)")
    p.add_argument("--sys", metavar="HOST:PORT", help="read the broker's $SYS topics here")
    p.add_argument("--no-sys", action="store_true", help="no $SYS (default with --pid: from "
                   "the broker's config)")
    p.add_argument("--prometheus", metavar="URL", help="the broker's Prometheus endpoint")
    p.add_argument("--prom", action="append", default=[], metavar="COLUMN=EXPRESSION",
                   help="where a broker_stats.csv column comes from (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _stop)
    listener = None
    try:
        prometheus = None
        if args.prometheus:
            columns = dict(item.split("=", 1) for item in args.prom)
            prometheus = PrometheusReader(args.prometheus, columns)
        listener = _sys_listener(args)
        sources = Sources(_finder(args), args.host_counters, listener, prometheus)
        ticks = sample(sources, args.until, args.out)
    except Stopped:
        print("sampler: stopped before it began sampling: no files", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        if listener is not None:
            listener.close()
    print(json.dumps({"rows": ticks, "processes": sources.finder and sources.finder.describe()}),
          file=sys.stderr)
    return 0 if ticks else 1


if __name__ == "__main__":
    sys.exit(main())

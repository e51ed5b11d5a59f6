"""One driver process running one stage: connect, barrier, publish open-loop, drain, report.

The pieces: `tasks.driver.session` (paho sessions on one epoll loop, and the rules that
keep paho's bytes and the fast path's apart), the fast path itself: `tasks.driver.send`
(open-loop publishing in batches) and `tasks.driver.receive` (parsing many packets per
read), `tasks.driver.accounting` (counters, histograms, sequence tracking) and
`tasks.driver.output` (the raw files, a contract with `spark/aggregate.py`, written on a
thread of their own so a busy disk never holds up the measuring loop).

Phases: connect every client at the paced rate (a connection burst overflows Mosquitto's
~100-connection listen backlog, and TCP then waits a second before retrying), write
``ready.json``, wait for ``start.json``'s common start time, publish from then until the
end of the measure window (the warm-up is measured too and dropped by the aggregation),
keep receiving and collecting QoS 1/2 acks for ``drain_s``, send DISCONNECT, write files.
Every phase has a time bound, so a dead broker gives a partial result, never a hang.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import time
import traceback
from collections import deque
from pathlib import Path

from . import procfs
from .accounting import C_CONNECTS_FAILED, C_ERRORS, Accounting
from .output import READY_FILE, START_FILE, RawWriter, write_json
from .paho_glue import check_paho
from .receive import Reader
from .send import Scheduler, stream_last_seqs, stream_unacked
from .session import CONNECTED, DEAD, READY, Sessions
from .spec import ProcessSpec
from .wire import HEADER, run_tag

__all__ = ["Engine", "HEADER", "raise_fd_limit", "run_tag"]
HOUSEKEEPING_SLICES = 10  # paho keepalive for 1/10 of the clients every 100 ms
PROGRESS_EVERY_S = 1.0
CLOSE_TIMEOUT_S = 30.0  # for queued writes after a failure, before the process exits


class Engine:
    """Runs one ProcessSpec and writes the raw files through a RawWriter."""

    def __init__(self, spec: ProcessSpec, out_dir: Path) -> None:
        self.spec = spec
        self.out_dir = Path(out_dir)
        self.acct = Accounting(RawWriter(self.out_dir), run_tag(spec.run_id, spec.stage_id))
        self.sessions = Sessions(spec, self.acct)
        self.sessions.reader = Reader(self.sessions, self.acct, spec.read_hold_us / 1e6)
        self.status = "ok"
        self.windows: dict[str, int] = {}
        self.stop_requested = False
        self._slice = 0
        self._misc_at = time.monotonic()
        self._progress_at = 0.0
        self.phase = "connect"
        self.publish_cpu: dict | None = None  # this process's CPU over the publish phase

    # ---- phases -------------------------------------------------------------------------
    def connect_all(self) -> None:
        """Open every client at the paced rate, then wait for CONNACKs and SUBACKs."""
        sessions, spec = self.sessions, self.spec
        queue = deque(sessions.new(s, "sub") for s in spec.subscribers)
        queue.extend(sessions.new(p, "pub") for p in spec.publishers)
        interval = 1.0 / spec.connect_rate
        next_at = time.monotonic()
        deadline = next_at + len(queue) * interval + spec.connect_timeout_s
        while time.monotonic() < deadline and not self.stop_requested:
            if not queue and sessions.unready == 0:
                break
            now = time.monotonic()
            while queue and now >= next_at and sessions.connecting < spec.max_pending_connects:
                sessions.open(queue.popleft())
                next_at = max(next_at + interval, now - 0.1)  # no catch-up burst after a stall
                now = time.monotonic()
            wait = next_at - now if queue and sessions.connecting < spec.max_pending_connects \
                else 0.01
            sessions.poll(min(max(wait, 0.0), 0.01))
            self._housekeeping()
        for conn in sessions.conns:
            if conn.state != DEAD and conn.state != READY:
                column = C_ERRORS if conn.state == CONNECTED else C_CONNECTS_FAILED
                self.acct.count(column)
                self.acct.event("not_ready", conn.spec.client_id, connected=conn.state == CONNECTED)
                sessions.drop(conn)

    def wait_for_start(self) -> int | None:
        """Report readiness, then wait for the orchestrator's common start time."""
        self.phase = "wait"
        self.write_progress()
        _raise(self.acct.writer.wait())  # the orchestrator reads progress.json once ready
        conns = self.sessions.conns
        ready = sum(1 for c in conns if c.state == READY)
        write_json(self.out_dir / READY_FILE, {"ready": ready, "clients": len(conns)})
        start_file = self.out_dir / START_FILE
        deadline = time.monotonic() + self.spec.start_timeout_s
        while time.monotonic() < deadline and not self.stop_requested:
            if start_file.exists():
                try:
                    return int(json.loads(start_file.read_text())["start_at"])
                except (ValueError, KeyError):
                    pass  # half-written: read again on the next tick
            self.sessions.poll(0.05)
            self._housekeeping()
        self.acct.event("no_start", timeout_s=self.spec.start_timeout_s)
        return None

    def publish_until(self, start_at: int) -> None:
        """Publish open-loop from start_at until the end of the measure window, then drain."""
        spec, sessions = self.spec, self.sessions
        pub_end = start_at + spec.warmup_s + spec.measure_s
        self.windows = {"start": start_at, "measure_start": start_at + spec.warmup_s,
                        "measure_end": pub_end, "end": pub_end + spec.drain_s}
        while time.time() < start_at and not self.stop_requested:
            sessions.poll(min(0.05, max(0.0, start_at - time.time())))
            self._housekeeping()
        self.phase = "publish"
        self._cpu_from = (time.monotonic(), _cpu_seconds(), procfs.cpus_ticks(_own_cpus()))
        publishers = [c for c in sessions.conns if c.role == "pub" and c.state == READY]
        end_ns = pub_end * 1_000_000_000
        scheduler = Scheduler(sessions, self.acct, publishers, start_at * 1_000_000_000,
                              end_ns, spec.max_inflight, spec.tick_us)
        self.scheduler = scheduler
        tick_ns = spec.tick_us * 1000
        next_run = 0  # with a tick, sends wait for it even when reads wake the loop sooner
        while not self.stop_requested:
            now = time.time_ns()
            if now >= end_ns:
                break
            if now >= next_run:
                scheduler.run(now)
                next_run = now + tick_ns
            due = scheduler.next_due()
            if due is not None and due < next_run:
                due = next_run
            if due is None:
                sessions.poll(min(0.01, (end_ns - now) / 1e9))
            else:
                wait = (due - time.time_ns()) / 1e9
                sessions.poll(min(max(wait, 0.0), 0.01, (end_ns - now) / 1e9), precise=True)
            self._housekeeping()
        if not self.stop_requested:  # what fell due since the last tick's run
            scheduler.run(time.time_ns())  # it stops at the last one before end_ns
        wall, cpu, ticks = self._cpu_from
        self.publish_cpu = {"cpu_s": round(_cpu_seconds() - cpu, 3),
                            "wall_s": round(time.monotonic() - wall, 3),
                            "cpus_idle_pct": procfs.idle_pct(ticks, procfs.cpus_ticks(_own_cpus()))}
        drain_end = self.windows["end"]
        self.phase = "drain"
        while time.time() < drain_end and not self.stop_requested:
            sessions.poll(min(0.02, max(0.0, drain_end - time.time())))
            self._housekeeping()
        self.acct.accepting = False

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._misc_at < 1.0 / HOUSEKEEPING_SLICES:
            return
        self._misc_at = now
        conns = self.sessions.conns
        size = -(-len(conns) // HOUSEKEEPING_SLICES)
        start = self._slice * size
        self.sessions.housekeeping(start, start + size)
        self._slice = (self._slice + 1) % HOUSEKEEPING_SLICES
        if now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = now
            self.write_progress()
            self.acct.checkpoint(int(time.time()))
            _raise(self.acct.writer.failed())  # here, inside run's try: the stage errs

    def write_progress(self) -> None:
        """Cumulative counters for the orchestrator's fail-fast rules and live progress."""
        totals = self.acct.totals()
        self.acct.writer.progress({
            "t": round(time.time(), 3), "phase": self.phase, "clients": len(self.sessions.conns),
            **{k: totals[k] for k in ("published", "received", "errors", "connects_ok",
                                      "connects_failed")}})

    # ---- whole stage --------------------------------------------------------------------
    def run(self) -> dict:
        fd_limit = raise_fd_limit()
        started = time.time()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            check_paho()
            self.connect_all()
            start_at = self.wait_for_start()
            if start_at is None:
                self.status = "no_start"
            else:
                self.publish_until(start_at)
        except Exception as exc:  # the partial result is still written, with the error
            self._failed(exc)
        finally:
            signal.signal(signal.SIGTERM, previous)
            try:
                self.sessions.close_all()
            except Exception as exc:  # noqa: BLE001 - closing must not lose the results
                self.acct.event("close_error", error=f"{type(exc).__name__}: {exc}")
        if self.stop_requested and self.status == "ok":
            self.status = "partial"
        try:
            return self.finish(started, fd_limit)
        finally:  # what is queued is written even if finish fails
            self.acct.writer.close(timeout_s=CLOSE_TIMEOUT_S)

    def _failed(self, exc: BaseException) -> None:
        """The stage ends as an error, and events.jsonl says which, with its trace."""
        self.status = "error"
        self.acct.event("driver_error", error=f"{type(exc).__name__}: {exc}",
                        trace="".join(traceback.format_exception(exc)))

    def _on_sigterm(self, signum, frame) -> None:
        self.stop_requested = True
        self.acct.event("stopped", signal=int(signum))

    def finish(self, started: float, fd_limit: int) -> dict:
        acct, sessions = self.acct, self.sessions
        acct.write()
        error = acct.writer.wait()
        if error is not None:  # the files are as complete as the disk let them be
            self._failed(error)
        acct.tracks = [c.tracks for c in sessions.conns if c.role == "sub" and c.tracks]
        totals = acct.totals()
        if self.status == "ok" and (totals["errors"] or totals["connects_failed"]):
            self.status = "partial"
        publishers = [c for c in sessions.conns if c.role == "pub"]
        first, last = sessions.first_connect_at, sessions.last_connack_at
        summary = {
            "run_id": self.spec.run_id, "stage_id": self.spec.stage_id,
            "host": self.spec.host, "proc": self.spec.proc, "status": self.status,
            "windows": self.windows, "totals": totals,
            "unique_received": totals["received"] - totals["duplicated"],
            "missing_at_end": sum(len(t.missing or ()) for ts in acct.tracks for t in ts.values()),
            "last_seq": {index: seq for c in publishers
                         for index, seq in stream_last_seqs(c.spec, c.seq).items()},
            "unacked_at_end": sum(len(c.inflight or ()) for c in publishers),
            "unacked_by_stream": {index: n for c in publishers if c.inflight
                                  for index, n in stream_unacked(c.spec, c.seq,
                                                                 len(c.inflight)).items()},
            "qos2_pubacks": sessions.reader.qos2_pubacks,
            "tls": sessions.tls_seen,
            "e2e_before_sent": acct.e2e_before_sent,
            "subscriptions_granted": {str(q): n for q, n in sorted(sessions.granted.items())},
            "qos_judgement": acct.judgement(),
            "connect_phase": {
                "clients": len(sessions.conns), "connected": totals["connects_ok"],
                "first_connect_at": first, "last_connack_at": last,
                "duration_s": round(last - first, 6) if first and last else None,
            },
            "clients": {"publishers": len(self.spec.publishers),
                        "subscribers": len(self.spec.subscribers)},
            "versions": {"paho_mqtt": _paho_version(), "python": platform.python_version()},
            "clock": {"source": "time.time_ns"},  # against others: hosts/<host>.json
            "fd_limit": fd_limit,
            "cpus": sorted(_own_cpus()),
            "publish_cpu": self.publish_cpu,
            "read_hold": {"held_passes": sessions.reader.held_passes,
                          "max_ms": round(sessions.reader.hold_max_s * 1000, 3),
                          "stamped_reads": sessions.stamped_reads,
                          "segments_in": sessions.segments_in},
            "elapsed_s": round(time.time() - started, 3),
            "config": self.spec.echo(),
        }
        acct.writer.summary(summary)
        return summary


def _own_cpus() -> set[int]:
    """The CPUs this process may run on."""
    return os.sched_getaffinity(0)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _paho_version() -> str:
    import paho.mqtt

    return paho.mqtt.__version__


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit; returns the new limit.

    One socket per client (no paho socket pair: ``loop_start``/``loop()`` are never used),
    so 10,000 clients need a little over 10,000 descriptors.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1_048_576
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft


def _raise(error: BaseException | None) -> None:
    """Raise a failed write's error where the caller can handle it (`RawWriter.failed`)."""
    if error is not None:
        raise error

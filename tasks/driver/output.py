"""Raw driver output: the contract between `tasks.driver` and `spark/aggregate.py`.

One directory per stage, host and driver process: ``raw/<stage_id>/<host>/<proc>/``.

``counters.csv`` and ``histograms.csv`` grow as the stage goes (each second is appended
about two seconds after it ends), so a process killed mid-stage leaves the seconds it
measured; at the end both are rewritten whole, with any late event, before
``summary.json``. Without ``summary.json`` a process did not finish.

``counters.csv``  one row per wall-clock second (integer Unix seconds, the second in which
                  the event happened on this host), columns ``COUNTER_COLUMNS``:
                  published   PUBLISH packets handed to the socket (appended to the
                              client's output buffer and written in the same tick; publisher
                              sockets have a bounded send buffer, so this stays close to what
                              the broker took)
                  acked       PUBACK/PUBCOMP received (QoS 1/2; a QoS 2 publish the broker
                              downgraded ends at a PUBACK: ``qos2_pubacks``)
                  received    messages received by subscribers (duplicates included:
                              delivered = received - duplicated), in the second they were
                              read, which can be just after the one they arrived in (their
                              e2e latency ends at the arrival: receive.Reader.arrived)
                  lost        sequence gaps seen by subscribers in that second; the stage's
                              loss is computed from expected minus unique deliveries
                  duplicated  messages whose sequence number a subscriber had already seen
                  out_of_order  messages that filled an earlier gap
                  errors      client errors on connections the broker accepted (dropped
                              connections, refused subscriptions, failed publishes); a
                              connect that failed counts in connects_failed alone
                  inflight_full  messages held back because their publisher's QoS 1/2
                              in-flight window (``max_inflight``) was full, each counted once
                              (they are sent when acks free the window, late: ``pub_delay``)
                  connects_ok, connects_failed   CONNACK accepted / a connect refused or
                              failed, or a client not ready by the connect deadline
                  delay_overruns  messages sent more than ``DELAY_OVERRUN_US`` after their
                              intended time, past a tick's own lateness (`overrun_after_us`)
``histograms.csv`` sparse latency histograms, columns ``HISTOGRAM_COLUMNS``
                  (second, kind, bucket, count); ``kind`` is one of ``HISTOGRAM_KINDS``,
                  buckets are `tasks.driver.histogram` indexes of microseconds.
``events.jsonl``  one JSON object per line ({t, event, client_id?, ...}): disconnects and
                  errors with their codes. ``event`` is connect_failed (TCP: ``code`` is the
                  errno, e.g. 111 refused), connect_refused (CONNACK: ``code`` is the reason
                  code in paho's MQTT 5 numbering, e.g. 135 not authorized, with ``reason``), connection_lost (``code``: errno, or paho's MQTT_ERR_* when
                  the broker closed or the keepalive expired), subscribe_refused, not_ready,
                  no_start, stopped (SIGTERM), driver_error (with ``trace``), close_error.
``progress.json`` rewritten about once a second while the process runs: {t (Unix
                  seconds), phase (connect, wait, publish, drain), clients, and the
                  cumulative counters published, received, errors, connects_ok,
                  connects_failed}; the orchestrator's fail-fast rules and live progress
                  read it (`tasks.analysis.failfast`), the aggregation does not.
``summary.json``  written last (its presence marks a complete process): the stage window in
                  Unix seconds, the config echo without secrets, library versions, the clock
                  source, totals and the last sequence number of every publisher stream
                  (``last_seq``, keyed like ``receivers`` below), and:
                  connect_phase  {clients, connected, first_connect_at, last_connack_at,
                              duration_s}: Unix seconds (floats) from the first CONNECT this
                              process sent to the last CONNACK it accepted, so a connection
                              rate is ``connected / duration_s`` (or, across processes,
                              summed ``connected`` over max(last) - min(first)); times are
                              null when nothing connected
                  unacked_at_end  QoS 1/2 publishes still unacknowledged when the drain ended
                  unacked_by_stream  {stream: count} of those, keyed like last_seq: the
                              last messages of each publisher (acknowledgements come in
                              the order messages were sent)
                  e2e_before_sent  deliveries whose end-to-end latency read negative (the
                              receiving host's clock behind the sending host's by more
                              than the transit): each counted as 0 us in the histogram
                  tls         {version, cipher} the process's first TLS handshake agreed
                              with the broker (e.g. TLSv1.2, AES256-GCM-SHA384); null
                              without TLS
                  qos2_pubacks  QoS 2 publishes the broker acknowledged with a PUBACK, as
                              QoS 1 (it downgraded them; RabbitMQ's MQTT plugin does), over
                              the process's whole life: each is counted acked, its pub_ack
                              latency to that PUBACK
                  subscriptions_granted  {"0"|"1"|"2": count}: the QoS the broker's SUBACKs
                              granted the subscriptions (a subscriber asks for its spec's
                              qos; a broker may grant less)
                  qos_judgement  {by_qos: {"0"|"1"|"2": {unique, missing, duplicated,
                              out_of_order}}, violations, publishers_with_anomalies}: what
                              subscribers saw per delivery QoS, judged against its promise
                              (violations = missing under QoS 1/2 + duplicates under QoS 2;
                              QoS 0 loss and QoS 1 duplicates are allowed), and up to 100
                              (subscriber, publisher) pairs with a gap, duplicate or reorder
                  fd_limit    the open-file limit the driver raised itself to
                  cpus        the CPUs it may run on: those its launching shell
                              allowed; on the broker's host, those ``broker.cpus``
                              leaves
                  publish_cpu  {cpu_s, wall_s, cpus_idle_pct}: this process's CPU
                              seconds (user + system) over the publish phase (warm-up
                              and measure window), its wall-clock length, and the % of
                              that time the CPUs it may run on (``cpus``) were idle
                              (/proc/stat: idle and iowait; null if no tick passed);
                              cpu_s / wall_s near 1.0, the sum of a host's processes
                              near the number of CPUs they may run on, or those CPUs
                              never idle, means the driver, not the broker, may have
                              been the bottleneck; null when the stage never started
                              publishing
                  read_hold   {held_passes, max_ms, stamped_reads, segments_in}: epoll
                              passes held back (`receive.Reader.end_pass`: a backlogged
                              reader, only when even the freshest message read was 50 ms
                              late, each for at most 1/128 of that latency and at most 20
                              ms; with the spec's read_hold_us, every pass that read
                              messages, at least that long) and the longest hold, 0 and 0.0
                              when none was held; the plain TCP reads whose receive time is
                              the kernel's arrival stamp, and the TCP segments with data
                              those sockets received (null if the kernel does not count
                              them): segments_in - stamped_reads bounds how many reads took
                              more than one segment, whose older messages got the newer
                              segment's time

Broker-side samples (`tasks.driver.sampler`) go to ``raw/<stage_id>/<host>/sampler/``, one
row per second:
``broker.csv``    ``SAMPLER_COLUMNS``, the broker's processes as /proc tells them, summed
                  over every process found (`tasks.driver.procfs`): CPU % of one core
                  (user + system, and each), RSS bytes, processes, threads, open files
                  (empty when they cannot be read), context switches per second
``host.csv``      ``HOST_COLUMNS``, the broker host itself: CPU % of one core over all
                  its CPUs (busy: not idle, not iowait; steal counts as busy), CPUs,
                  memory used (MemTotal - MemAvailable), bytes per second received and
                  sent on every interface but the loopback, its pace: the CPU ns a fixed
                  piece of work took (`tasks.driver.pace`; more ns, a slower host), and
                  its steal: % of one core its virtual CPUs were ready to run while the
                  hypervisor ran something else (/proc/stat; 0 on bare metal)
``broker_stats.csv``  ``STATS_COLUMNS``, the broker's own view (`tasks.driver.broker_stats`:
                  its $SYS topics or its Prometheus endpoint): CPU % of one core, resident
                  bytes, connections, the backlog it holds, messages it delivers per
                  second; a cell is empty when the broker does not tell it
``broker_sys.csv`` Mosquitto's $SYS as published (``tasks.driver.broker_stats.SYS_COLUMNS``)

``raw/<stage_id>/stage.json`` is written by the orchestrator (`tasks.steps.stages`) when it
starts the stage, and tells the aggregation what was intended:
  run_id, stage_id, scenario, qos, clients (publishers + subscribers),
  windows: {start, measure_start, measure_end, end} in Unix seconds (measure window is
           [measure_start, measure_end), whole seconds),
  target_publish_rate: msg/s summed over all publishers,
  expected_delivery_rate: msg/s that subscribers together should receive,
  receivers: {publisher_index (as a string): subscribers that should get each message};
             publisher indexes are unique across every process and host of a stage; a
             publisher with a ``topic_cycle`` of N topics is N streams with indexes
             publisher_index .. publisher_index + N - 1, each a key here and in
             ``last_seq``,
  processes: [{"host": ..., "proc": ...}, ...] every driver process that should report,
  broker_host: the host whose ``sampler/`` holds the broker samples (the broker's host, or
           a driver host for a broker reachable only over the network), or null,
  sampler: {processes (how the broker's processes were found, e.g. "session 1234", or
           null), host (whether host.csv is the broker host's), stats (where the broker's
           own view came from: "sys", "prometheus URL" or null)}.
``raw/<stage_id>/failfast.json`` ({reason, started}) is written by the orchestrator when it
did not start the stage (its clients refused at the barrier: started false) or stopped it
early (a fail-fast rule, `tasks.analysis.failfast`, or the broker gone); the stage is then
invalid.
"""

from __future__ import annotations

import csv
import io
import json
import os
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

COUNTER_COLUMNS = (
    "second", "published", "acked", "received", "lost", "duplicated", "out_of_order",
    "errors", "inflight_full", "connects_ok", "connects_failed", "delay_overruns",
)
HISTOGRAM_COLUMNS = ("second", "kind", "bucket", "count")
HISTOGRAM_KINDS = ("e2e", "pub_ack", "connect", "subscribe", "pub_delay")
SAMPLER_COLUMNS = ("second", "cpu_pct", "rss_bytes", "cpu_user_pct", "cpu_sys_pct", "processes",
                   "threads", "open_files", "ctx_switches_per_s")
HOST_COLUMNS = ("second", "cpu_pct", "cpus", "mem_used_bytes", "net_rx_bytes_per_s",
                "net_tx_bytes_per_s", "pace_ns", "steal_pct")
# headers of host.csv files from before pace_ns, and from before steal_pct
HOST_COLUMNS_BEFORE = tuple(HOST_COLUMNS[:HOST_COLUMNS.index(added)]
                            for added in ("pace_ns", "steal_pct"))
STATS_COLUMNS = ("second", "cpu_pct", "rss_bytes", "connections", "backlog", "delivered_per_s")
DELAY_OVERRUN_US = 1000


def overrun_after_us(tick_us: int) -> int:
    """How late a send is an overrun: DELAY_OVERRUN_US past the lateness a tick makes by
    design (a message due just after a tick's run waits for the next one)."""
    return DELAY_OVERRUN_US + tick_us

# Two hosts' clocks this close, beyond what reading them leaves uncertain, are trusted for
# a latency measured from one to the other (the receiver's clock less the sender's stamp):
# provisioning holds each host to the orchestrator's clock, the aggregation every pair.
CLOCK_TOLERANCE_S = 0.001


def clocks_agree(a: tuple[float, float], b: tuple[float, float] = (0.0, 0.0)) -> bool:
    """Whether two clocks, each (offset, uncertainty) in seconds off the orchestrator's
    (whose own is (0, 0)), agree within `CLOCK_TOLERANCE_S`."""
    return abs(a[0] - b[0]) <= CLOCK_TOLERANCE_S + a[1] + b[1]


COUNTERS_FILE = "counters.csv"
HISTOGRAMS_FILE = "histograms.csv"
EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"
SAMPLER_FILE = "broker.csv"
HOST_FILE = "host.csv"
STATS_FILE = "broker_stats.csv"
READY_FILE = "ready.json"
START_FILE = "start.json"
PROGRESS_FILE = "progress.json"
STAGE_FILE = "stage.json"
FAILFAST_FILE = "failfast.json"


def write_csv(path: Path, columns: Iterable[str], rows: Iterable[Iterable]) -> None:
    _replace_text(path, _csv_text([columns]), _csv_text(rows))


def write_json(path: Path, document: Mapping) -> None:
    _replace_text(path, _json_text(document))


def _csv_text(rows: Iterable[Iterable]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def _json_text(document: Mapping) -> str:
    return json.dumps(document, indent=1, sort_keys=True)


def _replace_text(path: Path, *parts: str) -> None:
    """`path` replaced whole by `parts` written one after another, atomically: a reader sees
    the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as handle:
        for part in parts:
            handle.write(part)
    os.replace(tmp, path)


def _append_text(path: Path, header: str, text: str) -> None:
    with open(path, "a", newline="") as handle:
        if handle.tell() == 0:
            handle.write(header)
        handle.write(text)


_STOP = object()


class FileThread:
    """Runs file writes one after another on a thread of their own, so a write the kernel
    holds up never stops the caller: the driver's measuring loop, which would send late and
    read late for as long. A busy disk does hold small writes up: a small file written and
    renamed and 20 lines appended took 0.7 ms at the median and 0.63 s at worst on a 2-core
    VM (ext4) while another process wrote 3 GB with fsync. Callers format their text; the
    thread only opens, writes and renames, calls that release the GIL while they wait.

    Writes run in the order given. `put` never raises (it runs in signal handlers and
    paho callbacks too); a write that failed is told by `failed`, `wait` or `stop`, each
    giving the first error not told yet, at a point of the caller's choosing."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="raw-files", daemon=True)
        self._thread.start()

    def put(self, write: Callable[..., object], *args: object) -> None:
        self._queue.put((write, args))

    def failed(self) -> BaseException | None:
        """The first write that failed and was not told yet, without waiting."""
        with self._lock:
            error, self._error = self._error, None
        return error

    def wait(self) -> BaseException | None:
        """Return when every write put so far is done, with `failed`."""
        if self._thread.is_alive():  # not after `stop`: nothing would ever be done
            done = threading.Event()
            self._queue.put((done.set, ()))
            done.wait()
        return self.failed()

    def stop(self, timeout_s: float | None = None) -> BaseException | None:
        """Every write put so far done (or `timeout_s` passed), then the thread ends."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        return self.failed()

    def _work(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            write, args = item
            try:
                write(*args)
            except Exception as exc:  # noqa: BLE001 - told by failed, wait or stop
                with self._lock:
                    self._error = self._error or exc


class RawWriter:
    """Writes one driver process's raw files into its directory, through a `FileThread`:
    the data is copied and formatted by the caller and written behind it; `summary` (the
    file that marks a process complete) is written after everything before it, and `close`
    ends the thread, `summary` or not."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._events = open(self.out_dir / EVENTS_FILE, "a")
        self._files = FileThread()

    def failed(self) -> BaseException | None:
        """`FileThread.failed`: the first write that failed and was not told yet."""
        return self._files.failed()

    def wait(self) -> BaseException | None:
        """`FileThread.wait`: every write so far done, then `failed`."""
        return self._files.wait()

    def event(self, record: Mapping) -> None:
        self._files.put(self._events.write, json.dumps(record, sort_keys=True) + "\n")

    def progress(self, document: Mapping) -> None:
        """``progress.json`` replaced with `document`."""
        self._files.put(_replace_text, self.out_dir / PROGRESS_FILE, _json_text(document))

    def counters(self, per_second: Mapping[int, Mapping[str, int]], *,
                 append: bool = False) -> None:
        """Every second's counters (the file replaced whole), or with `append` only the
        seconds given, added to what the file holds (a checkpoint while the stage runs)."""
        rows = (
            [second] + [per_second[second].get(name, 0) for name in COUNTER_COLUMNS[1:]]
            for second in sorted(per_second)
        )
        self._csv(COUNTERS_FILE, COUNTER_COLUMNS, rows, append)

    def histograms(self, per_second: Mapping[tuple[int, str], Mapping[int, int]], *,
                   append: bool = False) -> None:
        """Like `counters`, for the sparse histograms of each (second, kind)."""
        rows = (
            (second, kind, bucket, count)
            for (second, kind) in sorted(per_second)
            for bucket, count in sorted(per_second[(second, kind)].items())
        )
        self._csv(HISTOGRAMS_FILE, HISTOGRAM_COLUMNS, rows, append)

    def _csv(self, name: str, columns: Iterable[str], rows: Iterable[Iterable],
             append: bool) -> None:
        header, body = _csv_text([columns]), _csv_text(rows)
        if append:
            self._files.put(_append_text, self.out_dir / name, header, body)
        else:
            self._files.put(_replace_text, self.out_dir / name, header, body)

    def summary(self, document: Mapping) -> None:
        """``summary.json``, once every write before it is done. A write that failed since
        the caller last asked (`failed`, `wait`) is not raised here: the summary is written
        all the same, and is the last file."""
        self.close()
        write_json(self.out_dir / SUMMARY_FILE, document)

    def close(self, timeout_s: float | None = None) -> BaseException | None:
        """Every write put so far done (or `timeout_s` passed), the thread ended and the
        events file closed; the first failed write not told yet. Safe to call again."""
        if self._events.closed:
            return None
        error = self._files.stop(timeout_s)
        self._events.close()
        return error

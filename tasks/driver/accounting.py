"""Per-second counters, per-second latency histograms and sequence tracking of one process.

Kept as plain lists so the hot paths (`tasks.driver.send`, `tasks.driver.receive`) can update them with a few
index operations per message: a counter row is a list indexed by the ``C_*`` constants, a
histogram is a dense list of bucket counts (`tasks.driver.histogram` bucketing) per
(second, kind); both are written sparse by `tasks.driver.output.RawWriter` at the end.

Seconds are integer Unix seconds of the moment the event was seen on this host.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from .histogram import SUB_BUCKET_BITS, bucket_of
from .output import COUNTER_COLUMNS, RawWriter
from .wire import HEADER

C = {name: i for i, name in enumerate(COUNTER_COLUMNS[1:])}
C_PUBLISHED, C_ACKED, C_RECEIVED, C_LOST = C["published"], C["acked"], C["received"], C["lost"]
C_DUPLICATED, C_OUT_OF_ORDER, C_ERRORS = C["duplicated"], C["out_of_order"], C["errors"]
C_INFLIGHT_FULL, C_CONNECTS_OK, C_CONNECTS_FAILED = (
    C["inflight_full"], C["connects_ok"], C["connects_failed"])
C_DELAY_OVERRUNS = C["delay_overruns"]

MAX_VALUE_US = (1 << 40) - 1  # ~12.7 days: larger values are clamped into the last bucket
N_BUCKETS = bucket_of(MAX_VALUE_US) + 1
MAX_GAP_TRACKED = 1 << 16  # a bigger sequence gap is counted as lost but not remembered
_ = SUB_BUCKET_BITS  # the fast paths inline bucket_of for 64 sub-buckets (6 bits)


class Track:
    """What one subscriber saw of one publisher: for loss, duplicates and reordering.

    The in-order case only sets ``last`` (the fast path inlines it); the distinct
    sequence numbers seen are ``last`` less the gaps still open.
    """

    __slots__ = ("last", "missing", "qos", "dups", "ooo", "untracked")

    def __init__(self, qos: int) -> None:
        self.last = 0
        self.missing: set[int] | None = None
        self.qos = qos  # QoS of the deliveries: min(publish QoS, subscription QoS)
        self.dups = 0
        self.ooo = 0
        self.untracked = 0  # lost in gaps too big to remember (MAX_GAP_TRACKED)

    @property
    def unique(self) -> int:
        return self.last - len(self.missing or ()) - self.untracked


class Accounting:
    """Counters, histograms and events of one driver process."""

    def __init__(self, writer: RawWriter, tag: int) -> None:
        self.writer = writer
        self.tag = tag
        self.rows: dict[int, list[int]] = {}
        self.hists: dict[tuple[int, str], list[int] | dict[int, int]] = {}
        self._dense: list[tuple[int, str]] = []  # keys whose histogram is still a list
        self.accepting = True  # False after the drain: late messages are not counted
        # deliveries whose end-to-end latency read negative (the receiver's clock behind
        # the sender's by more than the transit): counted in the histogram as 0 us
        self.e2e_before_sent = 0
        self.tracks: list[dict[int, Track]] = []  # one dict per subscriber, for the summary
        self._checkpointed: int | None = None  # seconds before this one are in the files

    def row(self, second: int) -> list[int]:
        """The counter row of a second, created on first use."""
        row = self.rows.get(second)
        if row is None:
            row = self.rows[second] = [0] * len(C)
        return row

    def hist(self, second: int, kind: str) -> list[int]:
        """The dense bucket list of a (second, kind), created on first use."""
        key = (second, kind)
        hist = self.hists.get(key)
        if hist is None:
            hist = self.hists[key] = [0] * N_BUCKETS
            self._dense.append(key)
        elif isinstance(hist, dict):  # rolled already: a late event for an old second
            dense = [0] * N_BUCKETS
            for bucket, count in hist.items():
                dense[bucket] = count
            hist = self.hists[key] = dense
            self._dense.append(key)
        return hist

    def roll(self, second: int) -> None:
        """Turn histograms of seconds before `second` - 1 from dense lists into sparse dicts.

        A dense list is 18 KB: one per kind and second would cost ~130 MB over an hour.
        """
        keep = []
        for key in self._dense:
            counts = self.hists[key]
            if key[0] < second - 1 and isinstance(counts, list):
                self.hists[key] = {i: c for i, c in enumerate(counts) if c}
            else:
                keep.append(key)
        self._dense = keep

    def count(self, column: int, n: int = 1, now_ns: int | None = None) -> None:
        second = (now_ns if now_ns is not None else time.time_ns()) // 1_000_000_000
        self.row(second)[column] += n

    def observe(self, kind: str, value_us: int, now_ns: int) -> None:
        value = min(max(int(value_us), 0), MAX_VALUE_US)
        self.hist(now_ns // 1_000_000_000, kind)[bucket_of(value)] += 1

    def event(self, kind: str, client_id: str | None = None, **fields) -> None:
        record = {"t": time.time(), "event": kind, **fields}
        if client_id is not None:
            record["client_id"] = client_id
        self.writer.event(record)

    def deliver(self, tracks: dict[int, Track], payload: bytes, qos: int, now_ns: int) -> None:
        """One message received through paho (before the fast path owns the socket).

        The fast path inlines the same logic (`tasks.driver.receive.Reader.parse`).
        """
        if not self.accepting:
            return
        if len(payload) < HEADER.size:
            return  # not one of ours: somebody's message on the stage's topics
        tag, publisher, seq, intended_us, _sent = HEADER.unpack_from(payload)
        if tag != self.tag:
            return  # a stray message from another run or stage
        row = self.row(now_ns // 1_000_000_000)
        row[C_RECEIVED] += 1
        latency = now_ns // 1000 - intended_us
        if latency < 0:
            self.e2e_before_sent += 1
        self.observe("e2e", latency, now_ns)
        track = tracks.get(publisher)
        if track is None:
            track = tracks[publisher] = Track(qos)
        lost, dup, ooo = sequence(track, seq)
        row[C_LOST] += lost
        row[C_DUPLICATED] += dup
        row[C_OUT_OF_ORDER] += ooo

    # ---- output -------------------------------------------------------------------------
    def totals(self) -> dict[str, int]:
        return {name: sum(row[i] for row in self.rows.values()) for name, i in C.items()}

    def write(self) -> None:
        """Every second, the files replaced whole (at the end of the stage)."""
        self.writer.counters({s: dict(zip(C, row)) for s, row in self.rows.items()})
        self.writer.histograms(sparse(self.hists))

    def checkpoint(self, second: int) -> None:
        """Append the seconds before `second` - 1 not yet written, so a process killed
        mid-stage leaves the seconds it measured; `write` replaces the files at the end.

        A late event for a second already appended is in `write`'s files only; a
        reader that sums rows by second and bucket (the Spark job) reads a checkpointed
        file right either way."""
        start = self._checkpointed if self._checkpointed is not None else min(
            self.rows, default=second)
        end = second - 1
        if end <= start:
            return
        seconds = range(start, end)
        self.writer.counters({s: dict(zip(C, self.rows[s])) for s in seconds if s in self.rows},
                             append=True)
        self.writer.histograms(sparse({k: h for k, h in self.hists.items()
                                       if start <= k[0] < end}), append=True)
        self._checkpointed = end

    def judgement(self) -> dict:
        """Loss and duplicates per delivery QoS, judged against what that QoS promises.

        QoS 0 may lose and QoS 1 may duplicate without breaking a promise; a message still
        missing at the end under QoS 1/2, or a duplicate under QoS 2, is a violation.
        """
        by_qos = {str(q): {"unique": 0, "missing": 0, "duplicated": 0, "out_of_order": 0}
                  for q in (0, 1, 2)}
        anomalies = []
        for sub_index, tracks in enumerate(self.tracks):
            for publisher, track in tracks.items():
                missing = len(track.missing or ())
                entry = by_qos[str(track.qos)]
                entry["unique"] += track.unique
                entry["missing"] += missing
                entry["duplicated"] += track.dups
                entry["out_of_order"] += track.ooo
                if (missing or track.dups or track.ooo) and len(anomalies) < 100:
                    anomalies.append({"subscriber": sub_index, "publisher": publisher,
                                      "qos": track.qos, "missing": missing,
                                      "duplicated": track.dups, "out_of_order": track.ooo})
        violations = (by_qos["1"]["missing"] + by_qos["2"]["missing"]
                      + by_qos["2"]["duplicated"])
        return {"by_qos": by_qos, "violations": violations, "publishers_with_anomalies":
                anomalies}


def sequence(track: Track, seq: int) -> tuple[int, int, int]:
    """Update a track with one sequence number: (newly lost, duplicated, out of order)."""
    last = track.last
    if seq == last + 1:
        track.last = seq
        return 0, 0, 0
    if seq > last:
        gap = seq - last - 1
        if gap <= MAX_GAP_TRACKED:
            if track.missing is None:
                track.missing = set()
            track.missing.update(range(last + 1, seq))
        else:
            track.untracked += gap
        track.last = seq
        return gap, 0, 0
    if track.missing and seq in track.missing:
        track.missing.discard(seq)
        track.ooo += 1
        return 0, 0, 1
    track.dups += 1
    return 0, 1, 0


def sparse(hists: Mapping[tuple[int, str], list[int] | dict[int, int]]
           ) -> dict[tuple[int, str], dict[int, int]]:
    """Dense bucket lists (or already sparse dicts) -> {bucket: count} without the zeros."""
    return {key: (counts if isinstance(counts, dict) else
                  {i: c for i, c in enumerate(counts) if c}) for key, counts in hists.items()}

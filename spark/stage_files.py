"""The small files of a run's raw output, read and checked on the Spark driver: each
stage's ``stage.json``, every process's ``summary.json``, the broker sampler's per-second
rows (one row a second from one host: `read_samples`), and whether every CSV the job will
scan is there and whole.

A listed process without summary.json, a missing/empty/truncated CSV or a driver that
reported an error makes the stage "incomplete"; a stage on several hosts one of whose
clocks provisioning did not trust (`clock_trusted` in hosts/<host>.json: its latency from
one host's publishers to another's subscribers carries the clocks' difference) or broker
samples that are missing is a problem line. Every reason is a "problems" line of the
stage. Plain Python: no Spark here.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from tasks.driver.output import (
    COUNTERS_FILE,
    HISTOGRAMS_FILE,
    HOST_COLUMNS,
    HOST_COLUMNS_BEFORE,
    HOST_FILE,
    SAMPLER_COLUMNS,
    SAMPLER_FILE,
    STAGE_FILE,
    STATS_COLUMNS,
    STATS_FILE,
    SUMMARY_FILE,
    clocks_agree,
)
from tasks.manifest import changed_since
from tasks.rundir import HOSTS_DIR, MANIFEST, RAW_DIR
from tasks.rundir import SAMPLER as SAMPLER_DIR

_BAD_DRIVER_STATUS = ("error", "no_start")


@dataclass
class StageFiles:
    """One stage's inputs as found on disk, and what is wrong with them."""

    stage_id: str
    doc: dict = field(default_factory=dict)
    window: tuple[int, int] | None = None
    problems: list[tuple[bool, str]] = field(default_factory=list)  # (notice only, text)
    incomplete: bool = False
    summaries: list[dict] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    files: dict[str, list[Path]] = field(default_factory=dict)  # counters/histograms
    labels: dict[str, str] = field(default_factory=dict)  # resolved file path -> "host/proc"
    # the broker sampler's rows inside the measure window: "broker" (its processes),
    # "host" (its host), "stats" (its own view); column -> number or None
    samples: dict[str, list[dict]] = field(default_factory=dict)

    def problem(self, text: str, incomplete: bool = False, notice: bool = True) -> None:
        """Record a problem; `incomplete` ones (and status-setting ones) are listed first."""
        self.problems.append((notice and not incomplete, text))
        self.incomplete = self.incomplete or incomplete

    def problem_list(self) -> list[str]:
        return [text for _, text in sorted(self.problems, key=lambda p: p[0])]


def _read_json(path: Path) -> dict:
    document = json.loads(path.read_text())
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


def _window_of(doc: dict) -> tuple[int, int] | None:
    windows = doc.get("windows") or {}
    try:
        return int(windows["measure_start"]), int(windows["measure_end"])
    except (KeyError, TypeError, ValueError):
        return None


def _process_dirs(stage_dir: Path) -> set[tuple[str, str]]:
    return {
        (host.name, proc.name)
        for host in stage_dir.iterdir() if host.is_dir()
        for proc in host.iterdir() if proc.is_dir() and proc.name != SAMPLER_DIR
    }


def _listed_processes(stage: StageFiles) -> set[tuple[str, str]]:
    listed = stage.doc.get("processes") or []
    return {(str(p["host"]), str(p["proc"])) for p in listed if isinstance(p, dict)}


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if not size:
            return b""
        handle.seek(size - 1)
        return handle.read(1)


def _check_csv(stage: StageFiles, kind: str, path: Path, label: str) -> None:
    """Queue a CSV for Spark if it exists; flag it if it is empty or lacks a final newline."""
    name = path.name
    if not path.is_file():
        stage.problem(f"missing {name} in {label}", incomplete=True)
        return
    if _last_byte(path) != b"\n":
        stage.problem(f"truncated {name} in {label}: no final newline", incomplete=True)
    stage.files.setdefault(kind, []).append(path)
    stage.labels[str(path.resolve())] = label


def _check_summary(stage: StageFiles, summary: dict, label: str) -> None:
    status = summary.get("status")
    if status != "ok":
        stage.problem(f"process {label} reported status {status!r}",
                      incomplete=status in _BAD_DRIVER_STATUS)
    if stage.window and _window_of(summary) not in (None, stage.window):
        stage.problem(f"measure window of {label} {_window_of(summary)} differs from "
                      f"{STAGE_FILE} {stage.window}")


def _check_process(stage: StageFiles, stage_dir: Path, host: str, proc: str, listed: bool) -> None:
    label = f"{host}/{proc}"
    proc_dir = stage_dir / host / proc
    if not listed:  # a copy or a hand run in the run folder: its messages are no stage's
        stage.problem(f"unexpected process {label}: not listed in {STAGE_FILE}; its files "
                      "are left out")
        return
    try:
        summary = _read_json(proc_dir / SUMMARY_FILE)
    except FileNotFoundError:
        stage.problem(f"missing process {label}: no {SUMMARY_FILE}", incomplete=True)
        stage.missing.append(label)
        if not proc_dir.is_dir():
            return
    except (OSError, ValueError) as exc:
        stage.problem(f"unreadable {SUMMARY_FILE} in {label}: {exc}", incomplete=True)
        stage.missing.append(label)
    else:
        stage.summaries.append(summary)
        _check_summary(stage, summary, label)
    _check_csv(stage, "counters", proc_dir / COUNTERS_FILE, label)
    _check_csv(stage, "histograms", proc_dir / HISTOGRAMS_FILE, label)


# kind -> file, its columns, and the headers it had before (files written then still read)
SAMPLE_FILES = {"broker": (SAMPLER_FILE, SAMPLER_COLUMNS, ()),
                "host": (HOST_FILE, HOST_COLUMNS, HOST_COLUMNS_BEFORE),
                "stats": (STATS_FILE, STATS_COLUMNS, ())}


def _number(text: str) -> float | None:
    """A CSV cell's number; None when empty, not a number, or not finite (a Prometheus
    +Inf: one such cell made the run's stage_metrics.json unwritable)."""
    try:
        value = float(text) if text != "" else None
    except ValueError:
        return None
    return value if value is None or math.isfinite(value) else None


def read_samples(path: Path, columns: tuple[str, ...], window: tuple[int, int],
                 before: tuple[tuple[str, ...], ...] = ()) -> list[dict]:
    """The rows of a sampler CSV inside [start, end): column -> float, or None where empty.
    A file with one of the `before` headers (the contract's, before its last columns were
    added) reads too, the missing columns as None. Raises ValueError on any other header."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    header = tuple(rows[0]) if rows else ()
    if header != columns and header not in before:
        raise ValueError(f"header is not {','.join(columns)}")
    start, end = window
    out = []
    for row in rows[1:]:
        if len(row) == len(header) and (second := _number(row[0])) is not None \
                and start <= second < end:
            values = dict(zip(header, row))
            out.append({c: _number(values[c]) if c in values else None for c in columns})
    return out


def sample_values(rows: list[dict], column: str) -> list[float]:
    """`column`'s values in rows `read_samples` gave, its empty cells left out."""
    return [r[column] for r in rows if r.get(column) is not None]


def _check_samples(stage: StageFiles, stage_dir: Path) -> None:
    """The broker sampler's files named by stage.json's ``sampler`` (processes, host, stats)."""
    host = stage.doc.get("broker_host")
    if not host:
        stage.problem("no broker samples: broker_host is null in stage.json")
        return
    sampled = stage.doc.get("sampler") or {"processes": True}
    wanted = {"broker": sampled.get("processes"), "host": sampled.get("host"),
              "stats": sampled.get("stats")}
    for kind, (name, columns, before) in SAMPLE_FILES.items():
        if not wanted[kind] or stage.window is None:
            continue
        path = stage_dir / str(host) / SAMPLER_DIR / name
        try:
            stage.samples[kind] = read_samples(path, columns, stage.window, before)
        except FileNotFoundError:
            stage.problem(f"no {name} from the broker sampler on {host} ({kind}: "
                          f"{wanted[kind]})")
        except (OSError, ValueError) as exc:
            stage.problem(f"unreadable {name} on {host}: {exc}")


def load_stage(raw_dir: Path, stage_id: str) -> StageFiles:
    """Read stage.json and every summary.json of a stage; list the CSVs for Spark."""
    stage, stage_dir = StageFiles(stage_id), raw_dir / stage_id
    if not stage_dir.is_dir():
        stage.problem(f"no stage directory {stage_dir}", incomplete=True)
        return stage
    try:
        stage.doc = _read_json(stage_dir / STAGE_FILE)
    except (OSError, ValueError) as exc:
        stage.problem(f"unreadable {STAGE_FILE}: {exc}", incomplete=True)
    stage.window = _window_of(stage.doc)
    if stage.window is None:
        stage.problem(f"no measure window in {STAGE_FILE}", incomplete=True)
    listed = _listed_processes(stage)
    for host, proc in sorted(listed | _process_dirs(stage_dir)):
        # a stage.json that lists none (unreadable, said above): every folder is read
        _check_process(stage, stage_dir, host, proc, not listed or (host, proc) in listed)
    _check_samples(stage, stage_dir)
    return stage


def _check_manifest(stage: StageFiles, run_dir: Path, files: dict[str, dict]) -> None:
    """The stage's files are what the collect step saw (`tasks.manifest`)."""
    for line in changed_since(run_dir, files, f"{RAW_DIR}/{stage.stage_id}/"):
        stage.problem(line, incomplete=True)


def _check_clocks(stage: StageFiles, clocks: dict[str, dict]) -> None:
    """A stage whose processes ran on several hosts, one of whose clocks provisioning did
    not trust against the orchestrator's (`clocks`: host -> its hosts/<host>.json), or two
    of whose clocks disagree with each other though each passed (1.6 ms either side of the
    orchestrator's, say), says so: a message's latency from one host to another is the
    receiver's clock less the sender's stamp."""
    hosts = sorted({str(s.get("host")) for s in stage.summaries if s.get("host")})
    if len(hosts) < 2:
        return
    read = {h: (c["clock_offset_s"], c.get("clock_uncertainty_s") or 0.0) for h in hosts
            if isinstance((c := clocks.get(h) or {}).get("clock_offset_s"), (int, float))}
    untrusted = [h for h in hosts if (clocks.get(h) or {}).get("clock_trusted") is False]
    each = sorted(h for h in read if h not in untrusted)  # each trusted on its own
    apart = [(abs(read[a][0] - read[b][0]), a, b) for i, a in enumerate(each)
             for b in each[i + 1:] if not clocks_agree(read[a], read[b])]
    if not untrusted and not apart:
        return
    named = sorted({*untrusted, *(h for _, a, b in apart for h in (a, b))})
    offsets = ", ".join(f"{h} {1000 * read[h][0]:+.3f} ms (+-{1000 * read[h][1]:.3f} ms)"
                        for h in named if h in read)
    worst = max(apart, default=None)
    between = f", {worst[1]} and {worst[2]} {1000 * worst[0]:.3f} ms apart" if worst else ""
    stage.problem(f"clocks not trusted for latency across hosts: {offsets} off the "
                  f"orchestrator's{between}; synchronise them (chrony, NTP) or keep each "
                  f"stage's clients on one host")


def _check_before_sent(stage: StageFiles) -> None:
    """Deliveries received before they were sent, by the hosts' clocks (the driver counts
    them as 0 us): a receiver's clock behind a sender's, though within the tolerance the
    clock check allows; the stage's e2e latency reads low, and says so."""
    early = sum(int(s.get("e2e_before_sent") or 0) for s in stage.summaries)
    if early:
        received = sum(int((s.get("totals") or {}).get("received") or 0) for s in stage.summaries)
        stage.problem(f"{early:,} of {received:,} deliveries were received before they were "
                      "sent by the hosts' clocks (counted as 0 us): a receiving host's clock "
                      "is behind a sending host's, so e2e latency reads low; synchronise them "
                      "(chrony, NTP) or keep each stage's clients on one host")


def _recorded_clocks(run_dir: Path) -> dict[str, dict]:
    """host -> its fingerprint as provisioning recorded it (hosts/<host>.json), where the
    run folder has one (a raw folder aggregated by hand may not)."""
    clocks = {}
    for path in sorted((run_dir / HOSTS_DIR).glob("*.json")):
        try:
            clocks[path.stem] = _read_json(path)
        except (OSError, ValueError):
            continue  # provisioning's own record: a cut one tells nothing of its clock
    return clocks


def discover(run_dir: Path, wanted: list[str] | None) -> list[StageFiles]:
    """Every stage's files (or the `wanted` ones'), checked against the manifest when the
    run was collected (a raw folder aggregated by hand may have none), and against the
    clocks provisioning recorded."""
    raw_dir = run_dir / RAW_DIR
    found = sorted(p.name for p in raw_dir.iterdir() if p.is_dir()) if raw_dir.is_dir() else []
    manifest = run_dir / MANIFEST
    files = _read_json(manifest)["files"] if manifest.is_file() else None
    stages = [load_stage(raw_dir, stage_id) for stage_id in sorted(set(wanted or found))]
    for stage in stages if files is not None else []:
        _check_manifest(stage, run_dir, files)
    clocks = _recorded_clocks(run_dir)
    for stage in stages:
        _check_clocks(stage, clocks)
        _check_before_sent(stage)
    return stages

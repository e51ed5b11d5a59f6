"""What /proc says about a broker's processes and about the host: the sampler's readings.

Standard library only (this module ships to hosts). A broker is found without being told
its pid in one of these ways (`find_processes`), resolved again every second so a process
that starts later (a JVM's helper, a restarted broker) is counted from then on:

  pid        that process and every descendant (a broker perfpipe started: its pid)
  session    every process of that session id (a process group perfpipe launched)
  pid_file   the pid written in that file, and its descendants
  unit       every process in that systemd unit's cgroup (cgroup v2), or its MainPID and
             descendants when the cgroup cannot be read
  match      every process whose command line matches this regular expression

A reading sums every found process: CPU time, RSS, threads, open files (None when
/proc/PID/fd cannot be read: another user's process without root) and context switches
(voluntary + involuntary). CPU time is the nanoseconds on a CPU that the scheduler counts
for every thread (/proc/PID/task/TID/schedstat), where the kernel has it: /proc/PID/stat
counts in clock ticks (1/100 s), so a broker at 7% of a core would be read to +-14% each
second; the user/system split still comes from the ticks.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")
WAYS = ("pid", "session", "pid_file", "unit", "match")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    session: int
    user_ticks: int
    sys_ticks: int
    threads: int


def stat(pid: int) -> ProcStat | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return ProcStat(pid, int(fields[1]), int(fields[3]), int(fields[11]), int(fields[12]),
                    int(fields[17]))


def all_stats() -> dict[int, ProcStat]:
    found = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (st := stat(int(entry.name))) is not None:
            found[st.pid] = st
    return found


def descendants(root: int, stats: dict[int, ProcStat]) -> set[int]:
    """`root` and every process below it (nothing when root is gone)."""
    if root not in stats:
        return set()
    children: dict[int, list[int]] = {}
    for st in stats.values():
        children.setdefault(st.ppid, []).append(st.pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _read_pid(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _unit_property(unit: str, name: str) -> str:
    """One property of a systemd unit ("" when systemctl is missing or fails)."""
    try:
        return subprocess.run(["systemctl", "show", "-p", name, "--value", unit],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _unit_cgroup(unit: str) -> Path | None:
    out = _unit_property(unit, "ControlGroup")
    return Path("/sys/fs/cgroup") / out.lstrip("/") if out else None


def _unit_main_pid(unit: str) -> int | None:
    out = _unit_property(unit, "MainPID")
    return int(out) if out.isdigit() and out != "0" else None


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return ""


class ProcessFinder:
    """The broker's processes, found one of the ways in WAYS (module docstring)."""

    def __init__(self, way: str, value: str) -> None:
        if way not in WAYS:
            raise ValueError(f"finding processes by {way!r}: use one of {', '.join(WAYS)}")
        self.way, self.value = way, value
        self.pattern = re.compile(value) if way == "match" else None
        self.cgroup = _unit_cgroup(value) if way == "unit" else None
        self.me = os.getpid()

    def describe(self) -> str:
        return f"{self.way} {self.value}"

    def find(self, stats: dict[int, ProcStat]) -> set[int]:
        if self.way == "pid":
            return descendants(int(self.value), stats)
        if self.way == "session":
            return {st.pid for st in stats.values() if st.session == int(self.value)}
        if self.way == "pid_file":
            pid = _read_pid(self.value)
            return descendants(pid, stats) if pid else set()
        if self.way == "unit":
            if self.cgroup is not None:
                try:
                    return {int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()
                            if int(p) in stats}
                except (OSError, ValueError):
                    pass
            pid = _unit_main_pid(self.value)
            return descendants(pid, stats) if pid else set()
        return {pid for pid in stats if pid != self.me and self.pattern.search(_cmdline(pid))}


@dataclass(frozen=True)
class ProcessReading:
    """One snapshot of the found processes, summed."""

    ticks: dict[int, tuple[int, int]]  # pid -> (user, system) CPU ticks
    cpu_ns: dict[int, int | None]  # pid -> nanoseconds its threads spent on a CPU (schedstat)
    rss_bytes: int
    threads: int
    open_files: int | None
    ctx_switches: dict[int, int]  # pid -> voluntary + involuntary switches so far


def _rss(pid: int) -> int:
    try:
        return int((PROC / str(pid) / "statm").read_text().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(PROC / str(pid) / "fd"))
    except OSError:
        return None


def _cpu_ns(pid: int) -> int | None:
    """Nanoseconds the process's threads spent on a CPU, or None without schedstat (a
    thread that ended takes its time with it: see `process_row`)."""
    total = 0
    try:
        tasks = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return None
    for tid in tasks:
        try:
            total += int((PROC / str(pid) / "task" / tid / "schedstat").read_text().split()[0])
        except FileNotFoundError:
            continue  # the thread ended since the listing
        except (OSError, ValueError, IndexError):
            return None
    return total


def _switches(pid: int) -> int:
    total = 0
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    except (OSError, ValueError):
        pass
    return total


def read_processes(pids: set[int], stats: dict[int, ProcStat]) -> ProcessReading:
    fds = [_fds(pid) for pid in pids]
    return ProcessReading(
        ticks={pid: (stats[pid].user_ticks, stats[pid].sys_ticks) for pid in pids},
        cpu_ns={pid: _cpu_ns(pid) for pid in pids},
        rss_bytes=sum(_rss(pid) for pid in pids),
        threads=sum(stats[pid].threads for pid in pids),
        open_files=None if None in fds else sum(fds),
        ctx_switches={pid: _switches(pid) for pid in pids})


def _pct_of_a_core(seconds: float) -> float:
    """What one tick of CPU time over `seconds` is, in % of one core."""
    return 100.0 / TICKS / max(seconds, 1e-6)


def process_row(before: ProcessReading, after: ProcessReading, seconds: float) -> dict:
    """The per-second figures between two readings: CPU over the processes present in both
    (% of one core), and the later reading's sizes."""
    both = before.ticks.keys() & after.ticks.keys()
    user = sum(after.ticks[p][0] - before.ticks[p][0] for p in both)
    system = sum(after.ticks[p][1] - before.ticks[p][1] for p in both)
    switches = sum(after.ctx_switches[p] - before.ctx_switches[p] for p in both)
    scale = _pct_of_a_core(seconds)
    cpu_pct = (user + system) * scale
    # the nanoseconds refine the ticks, where they agree to the ticks' own rounding (a
    # thread that ended takes its time out of schedstat, not out of the ticks)
    steady = [(before.cpu_ns[p], after.cpu_ns[p]) for p in both]
    if steady and all(b is not None and a is not None for b, a in steady):
        precise = 100.0 * sum(a - b for b, a in steady) / 1e9 / max(seconds, 1e-6)
        if abs(precise - cpu_pct) <= 2 * len(both) * scale:
            cpu_pct = precise
    return {"cpu_pct": round(cpu_pct, 2), "rss_bytes": after.rss_bytes,
            "cpu_user_pct": round(user * scale, 2), "cpu_sys_pct": round(system * scale, 2),
            "processes": len(after.ticks), "threads": after.threads,
            "open_files": after.open_files,
            "ctx_switches_per_s": round(switches / max(seconds, 1e-6), 1)}


# ---- the host ----------------------------------------------------------------------------
@dataclass(frozen=True)
class HostReading:
    busy_ticks: int
    steal_ticks: int
    mem_used_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int


def read_host() -> HostReading:
    """/proc/stat busy ticks of all CPUs (not idle, not iowait: steal included) and their
    steal ticks (the time a virtual CPU was ready to run and the hypervisor ran something else),
    MemTotal - MemAvailable, and the bytes every network interface but the loopback received
    and sent."""
    cpu = [int(v) for v in (PROC / "stat").read_text().splitlines()[0].split()[1:]]
    busy = sum(cpu[:8]) - cpu[3] - cpu[4]  # user nice system idle iowait irq softirq steal
    mem = {}
    for line in (PROC / "meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            mem[name] = int(rest.split()[0]) * 1024
    rx = tx = 0
    for line in (PROC / "net" / "dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() != "lo":
            fields = rest.split()
            rx, tx = rx + int(fields[0]), tx + int(fields[8])
    return HostReading(busy, cpu[7], mem.get("MemTotal", 0) - mem.get("MemAvailable", 0), rx, tx)


def cpus_ticks(cpus: set[int] | None = None) -> tuple[int, int]:
    """(idle, all) ticks in /proc/stat of `cpus` (every CPU when None or none of them is
    listed there): idle and iowait count as idle, steal as busy, as `read_host` counts."""
    idle = total = 0
    rows = {}
    for line in (PROC / "stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            rows[int(name[3:])] = [int(v) for v in fields[:8]]
    chosen = [rows[c] for c in cpus or () if c in rows] or list(rows.values())
    for ticks in chosen:
        idle, total = idle + ticks[3] + ticks[4], total + sum(ticks)
    return idle, total


def idle_pct(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """% of the CPUs' time they were idle between two `cpus_ticks` readings (None when no
    tick passed)."""
    ticks = after[1] - before[1]
    return round(100 * (after[0] - before[0]) / ticks, 1) if ticks > 0 else None


def host_row(before: HostReading, after: HostReading, seconds: float) -> dict:
    scale, seconds = _pct_of_a_core(seconds), max(seconds, 1e-6)
    return {"cpu_pct": round((after.busy_ticks - before.busy_ticks) * scale, 2),
            "steal_pct": round((after.steal_ticks - before.steal_ticks) * scale, 2),
            "cpus": os.cpu_count(), "mem_used_bytes": after.mem_used_bytes,
            "net_rx_bytes_per_s": round((after.net_rx_bytes - before.net_rx_bytes) / seconds),
            "net_tx_bytes_per_s": round((after.net_tx_bytes - before.net_tx_bytes) / seconds)}

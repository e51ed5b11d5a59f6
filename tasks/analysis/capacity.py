"""What a capacity answer says of its limit: pure.

A max-rate search's answer (`max_rate`) is the broker's capacity when the broker ran out
of CPU. It falls behind for other reasons too: a lock, the disk, the network, or, on a
small shared host, a scheduler that lets the broker sleep and wakes it for a few messages
at a time. On this repository's 2-vCPU machine, with its publishers writing once a
message, that last regime gave Mosquitto answers 15-34% below its nights that used the
CPU up, about one unpinned night in six (on the host of 2026-12-01, every one), the
broker at 67-86% of its one core and the host at 75-95% of its two; on the fan-in
search's 1 ms tick, 1 of 9 (bench/README.md, bench_capacity.py). The detector judges
`max_rate` as measured: a broker that sleeps for reasons of its own (a new lock) looks
the same, so CPU cannot be its covariate. The verdict says it instead (`cpu_to_spare`),
so whoever reads a `suspected` capacity knows the broker had CPU left at the rate that
held, just below the one it could not pass.

Where the broker's processes were not found on a host of its own, its CPU is the host's
(`spark/stage_metrics.py`), which may read above 100% of the cores a broker can use: an
upper bound, so it never says CPU to spare where there was none.
"""

from __future__ import annotations

# Of the cores the broker's work can use (`broker_cores`), and of its host's: at or above
# either, over the hold that confirmed the answer, the broker's CPU was the limit. On the
# machine above, nights that used its CPU up had the broker at 92-95% of its core (87-91%
# with it kept on one CPU, the rest of that CPU the kernel's network work for it) and the
# host at 97-100% of its two; nights with CPU to spare, the broker at 67-86% and the host
# at 75-94%. The two ranges meet at 86-87%: the broker's line sits under every night that
# used the CPU up, so a note is never false for that reason, at the price of a spare night
# at 85-86% going without one (the highest measured was 86%). On the fan-in search's 1 ms
# tick, nights that used it up had the broker at 91-99% and the host at 74-85%: there the
# broker's line decides alone.
BROKER_USED_UP_PCT = 85.0
HOST_USED_UP_PCT = 95.0


def cpu_used_pct(cpu_pct: float | None, cores: int | None) -> float | None:
    """`cpu_pct` (% of one core) as % of `cores` cores; None when either is not known."""
    if cpu_pct is None or not cores:
        return None
    return round(cpu_pct / cores, 1)


def broker_cores(adapter_cores: int | None, host_cores: int | None,
                 kept_on: int | None = None) -> int | None:
    """The cores a broker's work can keep busy on its host: its adapter's limit (one event
    loop: 1), the CPUs it was kept on (`broker.cpus`) and the host's, the least of them;
    None when none is known."""
    known = [n for n in (adapter_cores, kept_on, host_cores) if n]
    return min(known) if known else None


def cpu_to_spare(metrics: dict) -> dict | None:
    """{"broker_pct", "host_pct"} when a search's answer came with CPU to spare: over the
    hold that confirmed it, the broker under `BROKER_USED_UP_PCT` of the cores it can use
    and its host under `HOST_USED_UP_PCT` of its own (`metrics`: the search stage's, with
    `broker_cpu_used_pct` and `host_cpu_used_pct`); None when either was used up or is not
    known (a host shared with others may have been full)."""
    broker, host = metrics.get("broker_cpu_used_pct"), metrics.get("host_cpu_used_pct")
    if broker is None or host is None:
        return None
    if broker >= BROKER_USED_UP_PCT or host >= HOST_USED_UP_PCT:
        return None
    return {"broker_pct": broker, "host_pct": host}

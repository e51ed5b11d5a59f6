"""Which CPUs a process perfpipe starts may run on (`broker.cpus`): pure.

Where the broker shares its host with perfpipe's drivers (the embedded default), the
kernel decides where each runs, and on a small host that is much of what a capacity
search measures. On this repository's 2-vCPU machine, on one host, Mosquitto beside its
drivers never used its core up at its answer (105K-140K msg/s, 7.4% night to night); kept
on one CPU with the drivers on the other it did (167K-174K, 0.9%; bench/README.md,
bench_capacity.py). `broker.cpus` keeps a broker perfpipe starts on the CPUs it names
and perfpipe's own processes on its host (drivers, the sampler) on the others, through
`taskset`; the broker step reads the broker's back from /proc.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# A CPU list as `taskset -c` takes it and /proc/PID/status writes it: '0', '0-3', '0,2-3'
CPU_LIST = r"^\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*$"


def parse(cpus: str) -> frozenset[int]:
    """'0,2-3' -> {0, 2, 3}; ValueError for anything else (a range that runs backwards)."""
    if not re.fullmatch(CPU_LIST, cpus):
        raise ValueError(f"{cpus!r} is not a CPU list like '0' or '0-1,3'")
    out: set[int] = set()
    for part in cpus.split(","):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if high < low:
            raise ValueError(f"{cpus!r}: the range {part} runs backwards")
        out.update(range(low, high + 1))
    return frozenset(out)


def as_list(cpus: Iterable[int]) -> str:
    """{0, 2, 3} -> '0,2-3': the shortest CPU list; '' for none."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def others(cpus: str, host_cpus: int) -> str:
    """The CPUs of a host of `host_cpus` that `cpus` leaves, as a list ('' for none)."""
    return as_list(set(range(host_cpus)) - parse(cpus))


def check_fits(cpus: str, host: str, host_cpus: int, drivers_there: bool) -> None:
    """ValueError naming `broker.cpus` and the fix when `cpus` names a CPU the broker's
    host does not have, or leaves none for the drivers that run there."""
    asked, has = parse(cpus), as_list(range(host_cpus))
    if not asked <= set(range(host_cpus)):
        raise ValueError(f"broker.cpus: {cpus!r} names CPUs {host} does not have (it has "
                         f"{host_cpus}: {has}); name some of {has}")
    if drivers_there and not others(cpus, host_cpus):
        raise ValueError(f"broker.cpus: {cpus!r} leaves no CPU of {host} ({has}) for the "
                         f"driver processes that run there; leave one or more out")


def pinned(argv: Sequence[str], cpus: str | None) -> list[str]:
    """`argv` run on `cpus` (through taskset, which every process it starts inherits);
    as it is without them."""
    return ["taskset", "-c", cpus, *argv] if cpus else list(argv)


def allowed(status: str) -> frozenset[int]:
    """The CPUs a process may run on, from the text of its /proc/PID/status."""
    found = re.search(r"^Cpus_allowed_list:\s*(\S+)\s*$", status, re.MULTILINE)
    if found is None:
        raise ValueError("no Cpus_allowed_list in the process's status")
    return parse(found.group(1))

"""Which CPUs a process perfpipe starts may run on (`broker.cpus`): pure.

Where the broker shares its host with perfpipe's drivers (the embedded default), the
kernel decides where each runs, and on a small host that is much of what a capacity
search measures. On this repository's 2-vCPU machine, with its publishers writing once a
message, Mosquitto beside its drivers used its core up at its answer on 1 of 20 valid
fan-in nights (the others 94K-140K msg/s); kept on one CPU with the drivers on the other,
on all 10 (167K-178K), but the drivers used theirs up too, and such a search is invalid
(`tasks.analysis.validity.driver_limit`). On the fan-in search's 1 ms tick the broker used
its core up on 11 of 12 valid nights unpinned (151.9K-189.3K) and on all 12 pinned
(165.4K-190.0K, 1.5-1.6% night to night in two runs), the drivers at 56-76% of their CPU
(bench/README.md, bench_capacity.py). `broker.cpus` keeps a broker perfpipe starts on the
CPUs it names and perfpipe's own processes on its host (drivers, the sampler) on the
others, through `taskset`; the broker step reads the broker's back from /proc, or, for
the searches only (`cpus_for: capacity`), the stages step moves it there and back
(`tasks.brokers.affinity`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# A CPU list as `taskset -c` takes it and /proc/PID/status writes it: '0', '0-3', '0,2-3'
CPU_LIST = r"^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$"


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


def others(cpus: str, usable: Iterable[int]) -> str:
    """The CPUs of `usable` (a host's, as `allowed` reads them) that `cpus` leaves, as a
    list ('' for none)."""
    return as_list(set(usable) - parse(cpus))


def check_fits(cpus: str, host: str, usable: Iterable[int], drivers_there: bool) -> None:
    """ValueError naming `broker.cpus` and the fix when `cpus` names a CPU that processes
    started on the broker's host may not use (`usable`: offline, or outside its cpuset), or
    leaves none for the drivers that run there."""
    asked, usable = parse(cpus), frozenset(usable)
    has = as_list(usable)
    if not asked <= usable:
        raise ValueError(f"broker.cpus: {cpus!r} names CPUs {host} does not let perfpipe use "
                         f"(it may use {has}); name some of {has}")
    if drivers_there and not others(cpus, usable):
        raise ValueError(f"broker.cpus: {cpus!r} leaves no CPU of {host} ({has}) for the "
                         f"driver processes that run there; leave one or more out")


# For which stages `broker.cpus` keeps the broker on its CPUs (`broker.cpus_for`): every
# stage (the broker started there), or a max-rate search's probes and holds only (the
# broker started anywhere, kept on them for each search and let go after it). On this
# repository's 2-vCPU machine the fan-in search pinned spread 1.5-1.6% night to night
# against 2.8-5.3% unpinned, while the rated stages of the smoke suite pinned cost the
# broker 38-65% more a message and spread 8.5-32% against 5.1-9.3%; but pinned for the
# searches only, within the nightly suite, the QoS 1 searches' drivers used up the one CPU
# left them on 3 of 8 search-nights (bench/README.md, real_nights.py --cpus-for capacity).
CPUS_FOR = ("all", "capacity")


def kept_on(cpus: str | None, cpus_for: str, search: bool) -> str | None:
    """The CPUs the broker is kept on during a stage (`search`: a max-rate search's probe
    or hold), given `broker.cpus` and `broker.cpus_for`; None where it may run anywhere."""
    if cpus_for not in CPUS_FOR:
        raise ValueError(f"broker.cpus_for: {cpus_for!r} is not one of {', '.join(CPUS_FOR)}")
    return cpus if cpus and (search or cpus_for == "all") else None


def searches_only(cpus: str | None, cpus_for: str) -> bool:
    """Whether the broker is kept on `cpus` for the searches only and runs anywhere
    otherwise (so it is moved while it runs: `tasks.brokers.affinity`)."""
    return kept_on(cpus, cpus_for, False) != kept_on(cpus, cpus_for, True)


def placement(cpus: str | None, cpus_for: str) -> str | None:
    """How a run placed its broker, as its fingerprint names it: '0' kept there for every
    stage (as before `cpus_for` existed), '0 for capacity' for searches only, None."""
    if not cpus:
        return None
    return cpus if cpus_for == "all" else f"{cpus} for {cpus_for}"


def pinned(argv: Sequence[str], cpus: str | None) -> list[str]:
    """`argv` run on `cpus` (through taskset, which every process it starts inherits);
    as it is without them."""
    return ["taskset", "-c", cpus, *argv] if cpus else list(argv)


def allowed(status: str) -> list[frozenset[int]]:
    """The CPUs each thread may run on, from the text of /proc/PID/status, or of its
    threads' /proc/PID/task/*/status one after the other; ValueError without any."""
    found = re.findall(r"^Cpus_allowed_list:\s*(\S+)\s*$", status, re.MULTILINE)
    if not found:
        raise ValueError("no Cpus_allowed_list in the process's status")
    return [parse(cpus) for cpus in found]

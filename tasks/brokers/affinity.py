"""Where a running broker's threads may run, read and moved over its host (`taskset`).

`broker.cpus_for: capacity` keeps a broker perfpipe started on `broker.cpus` for the
max-rate searches only, so it is moved while it runs: every thread of every process in
the process group perfpipe started it in (a pid the kernel has since given to another
process is in no such group), each read back from /proc. A broker may set its threads'
CPUs itself (RabbitMQ binds each Erlang scheduler thread to a CPU of its own), so what
each thread had is kept (`move`), and given back to it afterwards (`give_back`), not
replaced by one list for all.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping

from ..catalog import cpus as cpu_lists
from ..hosts import Host
from .errors import BrokerError

# pid, tid, state and CPU list of each thread of each process of a group, a line each
_THREADS = ('for p in $(pgrep -g {group}); do for t in /proc/$p/task/[0-9]*; do '
            'printf "%s %s " "$p" "${{t##*/}}"; awk \'/^State:/ {{s = $2}} '
            '/^Cpus_allowed_list:/ {{c = $2}} END {{print s, c}}\' "$t/status" 2>/dev/null '
            '|| echo; done; done')


def threads(host: Host, group_pid: int) -> dict[int, tuple[int, str]]:
    """tid -> (pid, CPU list) of every live thread of every process in process group
    `group_pid` on `host` ({} when the group is gone; an exited one, not yet reaped, is
    no thread to move)."""
    out = host.run(["sh", "-c", _THREADS.format(group=int(group_pid))], check=False).stdout
    found = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0].isdigit() and fields[1].isdigit() \
                and fields[2] not in ("Z", "X"):
            found[int(fields[1])] = (int(fields[0]), cpu_lists.as_list(cpu_lists.parse(fields[3])))
    return found


def _set(host: Host, targets: Mapping[int, str]) -> None:
    """Each thread (tid) onto its CPU list, in one command; a thread gone meanwhile is
    no error (the read back says what each one has)."""
    lines = [f"taskset -p -c {shlex.quote(cpus)} {int(tid)} >/dev/null 2>&1"
             for tid, cpus in targets.items()]
    host.run(["sh", "-c", "; ".join(lines) + "; true"], check=False)


def move(host: Host, group_pid: int, cpus: str,
         keep: Callable[[dict[int, str]], None] = lambda kept: None) -> dict[int, str]:
    """Every thread of the broker's process group onto `cpus`, read back: what each had
    before (tid -> CPU list, for `give_back`, handed to `keep` before anything moves);
    BrokerError naming `broker.cpus` when the group is gone or a thread is not on `cpus`
    after (the move is undone first)."""
    before = threads(host, group_pid)
    if not before:
        raise BrokerError(f"broker.cpus: the broker's processes (group {int(group_pid)} on "
                          f"{host.name}) are gone; not moved onto {cpus}")
    kept = {tid: had for tid, (_, had) in before.items()}
    keep(kept)
    asked = cpu_lists.as_list(cpu_lists.parse(cpus))
    _set(host, {tid: asked for tid in before})
    off = sorted({c for _, c in threads(host, group_pid).values()} - {asked})
    if off:
        give_back(host, group_pid, kept)
        raise BrokerError(f"broker.cpus: asked for {cpus}, but threads of the broker on "
                          f"{host.name} may still run on {', '.join(off)}: a cpuset or cgroup "
                          f"narrows them, or the broker sets its own")
    return kept


def give_back(host: Host, group_pid: int, kept: Mapping[int, str]) -> None:
    """Each thread of the broker's process group back onto the CPUs it had (`kept`, as
    `move` returned it); a thread started since then, onto those its process had. Read
    back: BrokerError when one is not; nothing when the group is gone."""
    now = threads(host, group_pid)
    targets = {tid: kept.get(tid) or kept.get(pid) for tid, (pid, _) in now.items()}
    targets = {tid: cpus for tid, cpus in targets.items() if cpus}
    _set(host, targets)
    wrong = [tid for tid, (_, cpus) in threads(host, group_pid).items()
             if tid in targets and cpus != targets[tid]]
    if wrong:
        raise BrokerError(f"broker.cpus: {len(wrong)} threads of the broker on {host.name} "
                          f"(tid {wrong[0]}, ...) could not be given back the CPUs they had")

"""Where a running broker's threads may run, read and moved over its host (`taskset`).

`broker.cpus_for: capacity` keeps a broker perfpipe started on `broker.cpus` for the
max-rate searches only, so it is moved while it runs: every thread of every process in
the process group perfpipe started it in, each read back from /proc. Only while the
broker's own pid still runs in that group (`Host.alive`): a group id, like a pid, can
be given to another process once the broker is gone. A broker may set its threads' CPUs itself
(RabbitMQ binds each Erlang scheduler thread to a CPU of its own), so what each thread
had is kept (`move`) and given back to it afterwards (`give_back`), not replaced by one
list for all. A broker that starts threads while it is moved is read again until none is
left behind (`ROUNDS`).
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
            '|| echo; done; done; pgrep -g {group} >/dev/null; [ $? -le 1 ]')
ROUNDS = 5  # reads and moves, each catching the threads started since the one before
BATCH = 500  # threads moved by one command (a single argument is at most 128 KiB)


def threads(host: Host, group_pid: int) -> dict[int, tuple[int, str]]:
    """tid -> (pid, CPU list) of every live thread of every process in process group
    `group_pid` on `host` ({} when the group is gone; an exited one, not yet reaped, is
    no thread to move); BrokerError when the host cannot list a group (no pgrep)."""
    if int(group_pid) <= 1:
        raise BrokerError(f"broker.cpus: {group_pid} is no broker's process group")
    listed = host.run(["sh", "-c", _THREADS.format(group=int(group_pid))], check=False)
    if not listed.ok:
        raise BrokerError(f"broker.cpus_for: needs pgrep (procps) on {host.name} to find the "
                          f"broker's processes; install it or leave cpus_for out")
    found = {}
    for line in listed.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0].isdigit() and fields[1].isdigit() \
                and fields[2] not in ("Z", "X"):
            found[int(fields[1])] = (int(fields[0]), cpu_lists.as_list(cpu_lists.parse(fields[3])))
    return found


def _set(host: Host, targets: Mapping[int, str]) -> str:
    """Each thread (tid) onto its CPU list, BATCH to a command; what taskset said of a
    thread that did not just exit (the read back says what each one has)."""
    said = []
    items = list(targets.items())
    for start in range(0, len(items), BATCH):
        lines = [f"taskset -p -c {shlex.quote(cpus)} {int(tid)} >/dev/null"
                 for tid, cpus in items[start:start + BATCH]]
        err = host.run(["sh", "-c", "; ".join(lines) + "; true"], check=False).stderr
        said += [line for line in err.splitlines() if line and "No such process" not in line]
    return "; ".join(said[:3])


def _settle(host: Host, group_pid: int, target: Callable[[int, int], str | None]
            ) -> tuple[dict[int, tuple[int, str]], str]:
    """Every thread of the group onto `target(tid, pid)` (None: left as it is), read and
    moved again while threads started meanwhile are not there: the threads as last read,
    and what taskset said."""
    said = ""
    for _ in range(ROUNDS):
        now = threads(host, group_pid)
        wrong = {tid: want for tid, (pid, cpus) in now.items()
                 if (want := target(tid, pid)) and cpus != want}
        if not wrong:
            return now, said
        said = _set(host, wrong) or said
    return threads(host, group_pid), said


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
    after, said = _settle(host, group_pid, lambda tid, pid: asked)
    off = sorted({c for _, c in after.values()} - {asked})
    if off:
        problem = (f"broker.cpus: asked for {cpus}, but threads of the broker on {host.name} "
                   f"may still run on {', '.join(off)}: a cpuset or cgroup narrows them, or "
                   f"the broker sets its own{'; taskset: ' + said if said else ''}")
        try:
            give_back(host, group_pid, kept, fallback=None)
        except BrokerError as exc:
            problem += f"; giving them back: {exc}"
        raise BrokerError(problem)
    return kept


def give_back(host: Host, group_pid: int, kept: Mapping[int, str], fallback: str | None
              ) -> None:
    """Each thread of the broker's process group back onto the CPUs it had (`kept`, as
    `move` returned it); a thread started since, onto those its process had, else onto
    `fallback` (the CPUs the broker started with). Read back: BrokerError when one is not
    there; nothing when the group is gone."""
    def target(tid: int, pid: int) -> str | None:
        return kept.get(tid) or kept.get(pid) or fallback

    after, said = _settle(host, group_pid, target)
    wrong = [tid for tid, (pid, cpus) in after.items() if target(tid, pid) not in (None, cpus)]
    if wrong:
        raise BrokerError(f"broker.cpus: {len(wrong)} threads of the broker on {host.name} "
                          f"(tid {wrong[0]}, ...) could not be given back the CPUs they had"
                          f"{'; taskset: ' + said if said else ''}")

"""Reading, applying and undoing each kind of tuning on one host.

Each `apply_*` changes only what differs from the profile, records how to undo it (the
first before-value wins, so a second apply never overwrites the original), and reads
every value back. Values reach the shell only as quoted arguments, after validation in
`tasks.tuning.profile`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

from ..brokers import activemq, mqxr, qmini
from ..hosts import Host, HostError
from .profile import JvmHeap, LimitEntry, QmIni, TasksMax

SYSCTL_FILE = "/etc/sysctl.d/90-perfpipe.conf"
LIMITS_FILE = "/etc/security/limits.d/90-perfpipe.conf"


@dataclass
class Entry:
    kind: str
    key: str
    wanted: str
    before: str | None
    after: str | None
    action: str  # "unchanged" | "applied" | "check-only" | "not-allowed" | "absent" | "restored"
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.after == self.wanted

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


class Undo:
    """How to put a host back: the first recorded before-state of everything touched.

    `persist` is called with every record each time one is added, before the change it
    guards is made: a process killed midway leaves every before-value it changed."""

    def __init__(self, records: list[dict] | None = None,
                 persist: Callable[[list[dict]], None] | None = None) -> None:
        self.records = list(records or [])
        self.persist = persist

    def _has(self, kind: str, key: str) -> bool:
        return any(r["kind"] == kind and r["key"] == key for r in self.records)

    def remember(self, kind: str, key: str, **state) -> None:
        if not self._has(kind, key):
            self.records.append({"kind": kind, "key": key, **state})
            if self.persist is not None:
                self.persist(self.records)


def allowed(key: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


# ---- files -----------------------------------------------------------------------------
def written_by(profile: str) -> str:
    """The first line of every file perfpipe writes whole (its sysctl, limits and systemd
    drop-ins): whose it is, and which profile wrote it."""
    return f"# written by perfpipe, profile {profile}\n"


_FIRST_MISSING = ('d=$(dirname -- "$1"); m=; '
                  'while [ ! -d "$d" ]; do m=$d; d=$(dirname -- "$d"); done; printf %s "$m"')


def first_missing_dir(host: Host, path: str) -> str | None:
    """The outermost folder on the way to `path` that does not exist (None: its folder
    does): what writing the file would make, and its restore removes."""
    made = host.as_root(["sh", "-c", _FIRST_MISSING, "sh", path]).stdout
    return made or None


def remember_file(host: Host, undo: Undo, path: str) -> None:
    """Record a file's content before it is written; for a file that is not there, also
    the folders its writing makes (`made`), so a restore leaves none of them behind."""
    if not undo._has("file", path):
        content = host.read_root_file(path)
        made = first_missing_dir(host, path) if content is None else None
        undo.remember("file", path, content=content, **({"made": made} if made else {}))


def write_file(host: Host, undo: Undo, path: str, content: str) -> bool:
    """Write a file as root if its content differs (one that exists keeps its owner and
    mode: `Host.write_root_file`); True when it was written."""
    if host.read_root_file(path) == content:
        return False
    remember_file(host, undo, path)
    host.write_root_file(path, content)
    return True


def restore_file(host: Host, path: str, content: str | None, made: str | None = None) -> None:
    """Put a file back as recorded: its content, or gone, with the folders its writing
    made (`made` and those in it on the way to the file) where they are empty again."""
    if content is not None:
        host.write_root_file(path, content)
        return
    host.as_root(["rm", "-f", "--", path])
    folder = PurePosixPath(path).parent
    while made and folder.is_relative_to(made):
        if not host.as_root(["rmdir", "--", str(folder)], check=False).ok:
            break  # not empty: something else is in it now, and stays
        folder = folder.parent


# ---- sysctl ----------------------------------------------------------------------------
def read_sysctl(host: Host, key: str) -> str | None:
    text = host.read_root_file("/proc/sys/" + key.replace(".", "/"))
    return " ".join(text.split()) if text is not None else None


def apply_sysctl(host: Host, values: dict[str, str], allow: list[str], undo: Undo,
                 profile: str, apply: bool) -> list[Entry]:
    """A key this host's kernel does not have (the `kernel.sched_*` keys of older profiles
    are gone since Linux 5.13) is said and left out, of the sysctl.d file too: setting it
    would fail and stop the apply halfway, at every retry."""
    before = {key: read_sysctl(host, key) for key in values}
    applicable = {k: v for k, v in values.items() if allowed(k, allow) and before[k] is not None}
    if apply and applicable:
        body = "".join(f"{k} = {v}\n" for k, v in applicable.items())
        write_file(host, undo, SYSCTL_FILE, written_by(profile) + body)
    entries = []
    for key, wanted in values.items():
        was = before[key]
        action = "unchanged" if was == wanted else "check-only"
        if was is None:
            action = "absent" if apply else action
        elif was != wanted and apply and key in applicable:
            undo.remember("sysctl", key, before=was)
            host.as_root(["sysctl", "-q", "-w", f"{key}={wanted}"])
            action = "applied"
        elif was != wanted and apply:
            action = "not-allowed"
        note = "" if was is not None else "key not present on this host: not set"
        after = read_sysctl(host, key) if was is not None else None
        entries.append(Entry("sysctl", key, wanted, was, after, action, note))
    return entries


# ---- limits ----------------------------------------------------------------------------
_ULIMIT_FLAGS = {("nofile", "soft"): "-Sn", ("nofile", "hard"): "-Hn",
                 ("nproc", "soft"): "-Su", ("nproc", "hard"): "-Hu"}


def limits_text(entries: list[LimitEntry], profile: str) -> str:
    lines = [f"{e.domain} {e.type} {e.item} {e.value}" for e in entries]
    return written_by(profile) + "\n".join(lines) + "\n"


def _login_limit(host: Host, entry: LimitEntry, kind: str) -> str | None:
    """The limit a fresh login of the host's user gets (PAM reads limits.d at login), for
    an entry whose domain names that user, or `*` or a group, which pam_limits applies to
    no root login: root's logins (perfpipe's processes, where it logs in as root) keep
    their own limit, and that is what is read."""
    flag = _ULIMIT_FLAGS.get((entry.item, kind))
    if flag is None or not (entry.domain == host.user or _for_everyone_but_root(host, entry)):
        return None
    fresh = host.fresh()
    try:
        return fresh.run(["sh", "-c", f"ulimit {flag}"]).stdout.strip()
    finally:
        fresh.close()


def _for_everyone_but_root(host: Host, entry: LimitEntry) -> bool:
    """A `*` or @group entry, read as root: pam_limits applies it to no root login."""
    return host.user == "root" and (entry.domain == "*" or entry.domain.startswith("@"))


def _limit_reading(host: Host, entry: LimitEntry, kind: str, text: str | None) -> tuple[str | None, str]:
    """What a limit is now: from a fresh login where possible, else from the file."""
    login = _login_limit(host, entry, kind) if host.supports_login else None
    if login is not None and _for_everyone_but_root(host, entry):
        return login, (f"read in a fresh root login: pam_limits applies {entry.domain} lines "
                       "to no root login; name root in the domain for perfpipe's processes")
    if login is not None:
        return login, "read in a fresh login"
    line = f"{entry.domain} {entry.type} {entry.item} {entry.value}"
    in_file = text is not None and line in text.splitlines()
    return (entry.value if in_file else None), "file read back only (not the login user, or no login here)"


def refuse_nofile_above_nr_open(host: Host, limits: list[LimitEntry]) -> None:
    """A HostError, before anything is written, for a nofile limit above the host's
    fs.nr_open (the profile's own sysctl applied): pam_limits cannot set it, and PAM then
    refuses every login it applies to, ssh included, so neither perfpipe nor the host's
    owner could log in to restore it."""
    nr_open = read_sysctl(host, "fs.nr_open")
    if nr_open is None or not nr_open.isdigit():
        return
    for e in limits:
        if e.item == "nofile" and int(e.value) > int(nr_open):
            raise HostError(f"{host.name}: limits: nofile {e.value} for {e.domain} is above "
                            f"fs.nr_open {nr_open} here: PAM would refuse its logins, ssh "
                            f"included; give at most {nr_open}, or raise fs.nr_open in the "
                            "profile's sysctl")


def apply_limits(host: Host, limits: list[LimitEntry], undo: Undo, profile: str,
                 apply: bool) -> list[Entry]:
    def kinds_of(e: LimitEntry) -> tuple[str, ...]:
        return ("soft", "hard") if e.type == "-" else (e.type,)

    if apply:
        refuse_nofile_above_nr_open(host, limits)
    before_text = host.read_root_file(LIMITS_FILE)
    before = {(i, k): _limit_reading(host, e, k, before_text)[0]
              for i, e in enumerate(limits) for k in kinds_of(e)}
    changed = apply and write_file(host, undo, LIMITS_FILE, limits_text(limits, profile))
    after_text = host.read_root_file(LIMITS_FILE)
    entries = []
    for i, e in enumerate(limits):
        for kind in kinds_of(e):
            after, note = _limit_reading(host, e, kind, after_text)
            action = "applied" if changed else ("unchanged" if before[(i, kind)] == e.value else
                                                "not-allowed" if apply else "check-only")
            entries.append(Entry("limits", f"{e.domain} {kind} {e.item}", e.value,
                                 before[(i, kind)], after, action, note))
    return entries


# ---- TasksMax --------------------------------------------------------------------------
def _tasks_max_target(host: Host, spec: TasksMax) -> tuple[str, str] | None:
    """("systemd", unit) where systemd runs, else ("cgroup", path of pids.max); None when
    the user is not on this host (mqm on a driver host)."""
    found = host.run(["id", "-u", spec.user], check=False)
    if not found.ok:
        return None
    uid = found.stdout.strip()
    if host.run(["test", "-d", "/run/systemd/system"], check=False).ok:
        return "systemd", f"user-{uid}.slice"
    if host.run(["test", "-e", "/sys/fs/cgroup/cgroup.controllers"], check=False).ok:
        return "cgroup", f"/sys/fs/cgroup/perfpipe-user-{uid}/pids.max"
    if not host.run(["test", "-d", "/sys/fs/cgroup/pids"], check=False).ok:
        raise HostError(f"{host.name}: neither systemd nor a pids cgroup controller: "
                        f"TasksMax cannot be set")
    return "cgroup", f"/sys/fs/cgroup/pids/perfpipe-user-{uid}/pids.max"


def systemd_dropin(unit: str) -> str:
    """perfpipe's own drop-in for a unit: a file of its own, recorded and put back like the
    sysctl and limits ones (not `systemctl set-property`'s 50-TasksMax.conf, which a
    restore could only overwrite with the old value, pinned for good)."""
    return f"/etc/systemd/system/{unit}.d/90-perfpipe.conf"


def read_tasks_max(host: Host, mode: str, target: str) -> str | None:
    if mode == "systemd":
        out = host.run(["systemctl", "show", "-p", "TasksMax", "--value", target], check=False)
        return out.stdout.strip() or None
    text = host.read_root_file(target)
    return text.strip() if text is not None else None


def apply_tasks_max(host: Host, spec: TasksMax, undo: Undo, profile: str,
                    apply: bool) -> list[Entry]:
    found = _tasks_max_target(host, spec)
    if found is None:
        return [Entry("tasks_max", spec.user, str(spec.value), None, None,
                      "absent" if apply else "check-only",
                      f"user {spec.user} not on this host: not set")]
    mode, target = found
    dropin = systemd_dropin(target) if mode == "systemd" else None
    wanted = str(spec.value)
    before = read_tasks_max(host, mode, target)
    action = "unchanged" if before == wanted else "check-only"
    if before != wanted and apply:
        if mode == "systemd":
            # recorded before the drop-in's own record: restored after it, newest first
            undo.remember("tasks_max", target, mode=mode, before=before, dropin=dropin)
            write_file(host, undo, dropin, written_by(profile) + f"[Slice]\nTasksMax={wanted}\n")
            host.as_root(["systemctl", "daemon-reload"])
        else:
            undo.remember("tasks_max", target, mode=mode, before=before)
            host.as_root(["mkdir", "-p", target.rsplit("/", 1)[0]])
            host.as_root(["sh", "-c", 'echo "$1" > "$2"', "sh", wanted, target])
        action = "applied"
    note = (f"systemd: {dropin}" if dropin else
            "cgroup (no systemd): a pids cgroup of perfpipe's own, into which no process is "
            "moved, so it limits none here")
    return [Entry("tasks_max", f"{spec.user} ({target})", wanted, before,
                  read_tasks_max(host, mode, target), action, note)]


def tasks_max_restored(record: dict) -> str | None:
    """The TasksMax a restore of `record` puts back: its before-value; `infinity` for one
    unread that `set-property` sets (a record from before the drop-in of perfpipe's own)."""
    if record["mode"] == "systemd" and not record.get("dropin"):
        return record["before"] or "infinity"
    return record["before"]


def restore_tasks_max(host: Host, record: dict) -> None:
    """Put a TasksMax back. systemd: its drop-in's own record has put the file back (or
    removed it), and systemd reloads its units' files; a record from before perfpipe had a
    drop-in of its own (no `dropin`) sets the old value with `set-property`, as it was
    applied."""
    target = record["key"]
    if record["mode"] == "systemd" and record.get("dropin"):
        host.as_root(["systemctl", "daemon-reload"])
    elif record["mode"] == "systemd":
        host.as_root(["systemctl", "set-property", target,
                      f"TasksMax={tasks_max_restored(record)}"])
    elif record["before"] is None:  # perfpipe's own cgroup: gone already is put back too
        folder = target.rsplit("/", 1)[0]
        host.as_root(["sh", "-c", '[ ! -e "$1" ] || rmdir -- "$1"', "sh", folder])
    else:
        host.as_root(["sh", "-c", 'echo "$1" > "$2"', "sh", record["before"], target])


# ---- qm.ini ----------------------------------------------------------------------------
def apply_qm_ini(host: Host, spec: QmIni, undo: Undo, apply: bool) -> list[Entry]:
    text = host.read_root_file(spec.path)
    if text is None:
        raise HostError(f"{host.name}: {spec.path} does not exist (is the queue manager created?)")
    before = qmini.read_values(text)
    if apply:
        updated = qmini.set_values(text, spec.stanzas)
        if updated != text:
            write_file(host, undo, spec.path, updated)
    after = qmini.read_values(host.read_root_file(spec.path) or "")
    entries = []
    for stanza, keys in spec.stanzas.items():
        for key, wanted in keys.items():
            old = before.get(stanza, {}).get(key)
            action = "unchanged" if old == wanted else ("applied" if apply else "check-only")
            entries.append(Entry("qm_ini", f"{stanza}/{key}", wanted, old,
                                 after.get(stanza, {}).get(key), action, spec.path))
    return entries


# ---- JVM heap --------------------------------------------------------------------------
def apply_jvm_heap(host: Host, spec: JvmHeap, undo: Undo, apply: bool) -> list[Entry]:
    if spec.service == "mqxr":
        return _mqxr_heap(host, spec)
    text = host.read_root_file(activemq.OPTIONS_FILE)
    before = activemq.heap_options(text)
    wanted = [f"-Xms{spec.xms}", f"-Xmx{spec.xmx}"]
    changed = apply and write_file(host, undo, activemq.OPTIONS_FILE,
                                   activemq.with_heap(text, spec.xms, spec.xmx))
    after = activemq.heap_options(host.read_root_file(activemq.OPTIONS_FILE))
    note = "used at the next broker start, which verifies it on the running JVM (jcmd)"
    return [Entry("jvm_heap", f"activemq {option[:4]}", option[4:],
                  next((b[4:] for b in before if b[:4] == option[:4]), None),
                  next((a[4:] for a in after if a[:4] == option[:4]), None),
                  "applied" if changed else ("unchanged" if option in before else
                                             "check-only"), note)
            for option in wanted]


def _mqxr_heap(host: Host, spec: JvmHeap) -> list[Entry]:
    """IBM MQ is not driven here: report the runmqsc commands that set the heap."""
    commands = mqxr.heap_commands("<current STARTARG>", spec.xms, spec.xmx)
    note = f"run with runmqsc {spec.queue_manager or 'QMGR'}: " + " ; ".join(commands[:3])
    return [Entry("jvm_heap", f"mqxr {name}", value, None, None, "commands", note)
            for name, value in (("-Xms", spec.xms), ("-Xmx", spec.xmx))]

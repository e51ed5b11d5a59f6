#!/usr/bin/env python3
"""The test lab: SSH hosts in network namespaces on this machine.

    python infra/lab/lab.py up      # create the hosts (idempotent)
    python infra/lab/lab.py down    # remove them and everything they left
    python infra/lab/lab.py status

Each host is a network namespace on one bridge, with its own address, its own sshd (its
own host key; the lab's client key in authorized_keys) and its own mount namespace, in
which /etc (copied from this machine at lab-up), /root (root's home, from /etc/skel),
/opt/perfpipe, /var/tmp/perfpipe and /home are per-host directories and the host's own
subtree of the pids cgroup is mounted.
Directories, not files, are bind-mounted: a file mount would be detached as soon as this
machine replaced the file (adduser renames a new /etc/passwd into place).
So over SSH a lab host behaves like a separate machine for what perfpipe touches: sysctls
of the net namespace, limits files read by PAM at login, files, users, cgroups. Keys that
the kernel does not namespace (fs.*, vm.*, kernel.*) are still this machine's: the lab
inventory only lets perfpipe apply net.* keys there.

Each host also has the user `pplab` (no sudo) for the tests of a host without sudo.
Standard library only; run as root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("PERFPIPE_LAB_DIR", REPO / ".state" / "lab"))
BRIDGE = "pplab0"
NETWORK = "10.250.77"
HOSTS = {"broker1": 11, "driver1": 12, "driver2": 13}
LAB_USER = ("pplab", 2077)
# /root too: this machine's root may run a slow ~/.bashrc (pyenv init: 0.11 s), which bash
# sources for every command sshd runs; a lab host's root has the distribution's default
PER_HOST_DIRS = ("etc", "root", "opt/perfpipe", "var/tmp/perfpipe", "home")

BOOT = """set -e
R={root}
mount --make-rprivate /
for d in {dirs}; do mount --bind "$R/$d" "/$d"; done
mount -t tmpfs lab-cgroup /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/pids /sys/fs/cgroup/.all-pids
# this host's own subtree of the pids hierarchy, seen as its root
if mount -t cgroup -o pids pids /sys/fs/cgroup/.all-pids; then
  mkdir -p /sys/fs/cgroup/.all-pids/pplab-{name}
  mount --bind /sys/fs/cgroup/.all-pids/pplab-{name} /sys/fs/cgroup/pids
  umount /sys/fs/cgroup/.all-pids
fi
hostname {name}
exec /usr/sbin/sshd -f {config}
"""

SSHD_CONFIG = """ListenAddress {address}
Port 22
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
StrictModes no
MaxStartups 100:30:200
MaxSessions 100
Subsystem sftp internal-sftp
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def netns(name: str) -> str:
    return f"pplab-{name}"


def address(name: str) -> str:
    return f"{NETWORK}.{HOSTS[name]}"


def host_dir(name: str) -> Path:
    return STATE / "hosts" / name


def _keys() -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    client = STATE / "client_key"
    if not client.exists():
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "perfpipe-lab", "-f", str(client))
    shutil.copyfile(f"{client}.pub", STATE / "authorized_keys")
    client.chmod(0o600)


def _bridge() -> None:
    if sh("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{NETWORK}.1/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")


def _root_fs(name: str) -> Path:
    root = host_dir(name) / "root"
    if not (root / "etc").exists():
        root.mkdir(parents=True, exist_ok=True)
        sh("cp", "-a", "/etc", str(root / "etc"))
        for rel in ("etc/sysctl.d", "etc/security/limits.d"):  # start without local drop-ins
            for path in (root / rel).glob("*perfpipe*"):
                path.unlink()
        _add_lab_user(root)
    for rel in PER_HOST_DIRS:
        (root / rel).mkdir(parents=True, exist_ok=True)
        Path("/", rel).mkdir(parents=True, exist_ok=True)  # mount point on this machine
    if not any((root / "root").iterdir()) and Path("/etc/skel").is_dir():
        shutil.copytree("/etc/skel", root / "root", dirs_exist_ok=True)
    (root / "root").chmod(0o700)
    return root


def _add_lab_user(root: Path) -> None:
    user, uid = LAB_USER
    home = root / "home" / user
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, uid)
    lines = {"etc/passwd": f"{user}:x:{uid}:{uid}:perfpipe lab user:/home/{user}:/bin/bash\n",
             "etc/group": f"{user}:x:{uid}:\n", "etc/shadow": f"{user}:*:19000:0:99999:7:::\n"}
    for rel, line in lines.items():
        with open(root / rel, "a") as handle:
            handle.write(line)


def _host(name: str) -> None:
    ns, veth, hdir = netns(name), f"ppl-{name}"[:15], host_dir(name)
    hdir.mkdir(parents=True, exist_ok=True)
    if sh("ip", "netns", "pids", ns, check=False).returncode != 0:
        sh("ip", "netns", "add", ns)
    if sh("ip", "link", "show", veth, check=False).returncode != 0:
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", f"{address(name)}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    pid_file = hdir / "sshd.pid"
    if pid_file.exists() and _alive(int(pid_file.read_text())):
        return
    # Our namespace, but not our sshd (another checkout's lab, or one left behind): clear it.
    if left := _kill_namespace_processes(ns):
        raise SystemExit(f"lab up: {ns}: processes {' '.join(left)} did not exit")
    host_key = hdir / "host_key"
    if not host_key.exists():
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(host_key))
    config = hdir / "sshd_config"
    config.write_text(SSHD_CONFIG.format(address=address(name), host_key=host_key,
                                         pid_file=pid_file,
                                         authorized_keys=STATE / "authorized_keys"))
    boot = hdir / "boot.sh"
    boot.write_text(BOOT.format(root=_root_fs(name), dirs=" ".join(PER_HOST_DIRS), name=name,
                                config=config))
    Path("/run/sshd").mkdir(exist_ok=True)
    sh("ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "sh", str(boot))
    _wait_for_ssh(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _wait_for_ssh(name: str, timeout_s: float = 10.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address(name), 22), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"lab host {name}: sshd did not listen on {address(name)}:22")


def up() -> dict:
    _keys()
    _bridge()
    for name in HOSTS:
        _host(name)
    info = {"bridge": BRIDGE, "client_key": str(STATE / "client_key"), "user": LAB_USER[0],
            "hosts": {name: address(name) for name in HOSTS}}
    (STATE / "lab.json").write_text(json.dumps(info, indent=1))
    return info


def _namespace_pids(ns: str) -> list[str]:
    return sh("ip", "netns", "pids", ns, check=False).stdout.split()


def _kill_namespace_processes(ns: str) -> list[str]:
    """SIGTERM every process in the namespace, SIGKILL what is left after a few seconds;
    returns the pids still there after that (none, but for a process stuck in the kernel)."""
    pids = _namespace_pids(ns)
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        for pid in pids:
            try:
                os.kill(int(pid), sig)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + wait_s
        while (pids := _namespace_pids(ns)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pids:
            return []
    return pids


def _remove_cgroups(name: str) -> list[str]:
    """The host's pids subtree (children first); only cgroups the lab created. Returns
    the ones that could not be removed (still holding a process), after trying them all."""
    root = Path("/sys/fs/cgroup/pids") / f"pplab-{name}"
    left = []
    if root.is_dir():
        for path in [*sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True), root]:
            if path.is_dir():
                try:
                    path.rmdir()
                except OSError as exc:
                    left.append(f"{path}: {exc.strerror}")
    return left


def down() -> None:
    """Remove every lab host, then the bridge and the lab's state; a host whose processes
    will not die keeps its namespace (deleting its name would leave them running where no
    later `down` finds them), and down fails naming them, after removing all it can."""
    problems = []
    for name in HOSTS:
        ns = netns(name)
        if sh("ip", "netns", "pids", ns, check=False).returncode == 0:
            if left := _kill_namespace_processes(ns):
                problems.append(f"{ns}: processes {' '.join(left)} did not exit; namespace kept")
            else:
                sh("ip", "netns", "del", ns, check=False)
        problems += _remove_cgroups(name)
        sh("ip", "link", "del", f"ppl-{name}"[:15], check=False)
    sh("ip", "link", "del", BRIDGE, check=False)
    for rel in ("opt/perfpipe", "var/tmp/perfpipe"):
        try:
            Path("/", rel).rmdir()  # only the empty mount points the lab created
        except OSError:
            pass
    if (STATE / "hosts").exists():
        shutil.rmtree(STATE / "hosts")
    (STATE / "lab.json").unlink(missing_ok=True)
    if problems:
        raise SystemExit("lab down: " + "; ".join(problems))


def status() -> dict:
    return {name: {"address": address(name),
                   "namespace": sh("ip", "netns", "pids", netns(name), check=False).returncode == 0,
                   "sshd": _sshd_alive(name)} for name in HOSTS}


def _sshd_alive(name: str) -> bool:
    pid_file = host_dir(name) / "sshd.pid"
    try:
        return _alive(int(pid_file.read_text()))
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("up", "down", "status"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the lab needs root (network namespaces, bind mounts)", file=sys.stderr)
        return 2
    if args.action == "up":
        print(json.dumps(up(), indent=1))
    elif args.action == "down":
        down()
        print("lab removed")
    else:
        print(json.dumps(status(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One way to reach a host: run, sudo, put, get, launch — locally or over SSH.

`LocalHost` wraps invoke's `Context` and `SshHost` wraps fabric's `Connection`; both
share invoke's `run` model, so every step runs the same code on the embedded default and
on a lab of SSH hosts. Commands are argument lists joined with `shlex.join`: a value never
reaches a shell unquoted.
"""

from __future__ import annotations

import getpass
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import invoke

from . import ports
from .child_env import child_env
from .settings import REPO_ROOT

# An SSH link that stops answering is given up after about this long (keepalives every
# SSH_KEEPALIVE_S make sure bytes are in flight, so the kernel's deadline applies).
SSH_KEEPALIVE_S = 5
SSH_DEAD_AFTER_S = 15.0
# tasks/ports.py run as a script on a host: prints a port that host can bind.
PORTS_SOURCE = Path(ports.__file__).read_text()


def died(code: int) -> str | None:
    """What a launched process's exit code says, when it did not end by itself: the shell
    `Host.launch` runs records 128 + N for a process killed by signal N. Codes 0 and 1 are
    a driver's own ending (1: its summary says why it was not ok)."""
    if code in (0, 1):
        return None
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = "unknown"
        return f"died (signal {code - 128}, {name})"
    return f"exited with code {code}"

class HostError(RuntimeError):
    """A command failed on a host; the message names the host and the command's first line."""


class HostUnreachable(HostError):
    """The host could not be reached, or its connection was lost: no later command there
    will do better until it answers again."""


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    stderr: str
    exited: int

    @property
    def ok(self) -> bool:
        return self.exited == 0


def command_line(argv: Sequence[str] | str) -> str:
    return argv if isinstance(argv, str) else shlex.join(str(a) for a in argv)


class Interactive:
    """Line exchange with a running command: `ask` writes a line and reads one back."""

    def __init__(self, write, readline, close) -> None:
        self._write, self._readline, self._close = write, readline, close

    def ask(self, line: str) -> str:
        self._write(line + "\n")
        return self._readline().strip()

    def close(self) -> None:
        self._close()


_NOT_THERE = "No such file or directory"  # cat's error (LC_ALL=C) for a path not there


class Host:
    """What every transport offers. Subclasses provide `_runner`, `user`, `put` and `get`."""

    name: str
    user: str  # the login user; commands that need root go through `sudo -n` unless root
    python: str  # interpreter that runs tasks.driver on this host
    code_root: str  # directory on the host for perfpipe's code (the driver bundle)
    work_root: str  # directory on the host for run files

    supports_login = False  # True where a new connection is a new PAM login session

    @property
    def where(self) -> str:
        """Which machine this is, whatever the inventory calls it (its tuning record's)."""
        return "this machine"

    def _runner(self) -> invoke.Context:
        raise NotImplementedError

    def fresh(self) -> Host:
        """The same host over a new connection (a new login where the transport has one)."""
        return self

    def close(self) -> None:
        """Release the connection (nothing to do locally)."""

    def _connection_error(self, exc: Exception) -> HostError | None:
        """A transport failure (unreachable, refused key, a link lost under the call) as
        one clear line, or None."""
        return None

    def _lost(self) -> HostError | None:
        """The connection died under the last command (a link down), or None."""
        return None

    def run(self, argv: Sequence[str] | str, *, check: bool = True,
            timeout: float | None = None) -> CommandResult:
        """Run a command (an argv list is quoted; a string is passed as written)."""
        line = command_line(argv)
        try:
            result = self._runner().run(line, hide=True, warn=True, timeout=timeout,
                                        in_stream=False)
        except invoke.exceptions.CommandTimedOut:
            raise HostError(f"{self.name}: timed out after {timeout}s: {line[:120]}") from None
        except Exception as exc:  # transport errors differ by library; map the known ones
            mapped = self._connection_error(exc)
            if mapped is None:
                raise
            raise mapped from None
        lost = self._lost()
        if lost is not None:  # the command's end was never seen: its exit code means nothing
            raise lost
        out = CommandResult(result.stdout, result.stderr, result.exited)
        if check and not out.ok:
            first = (out.stderr or out.stdout).strip().splitlines()[:1]
            raise HostError(f"{self.name}: exit {out.exited} from {line[:120]}: {first[0] if first else ''}")
        return out

    def as_root(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        """Run as root: directly when logged in as root, else through passwordless sudo."""
        if self.user == "root":
            return self.run(argv, check=check)
        result = self.run(["sudo", "-n", "--", *argv], check=False)
        if not result.ok and ("sudo" in result.stderr or result.exited == 127):
            raise HostError(f"{self.name}: user {self.user} cannot run commands as root "
                            f"(sudo -n: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'not available'}); "
                            f"grant passwordless sudo or log in as root")
        if check and not result.ok:
            first = (result.stderr or result.stdout).strip().splitlines()[:1]
            raise HostError(f"{self.name}: exit {result.exited} from {command_line(argv)[:120]}: "
                            f"{first[0] if first else ''}")
        return result

    def read_file(self, path: str) -> str | None:
        """A file's text, or None when it does not exist."""
        result = self.run(["cat", "--", path], check=False)
        return result.stdout if result.ok else None

    def read_root_file(self, path: str) -> str | None:
        """A file's text as root may read it: what tuning records before it changes a file,
        and reads back after. None only when the file is not there: one the login user may
        not read is read through `as_root`, and one even root cannot read is a HostError
        (recorded as absent, its restore would delete it)."""
        for read in (self.run, self.as_root):
            result = read(["env", "LC_ALL=C", "cat", "--", path], check=False)
            if result.ok:
                return result.stdout
            if _NOT_THERE in result.stderr:  # anywhere along the path: not a permission
                return None
        first = (result.stderr or result.stdout).strip().splitlines()[:1]
        raise HostError(f"{self.name}: cannot read {path}, not even as root: "
                        f"{first[0] if first else f'exit {result.exited}'}")

    def write_root_file(self, path: str, content: str, mode: str = "0644") -> None:
        """Write a file as root, atomically (a temp file, then install). A file that exists
        keeps its owner, group and mode (IBM MQ's qm.ini is mqm's, and its queue manager
        must still write it), and a symlink stays one (its target is written); a new file
        is root's, with `mode`."""
        with tempfile.NamedTemporaryFile("w", delete=False, suffix=".perfpipe") as handle:
            handle.write(content)
        remote_tmp = f"/tmp/perfpipe-{secrets.token_hex(6)}"
        try:
            owner: list[str] = []  # the file's, or a symlink's target's (stat -L)
            now = self.as_root(["stat", "-L", "-c", "%u %g %a", "--", path], check=False)
            if now.ok and len(now.stdout.split()) == 3:
                uid, gid, mode = now.stdout.split()
                owner = ["-o", uid, "-g", gid]
            # install replaces a symlink with a file: write where the link points
            resolved = self.as_root(["readlink", "-f", "--", path], check=False)
            target = resolved.stdout.strip() if resolved.ok and resolved.stdout.strip() else path
            self.put(Path(handle.name), remote_tmp)
            self.as_root(["install", "-D", *owner, "-m", mode, remote_tmp, target])
        finally:
            Path(handle.name).unlink()
            self.run(["rm", "-f", remote_tmp], check=False)

    def launch(self, argv: Sequence[str], log_path: str) -> int:
        """Start a detached process in its own process group; returns the group's pid.

        It outlives the calling task (an Airflow task may end before the process does).
        Its own pid is written to ``log_path + '.pid'`` and its exit code to
        ``log_path + '.rc'`` when it ends (128 + N when signal N killed it). The shell that
        waits for it survives the group's TERM (`stop_group`, a fail-fast stop), so the
        code of a process stopped that way is recorded too; a KILL of the group takes both.
        Those two files of an earlier launch to the same log (a retried step) go first, so
        its exit code is never read as this one's.
        """
        q = shlex.quote
        inner = (f"{command_line(argv)} >{q(log_path)} 2>&1 & pid=$!; "
                 f"echo $pid >{q(log_path + '.pid')}; trap : TERM INT; wait $pid; rc=$?; "
                 f"while [ $rc -gt 128 ] && kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done; "
                 f"echo $rc >{q(log_path + '.rc')}")
        line = (f"rm -f -- {q(log_path + '.rc')} {q(log_path + '.pid')}; "
                f"setsid sh -c {q(inner)} </dev/null >/dev/null 2>&1 & echo $!")
        return int(self.run(line).stdout.strip())

    def exit_code(self, log_path: str) -> int | None:
        """The exit code of a launched process, or None while it runs."""
        result = self.run(["cat", log_path + ".rc"], check=False)
        return int(result.stdout.strip()) if result.ok and result.stdout.strip() else None

    def free_port(self) -> int:
        """A TCP port this host can bind right now, outside its ephemeral range (tasks.ports).
        Each call is a process of its own: two calls may, rarely, name the same port."""
        return int(self.run([self.python, "-c", PORTS_SOURCE]).stdout.strip())

    def port_held(self, port: int) -> bool:
        """Whether another process holds `port` on this host (`ports.held`)."""
        return self.run([self.python, "-c", PORTS_SOURCE, str(port)]).stdout.strip() == "held"

    def stop_group(self, pid: int, timeout_s: float) -> None:
        """TERM a launched process group, KILL it if it outlives timeout_s."""
        self.kill_group(pid, "TERM")
        deadline = time.monotonic() + timeout_s
        while self.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.alive(pid):
            self.kill_group(pid, "KILL")

    def alive(self, pid: int, group: int | None = None, started: int | None = None) -> bool:
        """Whether the process runs, and in process group `group` and since `started` (as
        `started` read it) where given: a pid, or a group id, the kernel may have given to
        another process since. A zombie (ended, not yet reaped) does not: a stopped group's
        shell is one until PID 1 reaps it, which a container's init may do seconds later,
        or never (`kill -0` would call it alive all that time)."""
        fields = self._stat(pid)
        return fields[:1] not in (["Z"], ["X"], []) and (
            group is None or fields[2:3] == [str(int(group))]) and (
            started is None or fields[19:20] == [str(int(started))])

    def started(self, pid: int) -> int | None:
        """When the process started, in clock ticks after boot (/proc/PID/stat's 22nd
        field): with its pid, what tells it from a later process given the same pid."""
        fields = self._stat(pid)
        return int(fields[19]) if len(fields) > 19 else None

    def _stat(self, pid: int) -> list[str]:
        """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...); [] for a
        process that is gone."""
        stat = self.run(["cat", f"/proc/{int(pid)}/stat"], check=False)
        return stat.stdout.rpartition(")")[2].split() if stat.ok else []

    def kill_group(self, pid: int, signal: str = "TERM") -> None:
        self.run(["kill", f"-{signal}", "--", f"-{pid}"], check=False)

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False).ok

    def read_text(self, path: str) -> str:
        return self.run(["cat", path]).stdout

    def mkdir(self, path: str) -> None:
        self.run(["mkdir", "-p", path])

    def put_text(self, text: str, remote: str) -> None:
        """Write `text` to `remote` on the host through a private temporary file here
        (mkstemp: mode 0600, a name nobody can guess or create first)."""
        handle, local = tempfile.mkstemp(prefix="perfpipe-")
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text)
            self.put(Path(local), remote)
        finally:
            Path(local).unlink(missing_ok=True)

    def interactive(self, argv: Sequence[str]) -> Interactive:
        """A running command whose stdin and stdout lines we exchange (kept short-lived)."""
        raise NotImplementedError

    def put(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: Path) -> None:
        raise NotImplementedError


class LocalHost(Host):
    """This machine, through invoke's local Context: no SSH."""

    def __init__(self, name: str = "localhost", work_root: str | None = None,
                 python: str | None = None, keep_env: Sequence[str] = ()) -> None:
        self.name = name
        self.user = getpass.getuser()
        self.python = python or sys.executable
        self.code_root = str(REPO_ROOT)
        self.work_root = work_root or ""
        self.keep_env = tuple(keep_env)  # secret-looking variables its commands may see

    def _runner(self) -> invoke.Context:
        """Commands see this process's environment without its secrets (`child_env`)."""
        return invoke.Context(config=invoke.Config(overrides={
            "run": {"env": child_env(self.keep_env), "replace_env": True}}))

    def put(self, local: Path, remote: str) -> None:
        if Path(local).resolve() != Path(remote).resolve():
            Path(remote).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, remote)

    def interactive(self, argv: Sequence[str]) -> Interactive:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, bufsize=1, env=child_env(self.keep_env))

        def write(line: str) -> None:
            proc.stdin.write(line)
            proc.stdin.flush()

        def close() -> None:
            proc.stdin.close()
            proc.wait(10)

        return Interactive(write, proc.stdout.readline, close)

    def get(self, remote: str, local: Path) -> None:
        if Path(local).resolve() != Path(remote).resolve():
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(remote, local)


def _socket_options(sock: socket.socket) -> None:
    """An SSH connection's TCP options: the deadline of `SshHost._deadlines`, and no
    Nagle delay. Every command is a few small SSH messages each way; with Nagle on,
    paramiko's small writes and the server's delayed ACKs cost ~40 ms per command (48 ms
    against 4 ms for `true` on a lab host, raw paramiko; OpenSSH's own client sets
    TCP_NODELAY for the same reason)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                        int(SSH_DEAD_AFTER_S * 1000))


@dataclass(frozen=True)
class HostKeyCheck:
    """How an SSH host must prove it is the host meant: show the `pinned` key (a paramiko
    key), or the key this machine's known_hosts files hold for it (`known_hosts`); with
    `strict`, a host found in neither is refused. The default takes any key (fabric's,
    paramiko's AutoAddPolicy)."""

    pinned: Any = field(default=None, repr=False)
    strict: bool = False
    known_hosts: bool = False

    def apply(self, client: Any, address: str, port: int) -> None:
        """Set up paramiko's `client` to check `address`:`port` this way."""
        import paramiko

        if self.known_hosts:
            client.load_system_host_keys()
        if self.pinned is not None:
            known = address if port == 22 else f"[{address}]:{port}"
            client.get_host_keys().add(known, self.pinned.get_name(), self.pinned)
        if self.strict:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())


class SshHost(Host):
    """A host over SSH through fabric's Connection (same run model as LocalHost)."""

    def __init__(self, name: str, address: str, *, port: int = 22, user: str = "root",
                 key_file: str | None = None, gateway: SshHost | None = None,
                 python: str = "python3", code_root: str = "/opt/perfpipe",
                 work_root: str = "/var/tmp/perfpipe", connect_timeout: float = 10.0,
                 connect_kwargs: dict | None = None,
                 host_key_check: HostKeyCheck = HostKeyCheck()) -> None:
        import fabric  # imported here: the local default never needs paramiko

        # paramiko says "Connected", "Authentication successful" at INFO for every
        # connection (a line or two per host per step under Airflow's INFO logging); what
        # went wrong with a host, perfpipe says itself, in one line per host
        logging.getLogger("paramiko").setLevel(logging.WARNING)
        self._args = dict(name=name, address=address, port=port, user=user, key_file=key_file,
                          gateway=gateway, python=python, code_root=code_root,
                          work_root=work_root, connect_timeout=connect_timeout,
                          connect_kwargs=connect_kwargs, host_key_check=host_key_check)
        if connect_kwargs is None:
            connect_kwargs = ({"key_filename": key_file, "look_for_keys": False,
                               "allow_agent": False} if key_file else {})
        self.name = name
        self.address = address
        self.user = user
        self.python = python
        self.code_root = code_root
        self.work_root = work_root
        self._connected = False  # a connection was made and its deadlines set
        self._owns_gateway = True  # `close` closes it; not for a `fresh` login
        self._connection = fabric.Connection(
            address, user=user, port=port, connect_kwargs=connect_kwargs,
            connect_timeout=connect_timeout,
            gateway=gateway._connection if gateway else None)
        # the name and port it connects to (an ssh_config HostName may have changed them)
        host_key_check.apply(self._connection.client, self._connection.host,
                             self._connection.port)

    supports_login = True

    @property
    def where(self) -> str:
        gateway = self._args["gateway"]
        return (f"{self.address}:{self._args['port']}"  # the login user may change
                + (f" via {gateway.where}" if gateway else ""))

    def _runner(self):
        if not self._connection.is_connected:
            self._connected = False
            self._connection.open()
            self._deadlines()
            self._connected = True
        return self._connection

    def _deadlines(self) -> None:
        """A link that stops answering is an error within about `SSH_DEAD_AFTER_S`, not a
        wait without end: SSH keepalives every `SSH_KEEPALIVE_S` put unanswered bytes on
        the wire, and the kernel gives the connection up when bytes stay unanswered that
        long (TCP_USER_TIMEOUT); every channel on it then ends, and `_lost` says why. The
        options (`_socket_options`) go on the TCP connection to the host or, through
        gateways (one behind another), on the one to the first gateway, which carries
        this connection's keepalives."""
        self._connection.transport.set_keepalive(SSH_KEEPALIVE_S)
        hop = self._connection  # this connection, then each gateway's (a fabric Connection)
        while (transport := getattr(hop, "transport", None)) is not None:
            if isinstance(transport.sock, socket.socket):  # not a channel through a gateway
                _socket_options(transport.sock)
            hop = hop.gateway

    def _lost(self) -> HostUnreachable | None:
        transport = self._connection.transport
        if not self._connected or transport is None or transport.is_active():
            return None  # never connected (`_connection_error` says why) or still there
        self._connected = False
        self._connection.close()  # the next command connects anew (or says unreachable)
        return HostUnreachable(f"{self.name}: connection to {self.user}@{self.address} lost: "
                               f"no answer for {SSH_DEAD_AFTER_S:.0f} s")

    def fresh(self) -> SshHost:
        """A new login through the same gateway connection, which stays this host's to close."""
        host = SshHost(**self._args)
        host._owns_gateway = False
        return host

    def _connection_error(self, exc: Exception) -> HostError | None:
        import paramiko

        lost = self._lost()
        if lost is not None:  # whatever the library raised, the link is why
            return lost
        where = f"{self.user}@{self.address}"
        if isinstance(exc, paramiko.AuthenticationException):
            return HostUnreachable(f"{self.name}: SSH key refused for {where} (check key_file "
                                   f"and the host's authorized_keys)")
        if isinstance(exc, (OSError, paramiko.SSHException, EOFError)):
            return HostUnreachable(f"{self.name}: unreachable at {where}: "
                                   f"{exc or type(exc).__name__}")
        return None

    def interactive(self, argv: Sequence[str]) -> Interactive:
        try:
            stdin, stdout, _ = self._runner().client.exec_command(command_line(argv))
        except Exception as exc:
            raise self._connection_error(exc) or exc from None

        def write(line: str) -> None:
            stdin.write(line)
            stdin.flush()

        def close() -> None:
            stdin.close()
            stdout.channel.recv_exit_status()

        return Interactive(write, stdout.readline, close)

    def put(self, local: Path, remote: str) -> None:
        try:
            self._runner().put(str(local), remote)
        except Exception as exc:
            raise self._connection_error(exc) or exc from None

    def get(self, remote: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._runner().get(remote, str(local))
        except Exception as exc:
            raise self._connection_error(exc) or exc from None

    def close(self) -> None:
        """Close the connection, and the gateway's it owns (fabric leaves a gateway's open)."""
        self._connection.close()
        if self._owns_gateway and self._args["gateway"] is not None:
            self._args["gateway"].close()

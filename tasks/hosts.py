"""One way to reach a host: run, sudo, put, get, launch — locally or over SSH.

`LocalHost` wraps invoke's `Context` and `SshHost` wraps fabric's `Connection`; both
share invoke's `run` model, so every step runs the same code on the embedded default and
on a lab of SSH hosts. Commands are argument lists joined with `shlex.join`: a value never
reaches a shell unquoted.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import invoke

from .settings import REPO_ROOT


class HostError(RuntimeError):
    """A command failed on a host; the message names the host and the command's first line."""


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


class Host:
    """What every transport offers. Subclasses provide `_runner`, `put` and `get`."""

    name: str
    python: str  # interpreter that runs tasks.driver on this host
    code_root: str  # directory on the host that contains the `tasks` package
    work_root: str  # directory on the host for run files

    def _runner(self) -> invoke.Context:
        raise NotImplementedError

    def run(self, argv: Sequence[str] | str, *, check: bool = True, timeout: float | None = None,
            sudo: bool = False) -> CommandResult:
        """Run a command (an argv list is quoted; a string is passed as written)."""
        line = command_line(argv)
        runner = self._runner()
        call = runner.sudo if sudo else runner.run
        try:
            result = call(line, hide=True, warn=True, timeout=timeout, in_stream=False)
        except invoke.exceptions.CommandTimedOut as exc:
            raise HostError(f"{self.name}: timed out after {timeout}s: {line[:120]}") from exc
        out = CommandResult(result.stdout, result.stderr, result.exited)
        if check and not out.ok:
            first = (out.stderr or out.stdout).strip().splitlines()[:1]
            raise HostError(f"{self.name}: exit {out.exited} from {line[:120]}: {first[0] if first else ''}")
        return out

    def sudo(self, argv: Sequence[str] | str, **kwargs) -> CommandResult:
        return self.run(argv, sudo=True, **kwargs)

    def launch(self, argv: Sequence[str], log_path: str) -> int:
        """Start a detached process in its own process group; returns the group's pid.

        It outlives the calling task (an Airflow task may end before the process does).
        Its own pid is written to ``log_path + '.pid'`` and its exit code to
        ``log_path + '.rc'`` when it ends.
        """
        q = shlex.quote
        inner = (f"{command_line(argv)} >{q(log_path)} 2>&1 & echo $! >{q(log_path + '.pid')}; "
                 f"wait $!; echo $? >{q(log_path + '.rc')}")
        line = f"setsid sh -c {q(inner)} </dev/null >/dev/null 2>&1 & echo $!"
        return int(self.run(line).stdout.strip())

    def exit_code(self, log_path: str) -> int | None:
        """The exit code of a launched process, or None while it runs."""
        result = self.run(["cat", log_path + ".rc"], check=False)
        return int(result.stdout.strip()) if result.ok and result.stdout.strip() else None

    def alive(self, pid: int) -> bool:
        return self.run(["kill", "-0", str(pid)], check=False).ok

    def kill_group(self, pid: int, signal: str = "TERM") -> None:
        self.run(["kill", f"-{signal}", "--", f"-{pid}"], check=False)

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False).ok

    def read_text(self, path: str) -> str:
        return self.run(["cat", path]).stdout

    def mkdir(self, path: str) -> None:
        self.run(["mkdir", "-p", path])

    def put(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: Path) -> None:
        raise NotImplementedError


class LocalHost(Host):
    """This machine, through invoke's local Context: no SSH."""

    def __init__(self, name: str = "localhost", work_root: str | None = None) -> None:
        self.name = name
        self.python = sys.executable
        self.code_root = str(REPO_ROOT)
        self.work_root = work_root or ""

    def _runner(self) -> invoke.Context:
        return invoke.Context()

    def put(self, local: Path, remote: str) -> None:
        if Path(local).resolve() != Path(remote).resolve():
            Path(remote).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, remote)

    def get(self, remote: str, local: Path) -> None:
        if Path(local).resolve() != Path(remote).resolve():
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(remote, local)


class SshHost(Host):
    """A host over SSH through fabric's Connection (same run model as LocalHost)."""

    def __init__(self, name: str, address: str, *, port: int = 22, user: str | None = None,
                 key_file: str | None = None, python: str = "python3",
                 code_root: str = "/opt/perfpipe", work_root: str = "/var/tmp/perfpipe") -> None:
        import fabric  # imported here: the local default never needs paramiko

        connect_kwargs = {"key_filename": key_file} if key_file else {}
        self.name = name
        self.python = python
        self.code_root = code_root
        self.work_root = work_root
        self._connection = fabric.Connection(address, user=user, port=port,
                                             connect_kwargs=connect_kwargs, connect_timeout=10)

    def _runner(self):
        return self._connection

    def put(self, local: Path, remote: str) -> None:
        self.run(["mkdir", "-p", str(Path(remote).parent)])
        self._connection.put(str(local), remote)

    def get(self, remote: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self._connection.get(remote, str(local))

    def close(self) -> None:
        self._connection.close()

"""A throwaway PostgreSQL server for tests, from the installed server binaries.

    url, stop = start_postgres(tmp_dir)     # postgresql+psycopg://perfpipe:<pw>@127.0.0.1:<port>/postgres
    db_url = create_database(url, "t1")      # a fresh, empty database on that server
    stop()                                   # immediate shutdown, data removed

    server = start_server(tmp_dir)           # the same, as a `Server` that can also go
    server.down(); server.up()               # down and come back (a database outage)

The server listens on 127.0.0.1 on a free port (unix socket in its own directory), with
password (scram) authentication for TCP, fsync off. PostgreSQL refuses to run as root, so
under root initdb/pg_ctl run as the existing `postgres` system user (never created here),
in a private directory under the system temp dir that this user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tasks.ports import free_port

MISSING = ("PostgreSQL server binaries (initdb, pg_ctl) not found: run `make test`, which "
           "installs them (Debian package postgresql)")
USER = "perfpipe"


class PostgresUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    for cand in [shutil.which("pg_ctl"), *sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                                                 reverse=True)]:
        if cand and Path(cand).with_name("initdb").exists():
            return Path(cand).resolve().parent
    raise PostgresUnavailable(MISSING)


def start_postgres(tmpdir: Path | str) -> tuple[str, Callable[[], None]]:
    """Start a server; return (SQLAlchemy URL of its `postgres` database, stop function)."""
    server = start_server(tmpdir)
    return server.url, server.stop


@dataclass
class Server:
    """A running test server: `down()` stops it keeping its data (a database outage),
    `up()` starts it again on the same port, `stop()` ends it for good."""

    url: str
    pg_ctl: Callable[..., None]
    data: Path
    options: str
    base: Path

    running: bool = True

    def down(self) -> None:
        self.pg_ctl("-D", str(self.data), "-m", "fast", "-w", "stop")
        self.running = False

    def up(self) -> None:
        self.pg_ctl("-D", str(self.data), "-l", str(self.base / "server.log"), "-o",
                    self.options, "-w", "-t", "60", "start")
        self.running = True

    def stop(self) -> None:
        try:
            if self.running:
                self.pg_ctl("-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


def start_server(tmpdir: Path | str) -> Server:
    """Start a server (see the module's docstring).

    `tmpdir` holds the server when we are not root; as root the server gets its own
    directory under the system temp dir (pytest's are private to root). Raises
    PostgresUnavailable with what to do when the binaries or the postgres user are missing.
    """
    bindir = _bindir()
    as_root = os.geteuid() == 0
    if as_root:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresUnavailable("running as root and there is no `postgres` system user "
                                      "to run the server as: run `make test`") from None
        base = Path(tempfile.mkdtemp(prefix="perfpipe-pg-"))
        os.chown(base, owner.pw_uid, owner.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    else:
        base = Path(tempfile.mkdtemp(prefix="pg-", dir=tmpdir))
        prefix = []

    def run(*args: str) -> None:
        proc = subprocess.run([*prefix, *args], cwd=base, capture_output=True, text=True,
                              timeout=120)
        if proc.returncode:
            log = base / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise PostgresUnavailable(f"{Path(args[0]).name} failed ({proc.returncode}): "
                                      f"{proc.stderr.strip()}\n{tail}")

    password = secrets.token_hex(12)
    pwfile = base / "pw"
    pwfile.write_text(password + "\n")
    if as_root:
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    if as_root:
        os.chown(sock, owner.pw_uid, owner.pw_gid)
    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}",
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
            "--locale=C", "--no-sync")
        for attempt in range(3):
            port = free_port()
            opts = (f"-h 127.0.0.1 -p {port} -k {sock} -c fsync=off "
                    "-c synchronous_commit=off -c full_page_writes=off")
            try:
                run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"),
                    "-o", opts, "-w", "-t", "60", "start")
                break
            except PostgresUnavailable:
                if attempt == 2:  # the port may have been taken meanwhile: retry
                    raise
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise

    return Server(f"postgresql+psycopg://{USER}:{password}@127.0.0.1:{port}/postgres",
                  lambda *args: run(str(bindir / "pg_ctl"), *args), data, opts, base)


def create_database(server_url: str, name: str) -> str:
    """Create an empty database `name` (dropped first if present); return its URL."""
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)

"""Exclusive locks between processes on this machine: `flock` on a file, which the kernel
releases when its holder dies, so a killed run never leaves a lock behind. The file holds
who has the lock (run, step, pid, since), for the one who waits. A thread that already
holds a lock may take it again (a whole run holding the lab around its steps)."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path


class LockBusy(RuntimeError):
    """The lock stayed taken for as long as the caller would wait."""


_UNKNOWN = "another process"
_mine = threading.local()  # .held: the lock files this thread holds


@contextmanager
def held(path: Path, holder: dict, *, wait_s: float,
         say: Callable[[str], None] = print, what: str = "the lock") -> Iterator[None]:
    """Hold the lock at `path` for the block, waiting up to `wait_s` seconds for it (saying
    once who has it); LockBusy names the holder when the wait runs out."""
    key = str(path.resolve())
    held_here: set[str] = _mine.__dict__.setdefault("held", set())
    if key in held_here:  # taken again by the thread that holds it: it stays held
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, wait_s, say, what)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**holder, "pid": os.getpid(), "since": _now()}).encode(), 0)
        held_here.add(key)
        try:
            yield
        finally:
            held_here.discard(key)
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, wait_s: float, say: Callable[[str], None], what: str) -> None:
    started = time.monotonic()
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _holder(fd)
            waited = time.monotonic() - started
            if waited >= wait_s:
                raise LockBusy(f"{what} is taken by {holder} and stayed so for {wait_s:.0f} s; "
                               f"wait for it to finish") from None
            # the holder writes its name just after it took the lock: give it a moment
            if not told and (holder != _UNKNOWN or waited >= 2):
                say(f"waiting for {what}: taken by {holder}")
                told = True
            time.sleep(0.2)


def _holder(fd: int) -> str:
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        doc = {}
    shown = ", ".join(f"{k} {v}" for k, v in doc.items() if k != "pid")
    return f"{shown} (pid {doc['pid']})" if "pid" in doc else _UNKNOWN


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

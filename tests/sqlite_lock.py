"""A SQLite file held by another writer, for real: a separate process takes an EXCLUSIVE
lock (no one else reads or writes it) and keeps it for `seconds`, or until the block ends.

    with locked_by_another_process(db_path, seconds=30):
        ...  # every connection to db_path now waits, then says "database is locked"
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
"""


def start_holding(path: str, seconds: float) -> subprocess.Popen:
    """Start the holder and return once it has the lock (it lets go after `seconds`)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path, str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    if holder.stdout.readline().strip() != "locked":
        holder.kill()
        raise RuntimeError(f"could not lock {path}: exit {holder.wait()}")
    return holder


@contextmanager
def locked_by_another_process(path: str, seconds: float) -> Iterator[subprocess.Popen]:
    holder = start_holding(path, seconds)
    try:
        yield holder
    finally:
        holder.kill()
        holder.wait()

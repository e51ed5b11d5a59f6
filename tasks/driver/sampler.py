"""Broker-side sampler: CPU and RSS of the broker process, one row per second.

``python -m tasks.driver.sampler --pid PID --until UNIX_SECONDS --out DIR`` writes
``broker.csv`` (`tasks.driver.output.SAMPLER_COLUMNS`) from /proc, standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .output import SAMPLER_COLUMNS, SAMPLER_FILE, write_csv

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def read_proc(pid: int) -> tuple[int, int] | None:
    """(user+system CPU ticks, RSS bytes) of a process, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        statm = Path(f"/proc/{pid}/statm").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(statm.split()[1]) * _PAGE


def sample(pid: int, until: float, out_dir: Path) -> list[tuple[int, float, int]]:
    rows = []
    previous = read_proc(pid)
    last_t = time.time()
    while previous is not None and time.time() < until:
        time.sleep(1.0 - (time.time() % 1.0))  # tick on whole seconds
        now = time.time()
        current = read_proc(pid)
        if current is None:
            break
        cpu_pct = 100.0 * (current[0] - previous[0]) / _TICKS / max(now - last_t, 1e-6)
        rows.append((int(now) - 1, round(cpu_pct, 2), current[1]))
        previous, last_t = current, now
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / SAMPLER_FILE, SAMPLER_COLUMNS, rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.driver.sampler", description=__doc__)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--until", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = sample(args.pid, args.until, args.out)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())

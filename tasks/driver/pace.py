"""Host pace: how much CPU time this host takes, right now, for one fixed piece of work.

On a shared VM the same broker spends more or less CPU per message from one run to the next
as the host runs it faster or slower (other tenants on the same physical cores, presumably:
not measured). A broker-cost figure judged night against night carries that; the pace, read
beside it on the broker host, measures part of it: how much is in bench/README.md
("host_pace.py"). The work is interpreter work (a short loop of integer arithmetic), timed
in this thread's CPU time, so time the sampler spends descheduled is not counted; in
exploratory runs it followed the broker's cost more closely than hashing 512 KB did, and
more closely than striding through 32 MB in one batch of two (as closely in the other). The
sampler's `PaceProbe` reads it four times a second (one round each: about 0.15% of a core),
at whatever phase it started rather than on the sampler's whole seconds, and keeps the
median of each second's readings.

Standard library only (this module ships to hosts).
"""

from __future__ import annotations

import statistics
import threading
import time

WORK_STEPS = 5000  # about 0.3 ms of CPython on this machine
ROUNDS = 3  # a reading is the median of this many: one interrupted round does not move it


def _work(steps: int) -> int:
    x = 0
    for i in range(steps):
        x = (x * 31 + i) & 0xFFFF
    return x


def pace_ns(rounds: int = ROUNDS, steps: int = WORK_STEPS) -> int:
    """The median CPU time, in ns, of `rounds` runs of the fixed work in this thread."""
    if rounds < 1 or steps < 1:
        raise ValueError(f"pace_ns: rounds and steps must be at least 1, not {rounds}, {steps}")
    times = []
    for _ in range(rounds):
        started = time.thread_time_ns()
        _work(steps)
        times.append(time.thread_time_ns() - started)
    return int(statistics.median(times))


class PaceProbe:
    """The pace (`pace_ns`, `rounds` rounds) read every `every_s` seconds on a thread of its
    own; `take` gives the median of the readings since the last take."""

    def __init__(self, every_s: float = 0.25, rounds: int = 1) -> None:
        self.every_s, self.rounds = every_s, rounds
        self._readings: list[int] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._read, name="pace", daemon=True)

    def start(self) -> PaceProbe:
        """One reading now (so the first second has one, however soon it ends), then the
        thread's."""
        self.add(pace_ns(self.rounds))
        self._thread.start()
        return self

    def _read(self) -> None:
        while not self._stopped.wait(self.every_s):
            self.add(pace_ns(self.rounds))

    def add(self, reading_ns: int) -> None:
        with self._lock:
            self._readings.append(reading_ns)

    def take(self) -> int | None:
        """The median reading since the last take, None when there was none."""
        with self._lock:
            readings, self._readings = self._readings, []
        return int(statistics.median(readings)) if readings else None

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(5)

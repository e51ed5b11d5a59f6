"""LocalHost's process control against real processes: liveness and a stopped group."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tasks.hosts import LocalHost


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_a_process_that_ended_is_not_alive_before_it_is_reaped():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while proc_state(child.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        os.kill(child.pid, 0)  # a zombie still takes signal 0: kill -0 would say alive
        assert LocalHost().alive(child.pid) is False
        assert LocalHost().alive(os.getpid()) is True
    finally:
        child.wait()
    assert LocalHost().alive(child.pid) is False  # reaped: gone from /proc


def test_a_stopped_group_records_its_exit_code_and_is_no_longer_alive(tmp_path: Path):
    host = LocalHost()
    log = str(tmp_path / "sleep.log")
    group = host.launch(["sleep", "60"], log)
    deadline = time.monotonic() + 5
    while not Path(log + ".pid").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host.alive(group) and host.exit_code(log) is None
    host.stop_group(group, timeout_s=10)
    assert host.exit_code(log) == 143  # 128 + SIGTERM, written by the shell that waited
    assert not host.alive(group)

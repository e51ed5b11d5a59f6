"""The JVM heap of IBM MQ's telemetry (MQXR) service, set through its STARTARG.

The IBM MQ Telemetry report fixes the MQXR heap with ``-J "-Xms4096M" -J "-Xmx4096M"`` in
the STARTARG of SYSTEM.MQXR.SERVICE. IBM MQ cannot run on this machine, so this module
only generates the runmqsc commands (pure, tested on their text); a user runs them with
``runmqsc QMGR`` on the queue manager host.
"""

from __future__ import annotations

import re

SERVICE = "SYSTEM.MQXR.SERVICE"
PLACEHOLDER = "<current STARTARG>"  # in rendered commands: the service's STARTARG, read first
_HEAP_OPTION = re.compile(r'\s*-J\s+"?-Xm[sx]\d+[KMGkmg]?"?')
_SIZE = re.compile(r"^\d+[KMG]$")


def with_heap(startarg: str, xms: str, xmx: str) -> str:
    """STARTARG with any -J -Xms/-Xmx options replaced by the given sizes (e.g. 4096M)."""
    for name, size in (("xms", xms), ("xmx", xmx)):
        if not _SIZE.match(size):
            raise ValueError(f"{name}: {size!r} is not a heap size like 4096M or 4G")
    kept = _HEAP_OPTION.sub("", startarg).strip()
    return f'{kept} -J "-Xms{xms}" -J "-Xmx{xmx}"'.strip()


def mqsc_string(value: str) -> str:
    """An MQSC quoted string: single quotes doubled inside."""
    return "'" + value.replace("'", "''") + "'"


def heap_commands(current_startarg: str, xms: str, xmx: str) -> list[str]:
    """The runmqsc commands that restart MQXR with a fixed heap."""
    return [
        f"STOP SERVICE({SERVICE})",
        f"ALTER SERVICE({SERVICE}) STARTARG({mqsc_string(with_heap(current_startarg, xms, xmx))})",
        f"START SERVICE({SERVICE})",
        f"DISPLAY SERVICE({SERVICE}) STARTARG",
    ]

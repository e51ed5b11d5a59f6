#!/usr/bin/env python3
"""A stand-in for systemctl on a lab host, for the TasksMax tests: systemd cannot run on
this machine (its PID 1 is not systemd), so this is not systemd, only the part of its
behaviour perfpipe's TasksMax relies on (`tasks.tuning.kinds`):

- units are loaded from their drop-ins at a `daemon-reload`, not when a file changes: a
  `show` after a drop-in was written but not reloaded still says the old value;
- a unit's drop-ins (`/etc/systemd/system/UNIT.d/*.conf`) are read in file-name order,
  the last `TasksMax=` wins; with none, a user slice has the default below;
- `show -p TasksMax --value UNIT` prints the loaded value.

Anything else exits 1 saying it is not in the stand-in. The loaded values live in
/run/systemd/standin-units.json, and every reload is counted there.
Standard library only: it runs on the lab host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

UNITS = Path("/etc/systemd/system")
STATE = Path("/run/systemd/standin-units.json")
DEFAULT = "10813"  # systemd's TasksMax default for a user slice: 33% of a pid_max of 32768


def configured(unit: str) -> str:
    value = DEFAULT
    for dropin in sorted((UNITS / f"{unit}.d").glob("*.conf")):
        for line in dropin.read_text().splitlines():
            if line.strip().startswith("TasksMax="):
                value = line.split("=", 1)[1].strip()
    return value


def loaded() -> dict:
    return json.loads(STATE.read_text()) if STATE.exists() else {"reloads": 0, "units": {}}


def main(argv: list[str]) -> int:
    state = loaded()
    if argv == ["daemon-reload"]:
        units = {d.name[:-2] for d in UNITS.glob("*.d")} | set(state["units"])
        state = {"reloads": state["reloads"] + 1,
                 "units": {unit: configured(unit) for unit in units}}
        STATE.write_text(json.dumps(state))
        return 0
    if len(argv) == 5 and argv[:4] == ["show", "-p", "TasksMax", "--value"]:
        # a unit with no drop-in at the last reload has the default; before any, the files
        print(state["units"].get(argv[4], DEFAULT) if STATE.exists() else configured(argv[4]))
        return 0
    print(f"systemctl {' '.join(argv)}: not in this stand-in (tests/systemctl_standin.py)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

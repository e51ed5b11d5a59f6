"""The SSH lab for tests: `infra/lab/lab.py up` once per session, down again unless it was
already up before the tests started (a developer's own lab is left as it was)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "infra" / "lab" / "lab.py"
INVENTORY = REPO / "infra" / "inventories" / "lab.yml"
STATE = REPO / ".state" / "lab"


def lab_is_up() -> bool:
    out = subprocess.run([sys.executable, str(LAB), "status"], capture_output=True, text=True)
    return out.returncode == 0 and all(h["namespace"] and h["sshd"]
                                       for h in json.loads(out.stdout).values())


def up() -> dict:
    out = subprocess.run([sys.executable, str(LAB), "up"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"lab up failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def down() -> None:
    subprocess.run([sys.executable, str(LAB), "down"], capture_output=True, text=True, check=True)

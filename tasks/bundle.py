"""The driver bundle shipped to SSH hosts: one zip with `tasks.driver` and the pinned paho.

Python imports pure-Python packages straight from a zip on PYTHONPATH, so a driver host
needs only a Python 3.10+ interpreter: no package index, no venv, no network, and exactly
the paho-mqtt version the pipeline was tested with. The zip is reproducible (sorted entries,
fixed timestamps), and named by its hash, so re-provisioning uploads nothing when nothing
changed.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import paho

from .settings import REPO_ROOT

_FIXED_TIME = (2020, 1, 1, 0, 0, 0)


def _sources() -> list[tuple[str, Path]]:
    files = [("tasks/__init__.py", REPO_ROOT / "tasks" / "__init__.py")]
    files += [(f"tasks/driver/{p.name}", p) for p in sorted((REPO_ROOT / "tasks" / "driver").glob("*.py"))]
    paho_root = Path(paho.__path__[0])
    files += [(f"paho/{p.relative_to(paho_root)}", p) for p in sorted(paho_root.rglob("*.py"))]
    return files


def build(out_dir: Path) -> Path:
    """Write the bundle into out_dir (unless it is there, whole); returns its path. It is
    written under another name and renamed, and a file of its name with other bytes (a
    write cut short by a full disk or a kill) is written again: provision ships this file
    and checks the hosts' copies against it, so a broken one would go everywhere."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in _sources():
            info = zipfile.ZipInfo(name, _FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    path = Path(out_dir) / f"perfpipe-driver-{hashlib.sha256(data).hexdigest()[:12]}.zip"
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_bytes(data)
        partial.replace(path)
    return path

"""The raw files' manifest (`rundir.MANIFEST`): what the collect step saw of every raw
file (size and SHA-256), and the check that they are still what it saw.

The collect step writes it once every host's files are in the run folder; the Spark job
checks each stage's files against it before it reads them, so a file that changed or
went away since (a driver still writing after its stage, an edit by hand, a partial
copy) makes its stage incomplete instead of silently changing the metrics.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def entry(path: Path) -> dict:
    """One file's manifest entry."""
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def changed_since(run_dir: Path, files: dict[str, dict], prefix: str) -> list[str]:
    """The manifest's files under `prefix` (relative to the run folder) that are gone or
    differ from what the manifest says, each as one line."""
    lines = []
    for rel, seen in sorted(files.items()):
        if not rel.startswith(prefix):
            continue
        path = run_dir / rel
        if not path.is_file():
            lines.append(f"{rel} is gone since collect")
            continue
        size = path.stat().st_size
        if size != seen["bytes"] or file_sha256(path) != seen["sha256"]:
            lines.append(f"{rel} changed since collect ({seen['bytes']:,} bytes then, "
                         f"{size:,} now)")
    return lines

"""What makes two runs comparable, as short hashes: one hash function, one list of host
facts. Pure.

A host's hash covers the facts that change performance (CPU, memory, kernel, OS, Python,
paho), not its clock offset or the time of day. The tuning read back on a host is a hash
of its own. A run's fingerprint combines every host's hash, every tuning hash and the
broker kind; comparisons key on it, and the report shows the host hashes it is made of.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

# The host facts that make two runs comparable.
HOST_KEYS = ("cpu_model", "cpus", "memory_bytes", "kernel", "arch", "os", "python", "paho_mqtt")


def fingerprint_hash(document: Any) -> str:
    """First 16 hex chars of the sha256 of the canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def host_facts(facts: dict) -> dict:
    """The comparable part of a host's fingerprint: HOST_KEYS only."""
    return {key: facts.get(key) for key in HOST_KEYS}


def host_hash(facts: dict) -> str:
    return fingerprint_hash(host_facts(facts))


def tuning_hash(entries: Iterable[dict]) -> str:
    """The tuning values read back on a host: (kind, key, value after) of every entry."""
    return fingerprint_hash(sorted([e["kind"], e["key"], e["after"]] for e in entries))


def run_hash(host_hashes: Iterable[str], tuning_hashes: Iterable[str], broker_kind: str) -> str:
    """A run's fingerprint. The broker version is deliberately not in it: a new broker build
    must be compared with the history of the old one, or a regression it brings could never
    be seen."""
    return fingerprint_hash([list(host_hashes), list(tuning_hashes), broker_kind])

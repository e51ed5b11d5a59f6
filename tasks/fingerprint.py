"""What makes two runs comparable: the hosts and tuning as short hashes (one hash function,
one list of host facts), and a stage's setup. Pure.

A host's hash covers the facts that change performance (CPU, memory, kernel, OS, Python,
paho), not its clock offset or the time of day. The tuning read back on a host is a hash
of its own. A run's fingerprint combines every host's hash, every tuning hash, the
broker kind and perfpipe's measurement version; comparisons key on it, and the report
shows the host hashes it is made of.
Within a fingerprint, two nights of a stage are comparable when its setup (what its
recorded params say it measured) is the same (`setup_changes`, `measured_alike`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import MISSING, fields
from typing import Any

from .catalog.scenarios import ConnectionSettings, SearchSettings
from .catalog.stages import GroupStage

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


# perfpipe's own way of measuring. Raise it with a change that moves what a metric reads
# for the same broker (how the driver times or counts sends and receives, how the
# aggregation defines a metric, and what the driver's own CPU a message is: the broker's
# cost and e2e p50 are judged at it, so a cheaper driver would read as a costlier,
# slower broker), so that the nights before and after it are not compared: a new history
# starts, as on new hosts. Version 1 is in no hash, so the fingerprints recorded before
# this version existed still match the nights after it.
MEASUREMENT_VERSION = 1


def run_hash(host_hashes: Iterable[str], tuning_hashes: Iterable[str], broker_kind: str,
             measurement: int | None = None, broker_cpus: str | None = None) -> str:
    """A run's fingerprint: its hosts, their tuning, the broker kind, perfpipe's
    measurement version (`MEASUREMENT_VERSION` unless given) and the CPUs the broker was
    kept on (`broker.cpus`, with the stages it was kept there for where not all, as
    `tasks.catalog.cpus.placement` names them; none is in no hash, so the fingerprints of
    runs that placed nothing are as before). The broker version is deliberately not in
    it: a new broker build must be compared with the history of the old one, or a
    regression it brings could never be seen."""
    document: list = [list(host_hashes), list(tuning_hashes), broker_kind]
    measurement = MEASUREMENT_VERSION if measurement is None else measurement
    if measurement != 1:
        document.append(f"measurement {measurement}")
    if broker_cpus:
        document.append(f"broker cpus {broker_cpus}")
    return fingerprint_hash(document)


# What a stage's recorded params say it measured: two nights of a stage are comparable only
# when none of these differ (`setup_changes`). Not its name, its place in the suite or its
# cool-down, nor what a search found (`search_outcome`). `drivers` (host -> driver
# processes that ran clients) is added when the stage is recorded
# (`tasks.catalog.placement.recorded_params`).
SETUP_FIELDS = ("qos", "groups", "warmup_s", "measure_s", "connection", "search", "drivers")
# Settings that do not change what is measured, or only by being set: where a search starts,
# credentials and the paths of TLS files (mutual TLS on or off is a change, a moved file not).
IGNORED = ("search.warm_start",)
PRESENCE_ONLY = ("connection.username", "connection.password_env", "connection.password_file",
                 "connection.tls.ca_file", "connection.tls.cert_file", "connection.tls.key_file")
_GROUP_DEFAULTS = {f.name: f.default for f in fields(GroupStage) if f.default is not MISSING}


def setup_changes(before: dict, after: dict) -> list[str]:
    """What differs between two nights' params of a stage in what it measured, one
    "path: old -> new" each; [] when the nights are comparable. A top-level field that one
    of them has no record of (recorded by an older perfpipe) is no difference; settings a
    night lacks have their defaults (its groups, connection and search settings are
    completed from their models)."""
    changes = []
    for name in SETUP_FIELDS:
        if name in before and name in after:
            old, new = (_leaves(name, _complete(name, night[name])) for night in (before, after))
            for path in sorted(old.keys() | new.keys()):
                was, now = old.get(path, "unset"), new.get(path, "unset")
                if was != now:
                    changes.append(f"{path}: {was} -> {now}")
    return changes


def measured_alike(recorded: dict | None, params: dict) -> bool:
    """Whether a night whose stage recorded `recorded` measured the setup of `params`
    (`setup_changes` finds nothing). Each setup's nights are a history of their own, kept
    beside the others as histories of host fingerprints are: a night of another setup in
    between (a manual run of another suite) neither joins tonight's history nor ends it."""
    return not setup_changes(recorded or {}, params)


def _complete(name: str, value: Any) -> Any:
    """A recorded setting with its model's defaults filled in, as tonight's would have
    them; as recorded when it no longer fits the model."""
    model = {"connection": ConnectionSettings, "search": SearchSettings}.get(name)
    if model is not None and isinstance(value, dict):
        try:
            return model.model_validate(value).model_dump(exclude_none=name == "connection")
        except ValueError:
            return value
    if name == "groups" and isinstance(value, (list, tuple)):  # by name, as `_leaves` walks
        return {g.get("group", i): {**_GROUP_DEFAULTS, **g} for i, g in enumerate(value)}
    return value


def _leaves(path: str, value: Any) -> dict[str, Any]:
    """A setting as path -> scalar (lists whole), IGNORED left out, PRESENCE_ONLY as "set"."""
    if path in IGNORED:
        return {}
    if path in PRESENCE_ONLY:
        return {} if value is None else {path: "set"}
    if isinstance(value, dict):
        return {leaf: v for key, item in value.items()
                for leaf, v in _leaves(f"{path}.{key}", item).items()}
    return {path: list(value) if isinstance(value, (list, tuple)) else value}

"""Step 3, tune (per host): compare a tuning profile with what the host has, and record it.

This first version reads every value back and records drift (mode `check`); applying and
restoring over SSH come with the lab hosts. Keys are validated before they reach a shell.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .config_files import load_model
from .hosts import Host
from .run_context import RunContext

SYSCTL_KEY = re.compile(r"^[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+$")


class TuningProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    mode: str = Field("check", pattern="^check$", description="only 'check' is supported so far")
    sysctl: dict[str, str] = Field(default_factory=dict)

    @field_validator("sysctl")
    @classmethod
    def _keys(cls, values: dict[str, str]) -> dict[str, str]:
        bad = [k for k in values if not SYSCTL_KEY.match(k)]
        if bad:
            raise ValueError(f"not sysctl keys: {bad} (expected dotted names like net.core.somaxconn)")
        return values


def load_profile(tuning_dir: Path, name: str) -> TuningProfile:
    path = Path(tuning_dir) / f"{name}.yml"
    if not path.exists():
        known = sorted(p.stem for p in Path(tuning_dir).glob("*.yml"))
        raise FileNotFoundError(f"{path}: no tuning profile {name!r}; known: {known}")
    return load_model(TuningProfile, path)


def read_sysctl(host: Host, key: str) -> str | None:
    if not SYSCTL_KEY.match(key):
        raise ValueError(f"sysctl key {key!r} rejected")
    result = host.run(["cat", "/proc/sys/" + key.replace(".", "/")], check=False)
    return " ".join(result.stdout.split()) if result.ok else None


def check_host(host: Host, profile: TuningProfile) -> list[dict]:
    entries = []
    for key, wanted in profile.sysctl.items():
        value = read_sysctl(host, key)
        entries.append({"kind": "sysctl", "key": key, "wanted": wanted, "before": value,
                        "after": value, "ok": value == " ".join(wanted.split())})
    return entries


def tune_host(ctx: RunContext, host_name: str) -> dict:
    """Record the profile's values on one host; returns a small summary."""
    name = ctx.inventory.tuning_profile
    if not name:
        return {"host": host_name, "profile": None, "drift": 0}
    profile = load_profile(ctx.settings.tuning_dir, name)
    entries = check_host(ctx.host(host_name), profile)
    values = json.dumps([(e["key"], e["after"]) for e in entries], sort_keys=True)
    snapshot = {"host": host_name, "profile": name, "mode": profile.mode, "entries": entries,
                "values_hash": hashlib.sha256(values.encode()).hexdigest()[:16]}
    ctx.write_json(f"tuning/{host_name}.json", snapshot)
    ctx.store().record_tuning(ctx.run_id, host_name, name, entries)
    return {"host": host_name, "profile": name, "drift": sum(not e["ok"] for e in entries)}

"""Tuning profiles (YAML under infra/tuning/): what to set on a host, each value traceable
to the report table it comes from. Every value that will reach a shell is validated here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..brokers.qmini import QmIni
from ..config_files import load_model

SYSCTL_KEY = re.compile(r"^[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+$")
SYSCTL_VALUE = re.compile(r"^[0-9A-Za-z_.:-]+( [0-9A-Za-z_.:-]+)*$")
LIMITS_DOMAIN = re.compile(r"^(\*|@?[a-z_][a-z0-9_-]{0,31})$")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
LIMIT_ITEMS = ("nofile", "nproc", "stack", "core", "memlock", "rtprio", "as", "fsize")


class LimitEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domain: str = Field(description="user, @group or *")
    type: Literal["soft", "hard", "-"]
    item: Literal[LIMIT_ITEMS]  # type: ignore[valid-type]
    value: str = Field(pattern=r"^([0-9]{1,12}|unlimited|-1)$")

    @field_validator("domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        if not LIMITS_DOMAIN.match(value):
            raise ValueError("must be a user name, @group or * (limits.conf domain)")
        return value

    @model_validator(mode="after")
    def _nofile_is_a_number(self) -> LimitEntry:
        if self.item == "nofile" and self.value in ("unlimited", "-1"):
            raise ValueError("value: nofile cannot be unlimited (the kernel caps it at "
                             "fs.nr_open, and PAM refuses a login whose limit it cannot "
                             "set, ssh included); give a number")
        return self


class TasksMax(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(description="whose tasks (systemd user-UID.slice, or a pids cgroup)")
    value: int = Field(ge=1)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not USER_NAME.match(value):
            raise ValueError("must be a user name")
        return value


class JvmHeap(BaseModel):
    model_config = ConfigDict(extra="forbid")

    service: Literal["activemq", "mqxr"]
    xms: str = Field(pattern=r"^[0-9]{1,7}[KMG]$", description="initial heap, e.g. 4096M")
    xmx: str = Field(pattern=r"^[0-9]{1,7}[KMG]$", description="maximum heap, e.g. 4096M")
    queue_manager: str | None = Field(None, pattern=r"^[A-Za-z0-9._%/]{1,48}$",
                                      description="mqxr: the queue manager for runmqsc")

    @model_validator(mode="after")
    def _xms_within_xmx(self) -> JvmHeap:
        if heap_bytes(self.xms) <= 0 or heap_bytes(self.xms) > heap_bytes(self.xmx):
            raise ValueError(f"xms {self.xms} must be more than 0 and at most xmx {self.xmx}: "
                             "the JVM does not start otherwise")
        return self


def heap_bytes(size: str) -> int:
    """'4096M' -> bytes."""
    return int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]]


class TuningProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    source: str = ""
    sysctl: dict[str, str] = Field(default_factory=dict)
    limits: list[LimitEntry] = Field(default_factory=list)
    tasks_max: TasksMax | None = None
    qm_ini: QmIni | None = None
    jvm_heap: JvmHeap | None = None

    @field_validator("sysctl")
    @classmethod
    def _sysctl(cls, values: dict[str, str]) -> dict[str, str]:
        for key, value in values.items():
            if not SYSCTL_KEY.match(key):
                raise ValueError(f"{key!r} is not a sysctl key (dotted, like net.core.somaxconn)")
            if not SYSCTL_VALUE.match(" ".join(str(value).split())):
                raise ValueError(f"{key}: value {value!r} has characters a sysctl value cannot have")
        return {k: " ".join(str(v).split()) for k, v in values.items()}


def load_profile(tuning_dir: Path, name: str) -> TuningProfile:
    path = Path(tuning_dir) / f"{name}.yml"
    if not path.exists():
        known = sorted(p.stem for p in Path(tuning_dir).glob("*.yml"))
        raise FileNotFoundError(f"{path}: no tuning profile {name!r}; known: {known}")
    return load_model(TuningProfile, path)

"""The scenario catalog: YAML files under scenarios/, validated with errors that name the
file, the field and the fix. A suite is a named list of scenarios in scenarios/suites.yml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .config_files import ConfigError, load_model, read_yaml

GROUP = r"^[a-z][a-z0-9_]{0,30}$"


class PublisherGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str = Field(pattern=GROUP)
    count: int = Field(ge=1, description="publishers at 100% of clients")
    topic: str = Field(description="topic template: {scenario}, {group}, {i} (client index)")
    rate_per_client: float = Field(gt=0, description="messages/s per publisher at 100% rate")
    payload_bytes: int = Field(256, ge=32, le=268_435_455)

    @field_validator("topic")
    @classmethod
    def _no_wildcards(cls, topic: str) -> str:
        if "+" in topic or "#" in topic:
            raise ValueError("a publisher topic cannot contain + or # (those are for subscribers)")
        return topic


class SubscriberGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str = Field(pattern=GROUP)
    count: int = Field(ge=1)
    topics: list[str] = Field(min_length=1, description="topic filter templates")
    scale_with_clients: bool = Field(False, description="true: count scales with clients_pct")


class StagePlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clients_pct: list[int] = Field([100], min_length=1)
    rate_pct: list[int] = Field([100], min_length=1)
    warmup_s: int = Field(2, ge=0)
    measure_s: int = Field(10, ge=1)
    cooldown_s: int = Field(2, ge=0)

    @field_validator("clients_pct", "rate_pct")
    @classmethod
    def _percentages(cls, values: list[int]) -> list[int]:
        if any(not 0 < v <= 1000 for v in values):
            raise ValueError("percentages must be in 1..1000")
        if values != sorted(set(values)):
            raise ValueError("list the steps once each, from low to high (ramp up from below peak)")
        return values


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    description: str = ""
    source: str = Field("", description="the report and test this scenario reproduces")
    qos: list[Literal[0, 1, 2]] = Field([0], min_length=1)
    publishers: list[PublisherGroup] = Field(min_length=1)
    subscribers: list[SubscriberGroup] = Field(default_factory=list)
    stages: StagePlan = Field(default_factory=StagePlan)
    full_scale: dict[str, Any] = Field(default_factory=dict,
                                       description="the report's full-scale values, for reference")

    @model_validator(mode="after")
    def _unique_groups(self) -> Scenario:
        groups = [g.group for g in self.publishers] + [g.group for g in self.subscribers]
        if len(groups) != len(set(groups)):
            raise ValueError("group names must be unique across publishers and subscribers")
        return self


class Suites(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suites: dict[str, list[str]]


def load_catalog(scenarios_dir: Path) -> dict[str, Scenario]:
    """Every scenario under scenarios_dir/catalog/, keyed by name (file stem must match)."""
    catalog: dict[str, Scenario] = {}
    for path in sorted((Path(scenarios_dir) / "catalog").glob("*.yml")):
        scenario = load_model(Scenario, path)
        if scenario.name != path.stem:
            raise ConfigError(f"{path}: name: {scenario.name!r} must match the file name "
                              f"({path.stem!r}); rename one of them")
        catalog[scenario.name] = scenario
    return catalog


def load_suite(scenarios_dir: Path, suite: str) -> list[Scenario]:
    path = Path(scenarios_dir) / "suites.yml"
    suites = load_model(Suites, path) if path.exists() else Suites(suites={})
    if suite not in suites.suites:
        raise ConfigError(f"{path}: suites: no suite {suite!r}; known: {sorted(suites.suites)}")
    catalog = load_catalog(scenarios_dir)
    missing = [name for name in suites.suites[suite] if name not in catalog]
    if missing:
        raise ConfigError(f"{path}: suites.{suite}: unknown scenarios {missing}; "
                          f"add scenarios/catalog/<name>.yml or fix the name")
    return [catalog[name] for name in suites.suites[suite]]


__all__ = ["Scenario", "PublisherGroup", "SubscriberGroup", "StagePlan", "load_catalog",
           "load_suite", "ConfigError", "read_yaml"]

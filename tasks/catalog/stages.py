"""Stage expansion: a scenario becomes stages (QoS x client steps x rate steps), and a
max-rate search template becomes probe stages. Pure functions, no I/O.

Where each stage's clients run is `tasks.catalog.placement`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from .scenarios import Scenario, rate_for, warmup_for


@dataclass(frozen=True)
class GroupStage:
    group: str
    role: str  # "pub" | "sub"
    count: int
    topics: tuple[str, ...]  # one topic for publishers (template), filters for subscribers
    rate_per_client: float = 0.0
    payload_bytes: int = 0
    topic_count: int = 0  # publishers: cycle over {n} in 0..topic_count-1 (0: one topic)
    topic_split: str = "shared"  # "shared" | "partitioned" (each publisher its own slice)
    clean_session: bool | None = None  # None: the stage's connection.clean_session
    share_group: str | None = None  # subscribers: $share/<share_group>/<filter>


@dataclass(frozen=True)
class Stage:
    stage_id: str
    scenario: str
    index: int
    qos: int
    clients_pct: int
    rate_pct: int
    groups: tuple[GroupStage, ...]
    warmup_s: int
    measure_s: int
    cooldown_s: int
    connection: dict = field(default_factory=dict)  # ConnectionSettings, unset fields left out
    search: dict | None = None  # a max-rate search template: its SearchSettings (not run)
    probe_of: str | None = None  # a probe stage: the search template it belongs to

    @property
    def publishers(self) -> int:
        return sum(g.count for g in self.groups if g.role == "pub")

    @property
    def subscribers(self) -> int:
        return sum(g.count for g in self.groups if g.role == "sub")

    @property
    def target_publish_rate(self) -> float:
        return sum(g.count * g.rate_per_client for g in self.groups if g.role == "pub")

    @property
    def duration_s(self) -> int:
        return self.warmup_s + self.measure_s + self.cooldown_s

    @property
    def in_search(self) -> bool:
        """A max-rate search's template, or one of its probes or holds."""
        return self.search is not None or self.probe_of is not None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> Stage:
        groups = tuple(GroupStage(**{**g, "topics": tuple(g["topics"])}) for g in doc["groups"])
        return cls(**{**doc, "groups": groups})


def _scaled(count: int, pct: int) -> int:
    return max(1, math.ceil(count * pct / 100))


def expand(scenario: Scenario) -> list[Stage]:
    """Every stage of a scenario, in run order: per QoS, clients then rate stepping up."""
    plan = scenario.stages
    connection = scenario.connection.model_dump(exclude_none=True)
    stages = []
    for qos in scenario.qos:
        for clients_pct in plan.clients_pct:
            for rate_pct in plan.rate_pct:
                groups = []
                for g in scenario.publishers:
                    count = _scaled(g.count, clients_pct) if g.scale_with_clients else g.count
                    if g.rate_per_client is not None:
                        rate = rate_for(g.rate_per_client, qos)
                    else:
                        rate = rate_for(g.aggregate_rate, qos) / count
                    topic_count = 0
                    if g.topic_count is not None:
                        topic_count = (_scaled(g.topic_count, clients_pct)
                                       if g.topics_scale_with_clients else g.topic_count)
                        if g.topic_split == "partitioned":
                            topic_count = max(topic_count, count)
                    groups.append(GroupStage(
                        g.group, "pub", count, (g.topic,), rate * rate_pct / 100,
                        g.payload_bytes, topic_count, g.topic_split, g.clean_session))
                for g in scenario.subscribers:
                    groups.append(GroupStage(
                        g.group, "sub",
                        _scaled(g.count, clients_pct) if g.scale_with_clients else g.count,
                        tuple(g.topics), clean_session=g.clean_session,
                        share_group=g.share_group))
                min_rate = min(g.rate_per_client for g in groups if g.role == "pub")
                search = plan.search.model_dump() if plan.search else None
                stage_id = (f"{scenario.name}.q{qos}.c{clients_pct}."
                            + ("search" if search else f"r{rate_pct}"))
                stages.append(Stage(stage_id, scenario.name, len(stages), qos, clients_pct,
                                    rate_pct, tuple(groups), warmup_for(plan, min_rate),
                                    plan.measure_s, plan.cooldown_s, connection, search))
    return stages


def expand_all(scenarios: list[Scenario]) -> list[Stage]:
    """Every stage of a suite's scenarios, in run order."""
    return [stage for scenario in scenarios for stage in expand(scenario)]


def is_probe(row: dict) -> bool:
    """A stored stage (a `Store.stages` row) that is a max-rate search's probe or hold: its
    rate depends on the night, so the search's own stage speaks for it (compared, told and
    exported in its place)."""
    return bool((row.get("params") or {}).get("probe_of"))


def is_search(row: dict) -> bool:
    """A stored stage that is a max-rate search's own (its capacity), not one of its
    probes or holds."""
    return bool((row.get("params") or {}).get("search")) and not is_probe(row)


def probe_id(template_id: str, number: int, hold: bool = False) -> str:
    """The stage id of probe `number` (from 1) of a search template, or of its hold."""
    return f"{template_id}.{'h' if hold else 'p'}{number}"


def probe(template: Stage, rate: float, number: int, hold_s: int = 0) -> Stage:
    """Probe `number` of a search template: the same clients, all publishers scaled so
    they offer `rate` msg/s together. A hold (`hold_s`) is a probe whose measure window is
    that long, named `<template>.h<number>`."""
    factor = rate / template.target_publish_rate
    groups = tuple(replace(g, rate_per_client=g.rate_per_client * factor) if g.role == "pub"
                   else g for g in template.groups)
    return replace(template, stage_id=probe_id(template.stage_id, number, hold=bool(hold_s)),
                   groups=groups, rate_pct=max(1, round(template.rate_pct * factor)),
                   search=None, probe_of=template.stage_id,
                   measure_s=hold_s or template.measure_s)


def search_duration(probe_s: int, search: dict) -> str:
    """How long a search stage may run (`search`: its `SearchSettings`, dumped): its
    probes, then its holds of the rate found, and the one probe or hold run again after a
    stall (tasks/catalog/ratesearch.py)."""
    held = ""
    if search.get("hold_s"):  # a plan stored before holds were a setting has neither
        holds = search["holds"]
        held = f", then at most {holds} hold{'s' if holds > 1 else ''} of {search['hold_s']} s"
    return (f"{probe_s} per probe, at most {search['max_probes']} probes{held}; "
            "one more after a stall")


def stage_rows(stages: list[Stage]) -> list[dict]:
    """The stage table (`perfpipe plan`, the release DAG's log): one row per stage with its
    expected messages; a search template says how its probes will go."""
    rows = []
    for stage in stages:
        row = {"stage": stage.stage_id, "qos": stage.qos, "pubs": stage.publishers,
               "subs": stage.subscribers, "target msg/s": round(stage.target_publish_rate, 1),
               "window s": stage.measure_s,
               "msgs in window": round(stage.target_publish_rate * stage.measure_s),
               "duration s": stage.duration_s}
        if stage.search:  # the probes' rates are chosen while the run goes
            row["target msg/s"] = f"search from {stage.target_publish_rate:g}"
            row["duration s"] = search_duration(stage.duration_s, stage.search)
        rows.append(row)
    return rows

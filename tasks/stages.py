"""Stage expansion and client placement: pure functions, no I/O.

A scenario expands into stages (QoS x client steps x rate steps). A stage's clients are
placed round-robin over every driver process of every driver host, so each process (and
each host, when hosts run the same number of processes) is within one client of even.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from paho.mqtt.client import topic_matches_sub

from .scenarios import Scenario


@dataclass(frozen=True)
class GroupStage:
    group: str
    role: str  # "pub" | "sub"
    count: int
    topics: tuple[str, ...]  # one topic for publishers (template), filters for subscribers
    rate_per_client: float = 0.0
    payload_bytes: int = 0


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
    stages = []
    for qos in scenario.qos:
        for clients_pct in plan.clients_pct:
            for rate_pct in plan.rate_pct:
                groups = [
                    GroupStage(g.group, "pub", _scaled(g.count, clients_pct),
                               (g.topic,), g.rate_per_client * rate_pct / 100, g.payload_bytes)
                    for g in scenario.publishers
                ] + [
                    GroupStage(g.group, "sub",
                               _scaled(g.count, clients_pct) if g.scale_with_clients else g.count,
                               tuple(g.topics))
                    for g in scenario.subscribers
                ]
                stage_id = f"{scenario.name}.q{qos}.c{clients_pct}.r{rate_pct}"
                stages.append(Stage(stage_id, scenario.name, len(stages), qos, clients_pct,
                                    rate_pct, tuple(groups), plan.warmup_s, plan.measure_s,
                                    plan.cooldown_s))
    return stages


def render_topic(template: str, *, scenario: str, group: str, i: int) -> str:
    try:
        return template.format(scenario=scenario, group=group, i=i)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"topic template {template!r} of group {group!r}: unknown "
                         f"placeholder {exc}; use {{scenario}}, {{group}} or {{i}}") from None


@dataclass
class ProcessPlan:
    """The clients one driver process runs in one stage (becomes its spec JSON)."""

    host: str
    proc: int
    publishers: list[dict] = field(default_factory=list)
    subscribers: list[dict] = field(default_factory=list)


def place(stage: Stage, slots: list[tuple[str, int]]) -> list[ProcessPlan]:
    """Spread the stage's clients round-robin over (host, proc) slots.

    `slots` should interleave hosts ((h0,0), (h1,0), (h0,1), ...) so hosts stay even too;
    `driver_slots` builds it that way.
    """
    if not slots:
        raise ValueError("no driver slots: the inventory needs a host with the 'driver' role")
    plans = [ProcessPlan(host, proc) for host, proc in slots]
    turn = 0
    publisher_index = 0
    for group in sorted(stage.groups, key=lambda g: g.role != "sub"):  # subscribers first
        for i in range(group.count):
            target = plans[turn % len(plans)]
            turn += 1
            client_id = f"{group.group}-{target.host}-p{target.proc}-{i}"
            if group.role == "sub":
                topics = [render_topic(t, scenario=stage.scenario, group=group.group, i=i)
                          for t in group.topics]
                target.subscribers.append({"client_id": client_id, "topics": topics,
                                           "qos": stage.qos})
            else:
                publisher_index += 1
                topic = render_topic(group.topics[0], scenario=stage.scenario,
                                     group=group.group, i=i)
                target.publishers.append({
                    "client_id": client_id, "topic": topic, "qos": stage.qos,
                    "publisher_index": publisher_index, "rate": group.rate_per_client,
                    "payload_bytes": group.payload_bytes,
                })
    return [p for p in plans if p.publishers or p.subscribers]


def driver_slots(hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(host, procs) pairs -> (host, proc) slots, interleaving hosts."""
    most = max((procs for _, procs in hosts), default=0)
    return [(name, proc) for proc in range(most) for name, procs in hosts if proc < procs]


def receivers(plans: list[ProcessPlan]) -> dict[str, int]:
    """For each publisher index, how many subscribers should receive each of its messages."""
    filters = [s["topics"] for p in plans for s in p.subscribers]
    return {
        str(pub["publisher_index"]): sum(
            any(topic_matches_sub(f, pub["topic"]) for f in subscriber) for subscriber in filters)
        for p in plans for pub in p.publishers
    }


def expected_delivery_rate(plans: list[ProcessPlan]) -> float:
    counts = receivers(plans)
    return sum(pub["rate"] * counts[str(pub["publisher_index"])]
               for p in plans for pub in p.publishers)


def process_spec(stage: Stage, plan: ProcessPlan, *, run_id: str, broker: dict) -> dict:
    """The JSON spec of one driver process (parsed by tasks.driver.spec)."""
    return {
        "run_id": run_id, "stage_id": stage.stage_id, "host": plan.host, "proc": plan.proc,
        "broker": broker, "publishers": plan.publishers, "subscribers": plan.subscribers,
        "warmup_s": stage.warmup_s, "measure_s": stage.measure_s, "drain_s": stage.cooldown_s,
    }

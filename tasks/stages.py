"""Stage expansion and client placement: pure functions, no I/O.

A scenario expands into stages (QoS x client steps x rate steps). A stage's clients are
placed round-robin over every driver process of every driver host, so each process (and
each host, when hosts run the same number of processes) is within one client of even.

Loss accounting: every message carries its publisher's index and a sequence number, and
`receivers` says how many subscribers should get each message of an index. A publisher
that cycles over several topics (``topic_count``) is several *streams*, one per topic,
each with its own index (``publisher_index`` + position in the cycle) and its own
consecutive sequence numbers, so a subscriber of one topic sees no gaps and a stream's
receivers are exactly the subscribers of its topic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from paho.mqtt.client import topic_matches_sub

from .scenarios import Scenario, rate_for, render_template, warmup_for


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


def probe(template: Stage, rate: float, number: int) -> Stage:
    """Probe `number` of a search template: the same clients, all publishers scaled so
    they offer `rate` msg/s together."""
    factor = rate / template.target_publish_rate
    groups = tuple(replace(g, rate_per_client=g.rate_per_client * factor) if g.role == "pub"
                   else g for g in template.groups)
    return replace(template, stage_id=f"{template.stage_id}.p{number}", groups=groups,
                   rate_pct=max(1, round(template.rate_pct * factor)), search=None,
                   probe_of=template.stage_id)


def render_topic(template: str, *, scenario: str, group: str, i: int, n: int | None = None,
                 client: str | None = None) -> str:
    values: dict = {"scenario": scenario, "group": group, "i": i}
    if n is not None:
        values["n"] = n
    if client is not None:
        values["client"] = client
    try:
        return render_template(template, values)
    except ValueError as exc:
        raise ValueError(f"topic template of group {group!r}: {exc}") from None


def topic_numbers(group: GroupStage, i: int) -> range:
    """The {n} values publisher i of a cycling group goes over."""
    if group.topic_split == "partitioned":
        return range(i * group.topic_count // group.count,
                     (i + 1) * group.topic_count // group.count)
    return range(group.topic_count)


@dataclass
class ProcessPlan:
    """The clients one driver process runs in one stage (becomes its spec JSON)."""

    host: str
    proc: int
    publishers: list[dict] = field(default_factory=list)
    subscribers: list[dict] = field(default_factory=list)
    processes: int = 1  # driver processes of the stage (a total connect rate is split over them)


def place(stage: Stage, slots: list[tuple[str, int]]) -> list[ProcessPlan]:
    """Spread the stage's clients round-robin over (host, proc) slots.

    `slots` should interleave hosts ((h0,0), (h1,0), (h0,1), ...) so hosts stay even too;
    `driver_slots` builds it that way. Publisher indexes are unique in the stage; a
    publisher that cycles over N topics takes N consecutive indexes (one per stream).
    """
    if not slots:
        raise ValueError("no driver slots: the inventory needs a host with the 'driver' role")
    plans = [ProcessPlan(host, proc) for host, proc in slots]
    turn = 0
    publisher_index = 1
    for group in sorted(stage.groups, key=lambda g: g.role != "sub"):  # subscribers first
        for i in range(group.count):
            target = plans[turn % len(plans)]
            turn += 1
            client_id = f"{group.group}-{target.host}-p{target.proc}-{i}"
            names = dict(scenario=stage.scenario, group=group.group, i=i, client=client_id)
            if group.role == "sub":
                topics = [render_topic(t, **names) for t in group.topics]
                if group.share_group:
                    topics = [f"$share/{group.share_group}/{t}" for t in topics]
                client = {"client_id": client_id, "topics": topics, "qos": stage.qos}
                if group.clean_session is not None:
                    client["clean_session"] = group.clean_session
                target.subscribers.append(client)
                continue
            client = {"client_id": client_id, "qos": stage.qos,
                      "publisher_index": publisher_index, "rate": group.rate_per_client,
                      "payload_bytes": group.payload_bytes}
            if group.topic_count:
                cycle = [render_topic(group.topics[0], n=n, **names)
                         for n in topic_numbers(group, i)]
                client["topic"] = cycle[0]
                if len(cycle) > 1:
                    client["topic_cycle"] = cycle
                publisher_index += len(cycle)
            else:
                client["topic"] = render_topic(group.topics[0], **names)
                publisher_index += 1
            if group.clean_session is not None:
                client["clean_session"] = group.clean_session
            target.publishers.append(client)
    used = [p for p in plans if p.publishers or p.subscribers]
    for plan in used:
        plan.processes = len(used)
    return used


def driver_slots(hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(host, procs) pairs -> (host, proc) slots, interleaving hosts."""
    for name, procs in hosts:
        if not isinstance(procs, int):
            raise ValueError(f"host {name}: procs {procs!r} is not resolved; resolve 'auto' "
                             f"with Inventory.driver_procs(cpus) from the host's fingerprint")
    most = max((procs for _, procs in hosts), default=0)
    return [(name, proc) for proc in range(most) for name, procs in hosts if proc < procs]


def streams(publisher: dict) -> list[tuple[int, str]]:
    """(publisher index, topic) of each stream of a placed publisher."""
    cycle = publisher.get("topic_cycle") or [publisher["topic"]]
    return [(publisher["publisher_index"] + k, topic) for k, topic in enumerate(cycle)]


class _Matcher:
    """How many subscribers get a message on a topic: exact filters by dict, wildcards by
    MQTT matching; a subscriber counts once however many of its filters match, and a
    shared subscription group ($share/<g>/...) counts once for the whole group."""

    def __init__(self, plans: list[ProcessPlan]) -> None:
        self.exact: dict[str, list[object]] = {}
        self.wild: list[tuple[object, str]] = []
        self.cache: dict[str, int] = {}
        number = 0
        for plan in plans:
            for subscriber in plan.subscribers:
                number += 1
                for topic in subscriber["topics"]:
                    key: object = number
                    if topic.startswith("$share/"):
                        _, share, topic = topic.split("/", 2)
                        key = ("$share", share)
                    if "+" in topic or "#" in topic:
                        self.wild.append((key, topic))
                    else:
                        self.exact.setdefault(topic, []).append(key)

    def count(self, topic: str) -> int:
        found = self.cache.get(topic)
        if found is None:
            keys = set(self.exact.get(topic, ()))
            keys.update(key for key, f in self.wild if topic_matches_sub(f, topic))
            found = self.cache[topic] = len(keys)
        return found


def receivers(plans: list[ProcessPlan]) -> dict[str, int]:
    """For each publisher (stream) index, how many subscribers should get each message."""
    matcher = _Matcher(plans)
    return {str(index): matcher.count(topic)
            for p in plans for pub in p.publishers for index, topic in streams(pub)}


def expected_delivery_rate(plans: list[ProcessPlan]) -> float:
    counts = receivers(plans)
    total = 0.0
    for p in plans:
        for pub in p.publishers:
            parts = streams(pub)
            total += pub["rate"] / len(parts) * sum(counts[str(i)] for i, _ in parts)
    return total


PASSED_THROUGH = ("clean_session", "keepalive_s", "max_inflight", "max_pending_connects")


def process_spec(stage: Stage, plan: ProcessPlan, *, run_id: str, broker: dict) -> dict:
    """The JSON spec of one driver process (parsed by tasks.driver.spec).

    `broker` is the endpoint (host, port); the stage's connection settings add TLS,
    the user name and a password *reference* (the driver reads the password on its host),
    and the per-process share of the connection rate.
    """
    connection = stage.connection or {}
    endpoint = dict(broker)
    tls = connection.get("tls")
    if tls is not None:
        endpoint["tls"] = True
        for key in ("ca_file", "cert_file", "key_file", "ciphers"):
            if tls.get(key):
                endpoint[key] = tls[key]
        if tls.get("insecure"):
            endpoint["tls_insecure"] = True
        if tls.get("port"):
            endpoint["port"] = tls["port"]
    for key in ("username", "password_env", "password_file"):
        if connection.get(key):
            endpoint[key] = connection[key]
    spec = {
        "run_id": run_id, "stage_id": stage.stage_id, "host": plan.host, "proc": plan.proc,
        "broker": endpoint, "publishers": plan.publishers, "subscribers": plan.subscribers,
        "warmup_s": stage.warmup_s, "measure_s": stage.measure_s, "drain_s": stage.cooldown_s,
    }
    for key in PASSED_THROUGH:
        if connection.get(key) is not None:
            spec[key] = connection[key]
    if connection.get("connect_rate"):
        spec["connect_rate"] = connection["connect_rate"] / max(1, plan.processes)
    return spec

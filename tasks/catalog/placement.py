"""Client placement: which driver process runs which client of a stage, and what each
process is told (its spec). Pure functions, no I/O.

A stage's clients are placed round-robin over every driver process of every driver host,
so each process (and each host, when hosts run the same number of processes) is within
one client of even. A max-rate search's probes and holds run a host's `search_procs`
processes where it sets them (`stage_slots`; why: README, "Capacity: the max-rate search").

Loss accounting: every message carries its publisher's index and a sequence number, and
`receivers` says how many subscribers should get each message of an index. A publisher
that cycles over several topics (``topic_count``) is several *streams*, one per topic,
each with its own index (``publisher_index`` + position in the cycle) and its own
consecutive sequence numbers, so a subscriber of one topic sees no gaps and a stream's
receivers are exactly the subscribers of its topic.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from paho.mqtt.client import topic_matches_sub

from ..driver import limits
from .scenarios import render_template
from .stages import GroupStage, Stage

if TYPE_CHECKING:
    from .inventory import Inventory


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
    _check_host_connections(stage, used)
    return used


def _check_host_connections(stage: Stage, plans: list[ProcessPlan]) -> None:
    per_host: dict[str, int] = {}
    for plan in plans:
        per_host[plan.host] = per_host.get(plan.host, 0) + len(plan.publishers) \
            + len(plan.subscribers)
    for host, clients in sorted(per_host.items()):
        problem = limits.DRIVER_HOST_CLIENTS.problem(clients)
        if problem:
            raise ValueError(f"stage {stage.stage_id}: driver host {host}: {problem}")


def too_many_for_hosts(stage: Stage, driver_hosts: int) -> str | None:
    """Why a stage's clients cannot fit on `driver_hosts` hosts, whatever their process
    counts (known at plan time, before 'auto' is resolved), or None."""
    per_host = math.ceil((stage.publishers + stage.subscribers) / max(driver_hosts, 1))
    problem = limits.DRIVER_HOST_CLIENTS.problem(per_host)
    return problem and (f"stage {stage.stage_id}: {stage.publishers + stage.subscribers:,} "
                        f"clients over {driver_hosts} driver hosts: {problem}")


def driver_slots(hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(host, procs) pairs -> (host, proc) slots, interleaving hosts."""
    for name, procs in hosts:
        if not isinstance(procs, int):
            raise ValueError(f"host {name}: procs {procs!r} is not resolved; resolve 'auto' "
                             f"with Inventory.driver_procs(cpus) from the host's fingerprint")
    most = max((procs for _, procs in hosts), default=0)
    return [(name, proc) for proc in range(most) for name, procs in hosts if proc < procs]


def stage_slots(stage: Stage, inventory: Inventory, cpus: dict[str, int | None]
                ) -> list[tuple[str, int]]:
    """The (host, proc) slots `stage`'s clients are placed on: each driver host's `procs`,
    or its `search_procs` for a max-rate search's probe or hold; `cpus` resolves 'auto'."""
    return driver_slots(inventory.driver_procs(cpus, search=stage.in_search))


def recorded_params(stage: Stage, inventory: Inventory, cpus: dict[str, int | None]) -> dict:
    """A stage as the store records it: its definition and `drivers`, host -> the driver
    processes that run its clients (a search template: its probes'), which are part of
    what it measures (`tasks.fingerprint.setup_changes`)."""
    plans = place(stage, stage_slots(stage, inventory, cpus))  # the slots that got clients
    return {**stage.to_dict(), "drivers": dict(Counter(plan.host for plan in plans))}


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


PASSED_THROUGH = ("clean_session", "keepalive_s", "max_inflight", "max_pending_connects",
                  "tick_us", "read_hold_us")


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
        if tls.get("version"):
            endpoint["tls_version"] = tls["version"]
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

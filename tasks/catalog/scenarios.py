"""The scenario catalog: YAML files under scenarios/, validated with errors that name the
file, the field and the fix. A suite is a named list of scenarios in scenarios/suites.yml.

A scenario is publisher and subscriber groups (TBMQ style) plus how its stages step:

* topics are templates. Placeholders: ``{scenario}``, ``{group}``, ``{i}`` (the client's
  index in its group), ``{client}`` (its client id) and, for a publisher that cycles over
  many topics (``topic_count``), ``{n}`` (the topic number). ``{i}`` and ``{n}`` take
  ``%K`` (modulo) and ``//K`` (integer division): ``fan/{i%5}`` puts client i on one of
  five topics, ``idle/{i//10}`` puts ten clients on each topic;
* a publisher group's rate is ``rate_per_client`` or ``aggregate_rate`` (the whole group,
  split evenly over its publishers), each either one number or one per QoS
  (``{0: 0.3, 1: 0.25, 2: 0.2}``, as the IBM report rates each QoS differently);
* ``connection`` holds what the driver needs to connect: TLS files (paths on the driver
  hosts), a user name with a *reference* to its password (``password_env`` or
  ``password_file``; a password itself never goes into the catalog or a run file),
  clean/persistent sessions, keepalive, the connection rate (connect pacing) and the QoS
  1/2 in-flight window.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictFloat,
    StrictInt,
    Tag,
    field_validator,
    model_validator,
)

from ..config_files import ConfigError, load_model, read_yaml, validate
from ..driver import limits
from ..driver.wire import HEADER_BYTES
from ..metrics import METRICS

GROUP = r"^[a-z][a-z0-9_]{0,30}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
QosRate = Union[StrictFloat, dict[Literal[0, 1, 2], StrictFloat]]


def _not_a_boolean(value: Any) -> Any:
    """YAML's true is Python's 1, and Literal[0, 1, 2] would take it as QoS 1."""
    if isinstance(value, bool):
        raise ValueError(f"must be 0, 1 or 2, got {value}")
    return value


QoS = Annotated[Literal[0, 1, 2], BeforeValidator(_not_a_boolean)]

PLACEHOLDER = re.compile(r"\{([a-z]+)(?:(%|//)(\d+))?\}")
PLACEHOLDERS = ("scenario", "group", "i", "n", "client")
NUMERIC = ("i", "n")


def render_template(template: str, values: dict[str, Any]) -> str:
    """A topic template with its placeholders filled in; ValueError says what is wrong."""

    def one(match: re.Match) -> str:
        name, op, operand = match.groups()
        if name not in values:
            known = ", ".join("{" + p + "}" for p in PLACEHOLDERS if p in values)
            raise ValueError(f"unknown placeholder {{{name}}} in {template!r}; use {known}")
        value = values[name]
        if op:
            if name not in NUMERIC:
                raise ValueError(f"{{{name}{op}{operand}}} in {template!r}: only {{i}} and {{n}} "
                                 f"take % or //")
            k = int(operand)
            if k == 0:
                raise ValueError(f"{{{name}{op}0}} in {template!r}: divide by a number > 0")
            value = value % k if op == "%" else value // k
        return str(value)

    rendered = PLACEHOLDER.sub(one, template)
    if "{" in rendered or "}" in rendered:
        raise ValueError(f"malformed placeholder in {template!r}: write {{name}}, {{i%K}} or "
                         f"{{i//K}} with name one of {', '.join(PLACEHOLDERS)}")
    return rendered


def placeholders(template: str) -> set[str]:
    return {m.group(1) for m in PLACEHOLDER.finditer(template)}


def rate_for(value: QosRate, qos: int) -> float:
    return float(value[qos]) if isinstance(value, dict) else float(value)


def _finite_positive_rates(value: QosRate | None, field: str) -> QosRate | None:
    """Rates as given: finite and > 0 (the bounds per publisher are checked per stage)."""
    rates = value.values() if isinstance(value, dict) else [] if value is None else [value]
    if any(not (math.isfinite(r) and r > 0) for r in rates):
        raise ValueError(f"{field} must be a finite number > 0 messages/s (per QoS if a "
                         f"mapping), got {value}")
    if isinstance(value, dict) and not value:
        raise ValueError(f"{field}: give at least one QoS, e.g. {{0: 10, 1: 5}}")
    return value


def _within(bound: limits.Bound) -> AfterValidator:
    """A field check against one of the driver's bounds, whose message says why."""

    def check(value: float) -> float:
        problem = bound.problem(value)
        if problem:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


Clients = Annotated[StrictInt, _within(limits.GROUP_CLIENTS)]
Seconds = Annotated[StrictInt, _within(limits.STAGE_SECONDS)]


def _topic_checked(topic: str) -> None:
    problem = limits.topic_problem(topic)
    if problem:
        raise ValueError(f"{topic!r} {problem}")


class PublisherGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str = Field(pattern=GROUP)
    count: Clients = Field(ge=1, description="publishers at 100% of clients")
    topic: str = Field(description="topic template: {scenario} {group} {i} {client} {n}")
    rate_per_client: QosRate | None = Field(
        None, description="messages/s per publisher at 100% rate; or one per QoS")
    aggregate_rate: QosRate | None = Field(
        None, description="messages/s of the whole group at 100% rate, split evenly over "
                          "its publishers; or one per QoS")
    payload_bytes: Annotated[StrictInt, _within(limits.PAYLOAD_BYTES)] = Field(
        256, ge=HEADER_BYTES, description=f">= {HEADER_BYTES}: the driver's latency header")
    scale_with_clients: bool = Field(True, description="false: count stays fixed at every "
                                     "clients_pct step (e.g. fan-out's one publisher)")
    topic_count: Annotated[StrictInt, _within(limits.TOPIC_COUNT)] | None = Field(
        None, ge=1, description="cycle over this many topics "
                                    "({n} in the topic): message k goes to topic k mod count")
    topic_split: Literal["shared", "partitioned"] = Field(
        "shared", description="shared: every publisher cycles all topics; partitioned: each "
                              "publisher cycles its own slice of them")
    topics_scale_with_clients: bool = Field(False, description="topic_count scales with "
                                            "clients_pct (e.g. one topic per subscriber)")
    clean_session: bool | None = Field(None, description="default: connection.clean_session")

    @field_validator("topic")
    @classmethod
    def _no_wildcards(cls, topic: str) -> str:
        if "+" in topic or "#" in topic:
            raise ValueError("a publisher topic cannot contain + or # (those are for subscribers)")
        if topic.startswith("$"):
            raise ValueError("a publisher topic cannot start with $ (reserved for the broker)")
        _topic_checked(topic)
        render_template(topic, {"scenario": "s", "group": "g", "i": 0, "n": 0, "client": "c"})
        return topic

    @model_validator(mode="after")
    def _consistent(self) -> PublisherGroup:
        _finite_positive_rates(self.rate_per_client, "rate_per_client")
        _finite_positive_rates(self.aggregate_rate, "aggregate_rate")
        if (self.rate_per_client is None) == (self.aggregate_rate is None):
            raise ValueError("give exactly one of rate_per_client (each publisher) or "
                             "aggregate_rate (the whole group)")
        uses_n = "n" in placeholders(self.topic)
        if self.topic_count is None and uses_n:
            raise ValueError("topic: {n} needs topic_count (how many topics to cycle over)")
        if self.topic_count is not None and not uses_n:
            raise ValueError("topic_count: the topic needs {n} (the topic number), e.g. "
                             "'fanout/{n}'")
        if self.topic_split == "partitioned":
            if self.topic_count is None:
                raise ValueError("topic_split: partitioned needs topic_count")
            if self.topic_count < self.count:
                raise ValueError(f"topic_count: {self.topic_count} topics cannot be partitioned "
                                 f"over {self.count} publishers; raise topic_count to >= count")
        return self


class SubscriberGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: str = Field(pattern=GROUP)
    count: Clients = Field(ge=1)
    topics: list[str] = Field(min_length=1, description="topic filter templates: "
                              "{scenario} {group} {i} {client}")
    scale_with_clients: bool = Field(False, description="true: count scales with clients_pct")
    share_group: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                                    description="subscribe as $share/<share_group>/<filter>: "
                                    "each message goes to one member of the group")
    clean_session: bool | None = Field(None, description="false: a persistent session; "
                                       "default: connection.clean_session")
    expected_publisher_groups: list[str] | None = Field(
        None, description="publisher groups whose messages this group must receive (checked)")

    @field_validator("topics")
    @classmethod
    def _filters(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            _topic_checked(topic)
            if topic.startswith("$share/"):
                raise ValueError(f"{topic!r}: write share_group: <name> instead of $share/")
            rendered = render_template(topic, {"scenario": "s", "group": "g", "i": 0,
                                               "client": "c"})
            levels = rendered.split("/")
            if any(level not in ("+", "#") and set("+#") & set(level) for level in levels) \
                    or "#" in levels[:-1]:
                raise ValueError(f"{topic!r}: '+' and '#' must be whole levels, '#' only last")
        return topics


# A search must resolve half of the smallest max_rate change a night is judged on: a
# coarser one answers on the grid of its warm start (10% below the last capacity, steps
# of 10%), the same rate whatever the broker does within a step, drifting a step a night
SEARCH_PRECISION_MAX = METRICS["max_rate"].min_effect / 2


class SearchSettings(BaseModel):
    """Max-rate search (tasks/catalog/ratesearch.py): the scenario's rate is where it starts."""

    model_config = ConfigDict(extra="forbid")

    growth: float = Field(2.0, gt=1.0, le=10.0, description="rate factor between probes "
                          "until the broker first falls behind")
    precision: float = Field(0.02, gt=0.0, description="stop when the highest rate kept up "
                             "and the lowest that was not are this close (at most half of "
                             "max_rate's minimum effect)")
    max_probes: StrictInt = Field(14, ge=2, le=30)  # enough for 2% from a cold start
    tolerance: float = Field(0.05, gt=0.0, lt=0.5, description="a probe keeps up when it sent "
                             "and received within this of what was asked")
    hold_s: Seconds = Field(0, ge=0, description="hold the rate found this many seconds, "
                        "throughput stable and backlog not rising, before it counts (0: no hold)")
    holds: StrictInt = Field(2, ge=1, le=5, description="hold attempts, each lower than the last "
                         "(tasks/catalog/ratesearch.py)")
    warm_start: bool = Field(True, description="start at 90% of the capacity this stage last "
                             "measured on the same fingerprint and setup, in steps of at "
                             "most 10%, when there is one")

    @field_validator("precision")
    @classmethod
    def _resolves_the_minimum_effect(cls, value: float) -> float:
        if value > SEARCH_PRECISION_MAX:
            raise ValueError(f"{value!r} cannot resolve max_rate's {2 * SEARCH_PRECISION_MAX:.0%} "
                             "minimum effect (a night's answer would fall on its warm start's "
                             f"10% grid, whatever the broker did); give at most "
                             f"{SEARCH_PRECISION_MAX:g}")
        return value


class StagePlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clients_pct: list[StrictInt] = Field([100], min_length=1)
    rate_pct: list[StrictInt] = Field([100], min_length=1)
    warmup_s: Seconds = Field(2, ge=0)
    warmup_iterations: StrictInt | None = Field(
        None, ge=1, le=1_000_000, description="TBMQ style: the warm-up lasts at least long enough for every "
                                "publisher to send this many messages")
    measure_s: Seconds = Field(10, ge=1)
    cooldown_s: Seconds = Field(2, ge=0)
    search: SearchSettings | None = Field(
        None, description="search the highest rate the broker keeps up with, starting at the "
                          "scenario's rate (one probe stage per rate tried)")

    @model_validator(mode="after")
    def _search_starts_at_one_rate(self) -> StagePlan:
        if self.search is not None and len(self.rate_pct) != 1:
            raise ValueError("rate_pct: a search starts from one rate; give one step (e.g. "
                             "[100]) or drop `search`")
        return self

    @field_validator("clients_pct", "rate_pct")
    @classmethod
    def _percentages(cls, values: list[int]) -> list[int]:
        if any(not 0 < v <= 1000 for v in values):
            raise ValueError("percentages must be in 1..1000")
        if values != sorted(set(values)):
            raise ValueError("list the steps once each, from low to high (ramp up from below peak)")
        return values


class TlsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ca_file: str | None = Field(None, description="CA bundle on the driver hosts; default: "
                                "the system's")
    cert_file: str | None = Field(None, description="client certificate on the driver hosts")
    key_file: str | None = Field(None, description="its private key (default: in cert_file)")
    version: str | None = Field(None, description="the one TLS version the clients offer, "
                                "TLSv1.2 or TLSv1.3 (a report's protocol); default: the "
                                "newest both sides have")
    ciphers: str | None = Field(None, description="OpenSSL cipher string, e.g. "
                                "AES256-GCM-SHA384: TLS 1.2's suites, so with version TLSv1.2")
    insecure: bool = Field(False, description="skip the server host name check")
    port: StrictInt | None = Field(None, ge=1, le=65535, description="the broker's TLS listener; "
                             "default: the inventory's broker port")

    @model_validator(mode="after")
    def _key_needs_cert(self) -> TlsSettings:
        if self.key_file and not self.cert_file:
            raise ValueError("key_file: needs cert_file (the client certificate it belongs to)")
        if problem := limits.tls_problem(self.version, self.ciphers):
            raise ValueError(problem)
        return self


class ConnectionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tls: TlsSettings | None = None
    username: str | None = Field(None, min_length=1)
    password_env: str | None = Field(None, pattern=ENV_NAME, description="environment variable "
                                     "that holds the password on each driver host")
    password_file: str | None = Field(None, min_length=1, description="file on each driver "
                                      "host that holds the password, e.g. /run/secrets/mqtt")
    clean_session: bool = True
    keepalive_s: StrictInt | None = Field(None, ge=0, le=65535)
    connect_rate: Annotated[StrictFloat, _within(limits.CONNECT_RATE)] | None = Field(
        None, gt=0, description="new connections/s over all "
                                       "driver processes together (connect pacing)")
    max_pending_connects: Annotated[StrictInt, _within(limits.PENDING_CONNECTS)] | None = Field(
        None, ge=1, description="per process: CONNECTs "
                                             "awaiting CONNACK")
    max_inflight: StrictInt | None = Field(None, ge=1, le=65535, description="per publisher: "
                                     "unacknowledged QoS 1/2 publishes")
    tick_us: Annotated[StrictInt, _within(limits.TICK_US)] | None = Field(
        None, ge=0, description="publishers of a driver process wake at most every N us and "
        "send what is due then (default 0: each message at its intended time). Many clients "
        "at low rates each cost less CPU per message, in the driver and in the broker it "
        "wakes, and a message leaves up to about N us late (plus the wake-up's own lag): "
        "pub_delay shows by how much, and latency is still measured from the intended time")
    read_hold_us: Annotated[StrictInt, _within(limits.READ_HOLD_US)] | None = Field(
        None, ge=0, description="a driver process reads its sockets in passes at least N us "
        "apart (start to start) once a pass read messages (default 0: as soon as bytes "
        "arrive). Each read takes more messages: less CPU per message in the driver and far "
        "less in the broker (it sends fewer, larger TCP segments). Receive times stay the "
        "kernel's on plain TCP (over TLS they are up to N us late), but the broker's "
        "deliveries wait for the reads (its next segment for the read's ACK), and so do "
        "publishers' acks: up to N us more latency; for capacity stages, not latency ones")

    @model_validator(mode="before")
    @classmethod
    def _no_literal_password(cls, data: Any) -> Any:
        if isinstance(data, dict) and "password" in data:
            raise ValueError("password: never write a password into the catalog (it would be "
                             "copied into plan.json and the driver specs); use password_env: "
                             "VAR or password_file: /path on the driver hosts")
        return data

    @model_validator(mode="after")
    def _credentials(self) -> ConnectionSettings:
        if self.password_env and self.password_file:
            raise ValueError("password_env, password_file: give one of them, not both")
        if (self.password_env or self.password_file) and not self.username:
            raise ValueError("username: a password reference needs the username it belongs to")
        return self


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    description: str = ""
    source: str = Field("", description="the report and test this scenario reproduces")
    qos: list[QoS] = Field([0], min_length=1)
    publishers: list[PublisherGroup] = Field(min_length=1)
    subscribers: list[SubscriberGroup] = Field(default_factory=list)
    stages: StagePlan = Field(default_factory=StagePlan)
    connection: ConnectionSettings = Field(default_factory=ConnectionSettings)
    full_scale: dict[str, Any] = Field(default_factory=dict,
                                       description="the report's full-scale values, for reference")

    @field_validator("qos")
    @classmethod
    def _qos_once(cls, values: list[int]) -> list[int]:
        if len(values) != len(set(values)):
            raise ValueError(f"list each QoS once, got {values} (a QoS listed twice gives two "
                             "stages one stage id: one's results would replace the other's)")
        return values

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        groups = [g.group for g in self.publishers] + [g.group for g in self.subscribers]
        if len(groups) != len(set(groups)):
            raise ValueError("group names must be unique across publishers and subscribers")
        for index, group in enumerate(self.publishers):
            for field in ("rate_per_client", "aggregate_rate"):
                value = getattr(group, field)
                if isinstance(value, dict):
                    missing = [q for q in self.qos if q not in value]
                    if missing:
                        raise ValueError(f"publishers.{index}.{field}: no rate for QoS "
                                         f"{missing}; add e.g. `{missing[0]}: <msgs/s>`, or "
                                         f"give one number for every QoS")
        publisher_groups = {g.group for g in self.publishers}
        for index, group in enumerate(self.subscribers):
            expected = group.expected_publisher_groups
            if expected is None:
                continue
            unknown = sorted(set(expected) - publisher_groups)
            if unknown:
                raise ValueError(f"subscribers.{index}.expected_publisher_groups: {unknown} are "
                                 f"not publisher groups ({sorted(publisher_groups)})")
            matched = _matched_publisher_groups(self, group)
            if matched != set(expected):
                raise ValueError(
                    f"subscribers.{index}.expected_publisher_groups: the topics "
                    f"{group.topics} receive from {sorted(matched) or 'no group'}, not "
                    f"{sorted(expected)}; fix the topic filters or the list")
        _stages_within_limits(self)
        return self


def _stages_within_limits(scenario: Scenario) -> None:
    """Every stage's rate per publisher and warm-up within `tasks.driver.limits`: the rate
    a publisher runs at is only known per stage (aggregate rates split, rate_pct scaled)."""
    from .stages import expand  # stages builds on this module

    for stage in expand(scenario):
        for group in stage.groups:
            problem = group.role == "pub" and limits.rate_problem(group.rate_per_client)
            if problem:
                raise ValueError(f"stage {stage.stage_id}: group {group.group}'s rate per "
                                 f"publisher {problem}; change the group's rate or the "
                                 f"stages' rate_pct or clients_pct")
        problem = limits.STAGE_SECONDS.problem(stage.warmup_s)
        if problem:
            raise ValueError(f"stage {stage.stage_id}: stages.warmup_iterations at the "
                             f"slowest publisher's rate makes a warm-up that {problem}; lower "
                             f"warmup_iterations")


SAMPLE = 64  # clients and topics per group checked for expected_publisher_groups


def _matched_publisher_groups(scenario: Scenario, subscribers: SubscriberGroup) -> set[str]:
    """Publisher groups with a topic that one of the first SAMPLE subscribers matches."""
    from paho.mqtt.client import topic_matches_sub

    filters = {render_template(t, {"scenario": scenario.name, "group": subscribers.group,
                                   "i": i, "client": f"{subscribers.group}-{i}"})
               for i in range(min(subscribers.count, SAMPLE)) for t in subscribers.topics}
    matched = set()
    for group in scenario.publishers:
        numbers = [0] if group.topic_count is None else sorted(
            set(range(min(group.topic_count, SAMPLE))) | {group.topic_count - 1})
        topics = {render_template(group.topic, {"scenario": scenario.name, "group": group.group,
                                                "i": i, "n": n, "client": f"{group.group}-{i}"})
                  for i in range(min(group.count, SAMPLE)) for n in numbers}
        if any(topic_matches_sub(f, t) for f in filters for t in topics):
            matched.add(group.group)
    return matched


class SuiteEntry(BaseModel):
    """A suite's scenario with optional overrides (e.g. fewer steps for a nightly run)."""

    model_config = ConfigDict(extra="forbid")

    scenario: str
    qos: list[QoS] | None = Field(None, min_length=1)
    stages: dict[str, Any] | None = Field(None, description="StagePlan fields to override")


class SuiteInclude(BaseModel):
    """Every entry of another suite, in its order (a nightly made of a rated and a capacity
    suite)."""

    model_config = ConfigDict(extra="forbid")

    suite: str


# a suite entry's kinds, as pydantic labels them in an error's location: never a YAML key
NAME_ENTRY, SCENARIO_ENTRY, SUITE_ENTRY = "scenario name", "scenario entry", "suite entry"


def _entry_kind(entry: Any) -> str | None:
    """Which kind of suite entry `entry` is written as: a scenario's name, a scenario with
    overrides (``scenario:``) or another suite (``suite:``); None for none of them."""
    if isinstance(entry, str):
        return NAME_ENTRY
    if isinstance(entry, SuiteEntry) or isinstance(entry, dict) and "scenario" in entry:
        return SCENARIO_ENTRY
    if isinstance(entry, SuiteInclude) or isinstance(entry, dict) and "suite" in entry:
        return SUITE_ENTRY
    return None


# what a suite lists, each entry validated as the kind it is written as
SuiteItem = Annotated[
    Union[Annotated[str, Tag(NAME_ENTRY)], Annotated[SuiteEntry, Tag(SCENARIO_ENTRY)],
          Annotated[SuiteInclude, Tag(SUITE_ENTRY)]],
    Discriminator(_entry_kind, custom_error_type="suite_entry", custom_error_message=(
        "an entry is a scenario's name, {scenario: NAME, qos: [...], stages: {...}} or "
        "{suite: NAME}"))]


class Suites(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suites: dict[str, list[SuiteItem]]

    def entries(self, suite: str, seen: tuple[str, ...] = ()) -> list[tuple[str, SuiteEntry]]:
        """The suite's scenario entries, included suites expanded, each with where it is
        written (``suites.<suite>.<index>``). ValueError: a suite includes itself or one
        that does not exist."""
        if suite in seen:
            raise ValueError(f"suites.{suite}: includes itself (through {' -> '.join(seen)})")
        out: list[tuple[str, SuiteEntry]] = []
        for i, entry in enumerate(self.suites[suite]):
            where = f"suites.{suite}.{i}"
            if isinstance(entry, SuiteInclude):
                if entry.suite not in self.suites:
                    raise ValueError(f"{where}: includes the unknown suite {entry.suite!r}; "
                                     f"known: {sorted(self.suites)}")
                out += self.entries(entry.suite, (*seen, suite))
            else:
                out.append((where, SuiteEntry(scenario=entry) if isinstance(entry, str)
                            else entry))
        return out


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


def load_suites(scenarios_dir: Path) -> Suites:
    path = Path(scenarios_dir) / "suites.yml"
    return load_model(Suites, path) if path.exists() else Suites(suites={})


def _merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides` laid over it, nested settings key by key: a suite's
    `search: {max_probes: 10}` keeps the scenario's hold_s and holds."""
    out = dict(base)
    for key, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merged(base[key], value) if nested else value
    return out


def _apply(entry: SuiteEntry, scenario: Scenario, where: str) -> Scenario:
    doc = scenario.model_dump()
    if entry.qos is not None:
        doc["qos"] = entry.qos
    if entry.stages is not None:
        doc["stages"] = _merged(doc["stages"], entry.stages)
    return validate(Scenario, doc, f"{where} (overrides of scenario {scenario.name!r})")


def load_suite(scenarios_dir: Path, suite: str) -> list[Scenario]:
    path = Path(scenarios_dir) / "suites.yml"
    if not path.exists():
        raise ConfigError(f"{path}: no such file: the scenarios dir (PERFPIPE_SCENARIOS_DIR, "
                          "default scenarios/) needs its suites.yml and catalog/")
    suites = load_suites(scenarios_dir)
    if suite not in suites.suites:
        raise ConfigError(f"{path}: suites: no suite {suite!r}; known: {sorted(suites.suites)}")
    catalog = load_catalog(scenarios_dir)
    try:
        entries = suites.entries(suite)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    missing = [f"{where}: {e.scenario!r}" for where, e in entries if e.scenario not in catalog]
    if missing:
        raise ConfigError(f"{path}: suites.{suite}: unknown scenarios ({'; '.join(missing)}); "
                          f"add {Path(scenarios_dir) / 'catalog'}/<name>.yml or fix the name")
    names = [e.scenario for _, e in entries]
    if len(names) != len(set(names)):
        raise ConfigError(f"{path}: suites.{suite}: list each scenario once (stage ids would "
                          f"collide)")
    return [_apply(e, catalog[e.scenario], f"{path}: {where}")
            if e.qos is not None or e.stages is not None else catalog[e.scenario]
            for where, e in entries]


def warmup_for(plan: StagePlan, min_rate: float) -> int:
    """The warm-up in seconds: warmup_s, or longer to fit warmup_iterations at min_rate."""
    if plan.warmup_iterations is None or min_rate <= 0:
        return plan.warmup_s
    return max(plan.warmup_s, math.ceil(plan.warmup_iterations / min_rate))


__all__ = ["Scenario", "PublisherGroup", "SubscriberGroup", "StagePlan", "ConnectionSettings",
           "TlsSettings", "SuiteEntry", "load_catalog", "load_suite", "load_suites",
           "render_template", "rate_for", "warmup_for", "ConfigError", "read_yaml"]

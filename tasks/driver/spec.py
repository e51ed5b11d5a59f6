"""The stage spec one driver process runs: parsed from JSON with the standard library.

Errors name the field and the fix, e.g. ``publishers[3].qos: must be 0, 1 or 2, got 5``.

Optional fields beyond the pipeline's minimum: TLS (``broker.tls``, ``ca_file``,
``cert_file``/``key_file`` for a client certificate, ``tls_version`` (TLSv1.2 or
TLSv1.3: the one version offered) and ``ciphers`` in OpenSSL syntax (TLS 1.2's suites:
with ``tls_version`` TLSv1.2 only),
``tls_insecure`` to skip the host name check), ``broker.username`` with its password
given as ``password`` (a hand-written spec), or by reference as ``password_env`` (an
environment variable of the driver process) or ``password_file`` (a file on the driver
host, e.g. a compose secret): the pipeline only ever writes references, so no password is
in a run file; the reference is resolved when the spec is parsed, on the driver host),
``clean_session`` per process or per client (False: a persistent session), shared
subscriptions as ``$share/<group>/<filter>`` topics, a publisher ``topic_cycle`` (message
k goes to ``topic_cycle[(k-1) % N]``; each position is its own stream with publisher index
``publisher_index + position`` and its own sequence numbers, so subscribers of one topic
see no gaps), ``aggregate_rate`` (messages/s for
the whole process, split evenly over its publishers, replacing their ``rate``), and the
connect pacing ``connect_rate``/``max_pending_connects`` for connection-burst stages.
The pipeline builds these specs from the scenario catalog (`tasks.catalog.placement`); a person can
also write one by hand and run ``python -m tasks.driver --spec spec.json --out DIR``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import limits
from .wire import HEADER_BYTES


class SpecError(ValueError):
    """A stage spec that cannot be run; the message names the field and what to do."""


@dataclass(frozen=True)
class BrokerEndpoint:
    host: str
    port: int
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    ciphers: str | None = None
    tls_version: str | None = None  # TLSv1.2 or TLSv1.3: the only one offered (None: any)
    tls_insecure: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # secret: never echoed
    password_env: str | None = None  # where the password came from (a reference, echoed)
    password_file: str | None = None


@dataclass(frozen=True)
class PublisherSpec:
    client_id: str
    topic: str
    publisher_index: int
    qos: int = 0
    rate: float = 1.0  # messages per second from this client
    payload_bytes: int = 256
    clean_session: bool | None = None  # None: the process's clean_session
    topic_cycle: tuple[str, ...] = ()  # topics cycled over, one stream each (empty: topic)


@dataclass(frozen=True)
class SubscriberSpec:
    client_id: str
    topics: tuple[str, ...]
    qos: int = 0
    clean_session: bool | None = None  # None: the process's clean_session


@dataclass(frozen=True)
class ProcessSpec:
    run_id: str
    stage_id: str
    host: str
    proc: int
    broker: BrokerEndpoint
    publishers: tuple[PublisherSpec, ...] = ()
    subscribers: tuple[SubscriberSpec, ...] = ()
    warmup_s: int = 2
    measure_s: int = 10
    drain_s: int = 2
    connect_rate: float = 500.0  # new connections per second from this process
    max_pending_connects: int = 64  # CONNECTs awaiting CONNACK (Mosquitto's backlog is ~100)
    max_inflight: int = 100  # unacknowledged QoS 1/2 publishes per client
    keepalive_s: int = 60
    clean_session: bool = True
    connect_timeout_s: float = 30.0  # after the last paced CONNECT
    start_timeout_s: float = 180.0
    aggregate_rate: float | None = None  # msgs/s of the whole process, if given
    sndbuf_bytes: int | None = None  # publisher sockets' SO_SNDBUF; None: auto, 0: kernel's
    tick_us: int = 0  # 0: send each message at its intended time; N: wake at most every N us
    read_hold_us: int = 0  # 0: read as soon as bytes arrive; N: read passes >= N us apart

    def echo(self) -> dict[str, Any]:
        """The spec as recorded in the summary: everything but secrets."""
        doc = dataclasses.asdict(self)
        doc["broker"].pop("password", None)
        for reference in ("password_env", "password_file"):  # names, not secrets: kept if set
            if doc["broker"][reference] is None:
                del doc["broker"][reference]
        return doc




def _require(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise SpecError(f"{where}: {message}")


def _require_ok(problem: str | None, where: str) -> None:
    """Raise a SpecError with the problem a `tasks.driver.limits` check found, if any."""
    _require(problem is None, where, problem or "")


def _only_known(doc: object, where: str, shape: type) -> dict:
    """`doc` as an object whose keys are all fields of `shape` (a key misspelt would
    otherwise leave its field at the default, unsaid)."""
    _require(isinstance(doc, dict), where.rstrip(".") or "spec",
             f"must be a JSON object, got {doc!r}")
    known = [f.name for f in dataclasses.fields(shape)]
    for key in doc:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(known)}"
            raise SpecError(f"{where}{key}: not a field of this spec ({hint})")
    return doc


def _get(doc: dict, key: str, where: str, kind: type | tuple, default: Any = ...) -> Any:
    if key not in doc:
        _require(default is not ..., f"{where}{key}", "is required")
        return default
    value = doc[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float))
    _require(ok, f"{where}{key}", f"must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _qos(doc: dict, where: str) -> int:
    qos = _get(doc, "qos", where, int, 0)
    _require(qos in (0, 1, 2), f"{where}qos", f"must be 0, 1 or 2, got {qos}")
    return qos


def _publisher(doc: dict, where: str) -> PublisherSpec:
    _only_known(doc, where, PublisherSpec)
    rate = _get(doc, "rate", where, float, 1.0)
    _require_ok(limits.rate_problem(rate), f"{where}rate")
    size = _get(doc, "payload_bytes", where, int, 256)
    _require(size >= HEADER_BYTES, f"{where}payload_bytes",
             f"must be >= {HEADER_BYTES} (the latency header), got {size}")
    _require_ok(limits.PAYLOAD_BYTES.problem(size), f"{where}payload_bytes")
    cycle = _get(doc, "topic_cycle", where, list, [])
    _require_ok(limits.TOPIC_COUNT.problem(len(cycle)), f"{where}topic_cycle")
    for i, name in enumerate(cycle):
        _require(_topic_name_ok(name), f"{where}topic_cycle[{i}]",
                 f"must be a topic name without wildcards or '$', got {name!r}")
        _require_ok(limits.topic_problem(name), f"{where}topic_cycle[{i}]")
    topic = _get(doc, "topic", where, str, cycle[0] if cycle else ...)
    _require(_topic_name_ok(topic), f"{where}topic",
             f"must be a topic name without wildcards or '$', got {topic!r}")
    _require_ok(limits.topic_problem(topic), f"{where}topic")
    _require(not cycle or topic == cycle[0], f"{where}topic",
             "must be topic_cycle[0] when topic_cycle is given (or leave it out)")
    index = _get(doc, "publisher_index", where, int)
    last = index + max(len(cycle), 1) - 1
    _require(0 < index and last < 2**32, f"{where}publisher_index",
             f"must be 1..2**32-1 for every stream, got {index}..{last}")
    return PublisherSpec(
        client_id=_client_id(doc, where), topic=topic,
        publisher_index=index, qos=_qos(doc, where),
        rate=rate, payload_bytes=size,
        clean_session=_get(doc, "clean_session", where, bool, None),
        topic_cycle=tuple(cycle),
    )


def _topic_name_ok(topic: object) -> bool:
    return (isinstance(topic, str) and bool(topic) and not set("+#") & set(topic)
            and not topic.startswith("$"))


def _client_id(doc: dict, where: str) -> str:
    client_id = _get(doc, "client_id", where, str)
    _require(0 < len(client_id.encode()) <= 65535, f"{where}client_id",
             "must be a non-empty string")
    return client_id


def _topic_filter_ok(topic: object) -> bool:
    """A valid MQTT topic filter, or a shared subscription ``$share/<group>/<filter>``."""
    if not isinstance(topic, str) or not topic:
        return False
    if topic.startswith("$share/"):
        parts = topic.split("/", 2)
        if len(parts) < 3 or not parts[1] or set("+#") & set(parts[1]):
            return False
        topic = parts[2]
    levels = topic.split("/")
    return bool(topic) and all(
        level in ("+", "#") or not set("+#") & set(level) for level in levels
    ) and "#" not in levels[:-1]


def _subscriber(doc: dict, where: str) -> SubscriberSpec:
    _only_known(doc, where, SubscriberSpec)
    topics = _get(doc, "topics", where, list)
    _require(bool(topics), f"{where}topics", "must be a non-empty list of topic filters")
    for i, topic in enumerate(topics):
        _require(_topic_filter_ok(topic), f"{where}topics[{i}]",
                 f"must be a topic filter ('+' and '#' as whole levels, '#' last) or "
                 f"$share/<group>/<filter>, got {topic!r}")
        _require_ok(limits.topic_problem(topic), f"{where}topics[{i}]")
    return SubscriberSpec(client_id=_client_id(doc, where), topics=tuple(topics),
                          qos=_qos(doc, where),
                          clean_session=_get(doc, "clean_session", where, bool, None))


def parse_spec(doc: dict) -> ProcessSpec:
    """Validate a JSON document into a ProcessSpec, or raise SpecError naming the field."""
    _only_known(doc, "", ProcessSpec)
    broker_doc = _only_known(_get(doc, "broker", "", dict), "broker.", BrokerEndpoint)
    port = _get(broker_doc, "port", "broker.", int)
    _require(0 < port < 65536, "broker.port", f"must be 1..65535, got {port}")
    broker = BrokerEndpoint(
        host=_get(broker_doc, "host", "broker.", str), port=port,
        tls=_get(broker_doc, "tls", "broker.", bool, False),
        ca_file=_get(broker_doc, "ca_file", "broker.", str, None),
        cert_file=_get(broker_doc, "cert_file", "broker.", str, None),
        key_file=_get(broker_doc, "key_file", "broker.", str, None),
        ciphers=_get(broker_doc, "ciphers", "broker.", str, None),
        tls_version=_get(broker_doc, "tls_version", "broker.", str, None),
        tls_insecure=_get(broker_doc, "tls_insecure", "broker.", bool, False),
        username=_get(broker_doc, "username", "broker.", str, None),
        password=_get(broker_doc, "password", "broker.", str, None),
        password_env=_get(broker_doc, "password_env", "broker.", str, None),
        password_file=_get(broker_doc, "password_file", "broker.", str, None),
    )
    broker = _with_password(broker)
    publishers = tuple(_publisher(p, f"publishers[{i}].")
                       for i, p in enumerate(_get(doc, "publishers", "", list, [])))
    subscribers = tuple(_subscriber(s, f"subscribers[{i}].")
                        for i, s in enumerate(_get(doc, "subscribers", "", list, [])))
    aggregate_rate = _get(doc, "aggregate_rate", "", float, None)
    if aggregate_rate is not None:
        _require(aggregate_rate > 0, "aggregate_rate", f"must be > 0 messages/s, got {aggregate_rate}")
        _require(bool(publishers), "aggregate_rate", "needs at least one publisher")
        share = aggregate_rate / len(publishers)
        _require_ok(limits.rate_problem(share), f"aggregate_rate (split over "
                    f"{len(publishers)} publishers)")
        publishers = tuple(dataclasses.replace(p, rate=share) for p in publishers)
    _streams_apart(publishers)
    ids = [c.client_id for c in publishers + subscribers]
    _require(len(ids) == len(set(ids)), "client_id", "must be unique within a process")
    _require(bool(ids), "publishers/subscribers", "a process needs at least one client")
    _require_ok(limits.DRIVER_HOST_CLIENTS.problem(len(ids)), "publishers/subscribers")
    spec = ProcessSpec(
        run_id=_get(doc, "run_id", "", str), stage_id=_get(doc, "stage_id", "", str),
        host=_get(doc, "host", "", str), proc=_get(doc, "proc", "", int), broker=broker,
        publishers=publishers, subscribers=subscribers,
        warmup_s=_get(doc, "warmup_s", "", int, 2), measure_s=_get(doc, "measure_s", "", int, 10),
        drain_s=_get(doc, "drain_s", "", int, 2),
        connect_rate=_get(doc, "connect_rate", "", float, 500.0),
        max_pending_connects=_get(doc, "max_pending_connects", "", int, 64),
        max_inflight=_get(doc, "max_inflight", "", int, 100),
        keepalive_s=_get(doc, "keepalive_s", "", int, 60),
        clean_session=_get(doc, "clean_session", "", bool, True),
        connect_timeout_s=_get(doc, "connect_timeout_s", "", float, 30.0),
        start_timeout_s=_get(doc, "start_timeout_s", "", float, 180.0),
        aggregate_rate=aggregate_rate,
        sndbuf_bytes=_get(doc, "sndbuf_bytes", "", int, None),
        tick_us=_get(doc, "tick_us", "", int, 0),
        read_hold_us=_get(doc, "read_hold_us", "", int, 0),
    )
    _require(spec.measure_s > 0, "measure_s", f"must be > 0 seconds, got {spec.measure_s}")
    for name in ("warmup_s", "measure_s", "drain_s"):
        _require(getattr(spec, name) >= 0, name, "must be >= 0 seconds")
        _require_ok(limits.STAGE_SECONDS.problem(getattr(spec, name)), name)
    _require(spec.connect_rate > 0, "connect_rate", "must be > 0 connections/s")
    _require_ok(limits.CONNECT_RATE.problem(spec.connect_rate), "connect_rate")
    _require_ok(limits.PENDING_CONNECTS.problem(spec.max_pending_connects),
                "max_pending_connects")
    _require(0 < spec.max_inflight <= 65535, "max_inflight",
             f"must be 1..65535 (MQTT packet ids), got {spec.max_inflight}")
    _require(spec.sndbuf_bytes is None or spec.sndbuf_bytes >= 0, "sndbuf_bytes",
             "must be >= 0 (0: the kernel's autotuning)")
    _require(spec.tick_us >= 0, "tick_us", "must be >= 0 microseconds (0: on time)")
    _require_ok(limits.TICK_US.problem(spec.tick_us), "tick_us")
    _require(spec.read_hold_us >= 0, "read_hold_us", "must be >= 0 microseconds (0: prompt)")
    _require_ok(limits.READ_HOLD_US.problem(spec.read_hold_us), "read_hold_us")
    _require(spec.max_pending_connects > 0, "max_pending_connects", "must be > 0")
    _require(0 <= spec.keepalive_s <= 65535, "keepalive_s", "must be 0..65535 seconds")
    for name in ("connect_timeout_s", "start_timeout_s"):
        _require(getattr(spec, name) > 0, name, "must be > 0 seconds")
        _require_ok(limits.TIMEOUT_SECONDS.problem(getattr(spec, name)), name)
    if broker.cert_file or broker.key_file or broker.ciphers or broker.ca_file \
            or broker.tls_version:
        _require(broker.tls, "broker.tls", "must be true when ca_file, cert_file, key_file, "
                 "ciphers or tls_version is given")
    _require_ok(limits.tls_problem(broker.tls_version, broker.ciphers), "broker.tls_version")
    _require(not (broker.key_file and not broker.cert_file), "broker.cert_file",
             "is required with broker.key_file")
    return spec


def _streams_apart(publishers: tuple[PublisherSpec, ...]) -> None:
    """No two publishers share a stream (a publisher index): subscribers would take one's
    sequence numbers for the other's duplicates and gaps."""
    owner: dict[int, int] = {}
    for i, p in enumerate(publishers):
        for index in range(p.publisher_index, p.publisher_index + max(len(p.topic_cycle), 1)):
            _require(index not in owner, f"publishers[{i}].publisher_index",
                     f"stream {index} is publishers[{owner.get(index)}]'s too; give each "
                     f"publisher (and each of its topic_cycle positions) an index of its own")
            owner[index] = i


def _with_password(broker: BrokerEndpoint) -> BrokerEndpoint:
    """Resolve a password reference on this host (the spec file holds only the reference)."""
    given = [name for name in ("password", "password_env", "password_file")
             if getattr(broker, name) is not None]
    _require(len(given) <= 1, "broker." + given[-1] if given else "broker",
             f"give one of password, password_env, password_file, not {given}")
    if not given:
        return broker
    _require(bool(broker.username), "broker.username", f"is required with broker.{given[0]}")
    if broker.password_env is not None:
        value = os.environ.get(broker.password_env)
        _require(value is not None, "broker.password_env",
                 f"environment variable {broker.password_env} is not set for the driver on "
                 f"this host; set it, or use broker.password_file")
        return dataclasses.replace(broker, password=value)
    if broker.password_file is not None:
        try:
            value = Path(broker.password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise SpecError(f"broker.password_file: cannot read {broker.password_file} on this "
                            f"host ({exc.strerror}); create it or fix the path") from None
        return dataclasses.replace(broker, password=value)
    return broker


def load_spec(path: Path) -> ProcessSpec:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec as JSON ({exc})") from exc
    return parse_spec(doc)

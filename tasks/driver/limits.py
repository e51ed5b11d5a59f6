"""The bounds on every number and name a run is given, each with the reason for it.

One definition, read twice: by the scenario catalog's validation when a run is planned
(`tasks.catalog.scenarios`) and by the driver's own spec check on the host
(`tasks.driver.spec`, standard library only). A value outside a bound is refused with the
field, the bound and the reason; nothing is clamped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """An upper limit, its unit, and why it is there."""

    limit: float
    unit: str
    why: str

    def problem(self, value: float) -> str | None:
        """Why `value` is over the limit, or None when it is not."""
        if value <= self.limit:
            return None
        return f"must be at most {_number(self.limit)} {self.unit} ({self.why}), got {_number(value)}"


def _number(value: float) -> str:
    return f"{int(value):,}" if math.isfinite(value) and value == int(value) else f"{value:g}"


MIN_RATE = 0.001  # msgs/s per publisher: one in ~17 minutes; slower, a window sees none
MAX_RATE = 1_000_000.0  # msgs/s per publisher: the schedule's resolution is 1 us

GROUP_CLIENTS = Bound(1_000_000, "clients", "the largest published MQTT connection test, "
                      "MessageSight's one million; split a larger one over groups")
DRIVER_HOST_CLIENTS = Bound(64_512, "connections per driver host", "each takes a local port "
                            "towards the one broker address and port, and a host has 64,512 "
                            "of them at most (1024-65535); add driver hosts")
TOPIC_COUNT = Bound(10_000_000, "topics", "the driver keeps one stream per topic")
STAGE_SECONDS = Bound(3_600, "s", "a nightly's stages share one window; measure longer as "
                      "more rate steps, not as one hour-long stage")
TIMEOUT_SECONDS = Bound(3_600, "s", "a driver silent for an hour is not coming back")
CONNECT_RATE = Bound(100_000, "connections/s", "far above any broker's published accept "
                     "rate; pacing beyond it is no pacing")
PENDING_CONNECTS = Bound(65_535, "CONNECTs", "no listen backlog is deeper")
READ_HOLD_US = Bound(20_000, "us", "a longer pause between reads would stall keepalives "
                     "and the stage's clock")
TICK_US = Bound(1_000_000, "us", "a send held back longer than a second is no longer the "
                "schedule's message but the next one's")
TOPIC_BYTES = 65_535  # MQTT's limit on a topic's UTF-8 length
PAYLOAD_BYTES = Bound(268_435_455 - (2 + TOPIC_BYTES) - 2, "bytes", "MQTT's largest "
                      "remaining length less the longest topic and the packet id")


def rate_problem(rate: object) -> str | None:
    """Why `rate` (msgs/s of one publisher) cannot be run, or None when it can."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        return f"must be a number of messages/s, got {rate!r}"
    if not math.isfinite(rate):
        return f"must be a finite number of messages/s, got {rate}"
    if rate < MIN_RATE:
        return (f"must be at least {MIN_RATE:g} messages/s per publisher (slower, a stage's "
                f"window sees no message), got {rate:g}")
    if rate > MAX_RATE:
        return (f"must be at most {MAX_RATE:,.0f} messages/s per publisher (the open-loop "
                f"schedule has 1 us resolution), got {rate:g}")
    return None


def topic_problem(topic: str) -> str | None:
    """Why `topic` (a name or a filter) cannot go on the wire, or None when it can."""
    if not topic:
        return "must not be empty"
    controls = sorted({c for c in topic if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F})
    if controls:
        shown = ", ".join(f"U+{ord(c):04X}" for c in controls)
        return (f"contains control characters ({shown}), for which brokers drop the client; "
                f"use printable characters")
    if len(topic.encode("utf-8", "surrogatepass")) > TOPIC_BYTES:
        return f"must be at most {TOPIC_BYTES} bytes in UTF-8 (MQTT's limit)"
    return None


TLS_VERSIONS = ("TLSv1.2", "TLSv1.3")  # what a stage's clients may be held to


def tls_problem(version: str | None, ciphers: str | None) -> str | None:
    """Why a TLS version and cipher list cannot go together, or None. A cipher list picks
    among TLS 1.2's suites only (OpenSSL's TLS 1.3 suites are its own), so with TLS 1.3
    allowed the handshake takes 1.3 and the list changes nothing that is measured."""
    if version is not None and version not in TLS_VERSIONS:
        return f"version must be one of {', '.join(TLS_VERSIONS)}, got {version!r}"
    if ciphers and version != "TLSv1.2":
        return ("ciphers apply to TLS 1.2 only (TLS 1.3 suites are OpenSSL's own): give "
                "version TLSv1.2 with them, or leave ciphers out")
    return None

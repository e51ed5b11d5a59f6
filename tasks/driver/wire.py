"""The MQTT 3.1.1 bytes the fast path writes and reads itself, and the payload header.

paho encodes and parses the session packets (CONNECT, SUBSCRIBE, PINGREQ, DISCONNECT and
their acks). The data packets are done here because paho's per-message cost (~20-30 us
to publish, ~11 us to receive) would make the driver, not the broker, the thing measured:
a PUBLISH is encoded once per client as a template and only its sequence number, times
and packet id are patched per message.

Every payload starts with `HEADER`: a tag of the run and stage, the publisher's global
index, its sequence number, the intended send time and the actual send time (Unix
microseconds). End-to-end latency is measured from the intended time, so a stalled
publisher cannot hide latency (no coordinated omission).
"""

from __future__ import annotations

import struct
import zlib

HEADER = struct.Struct("!IIQqq")  # run tag, publisher index, sequence, intended us, sent us
HEADER_BYTES = HEADER.size  # 32

PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 0x30, 0x40, 0x50, 0x60, 0x70
PINGRESP = 0xD0
_ACK = struct.Struct("!BBH")

# Patch layouts, applied at `Template.patch_at`. QoS 0: the header's seq/intended/sent,
# skipping tag and publisher. QoS 1/2: the packet id, which directly precedes the payload,
# and the whole header (pad bytes would be written as zeros, so tag and publisher are
# written again rather than skipped).
PATCH_QOS0 = struct.Struct("!Qqq")
PATCH_QOS12 = struct.Struct("!HIIQqq")


def run_tag(run_id: str, stage_id: str) -> int:
    """A 32-bit tag of the run and stage: messages of another run or stage are ignored."""
    return zlib.crc32(f"{run_id}/{stage_id}".encode())


def remaining_length(n: int) -> bytes:
    """MQTT's variable-length integer (1..4 bytes)."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class Template:
    """One client's PUBLISH packet, pre-encoded; `patch_at` is where `patch` writes."""

    __slots__ = ("packet", "patch_at", "patch", "tag", "publisher")

    def __init__(self, topic: str, qos: int, payload_bytes: int, tag: int, publisher: int):
        name = topic.encode()
        body = len(name).to_bytes(2, "big") + name
        patch_at = len(body)
        if qos:
            body += b"\0\0"  # packet id, patched per message
        header = HEADER.pack(tag, publisher, 0, 0, 0)
        body += header + bytes(payload_bytes - len(header))
        fixed = bytes([PUBLISH | (qos << 1)]) + remaining_length(len(body))
        self.packet = fixed + body
        self.patch_at = len(fixed) + (patch_at if qos else patch_at + 8)
        self.patch = (PATCH_QOS12 if qos else PATCH_QOS0).pack_into
        self.tag, self.publisher = tag, publisher


def ack(command: int, packet_id: int) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP for a packet id (PUBREL carries flags 0b0010)."""
    return _ACK.pack(command | (2 if command == PUBREL else 0), 2, packet_id)

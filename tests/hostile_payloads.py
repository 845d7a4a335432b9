"""Hostile subscription user data, byte by byte: what a member that wants to break or stall its
group's leader can send (issue 36, finding 3). Shared by the unit, fuzz and live tests
(tests/test_hostile_members.py, tests/hostile_member.py).

Built by hand, not with the wire module's writer: the writer refuses most of this.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable, Sequence

from assignor import wire


def varint(value: int) -> bytes:
    """Unsigned LEB128 of any size (the wire writer stops at 64 bits)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def text(raw: bytes) -> bytes:
    return varint(len(raw)) + raw


def entry(topic_indices: Sequence[int], partitions: Sequence[int]) -> bytes:
    """One shared entry of a topic -> partitions map: topic indices, then sorted partitions."""
    deltas = [b - a - 1 for a, b in zip([-1, *partitions], partitions, strict=False)]
    body = varint(len(topic_indices)) + b"".join(map(varint, topic_indices))
    return body + varint(len(partitions)) + b"".join(map(varint, deltas))


def subscription(
    names: Sequence[str] = (),
    epoch: int = 0,
    capacity: float = 1.0,
    active: Sequence[bytes] = (),
    standby: Sequence[bytes] = (),
    url: bytes = b"",
) -> bytes:
    """A subscription message (uncompressed body) from raw parts: no checks at all."""
    body = varint(wire.KIND_SUBSCRIPTION) + varint(len(names))
    body += b"".join(text(n.encode()) for n in names)
    body += varint(epoch) + text(url) + text(b"") + text(b"") + struct.pack(">d", capacity)
    body += varint(len(active)) + b"".join(active) + varint(len(standby)) + b"".join(standby)
    body += varint(0)  # no local offsets
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION, 0) + body


def huge_epoch() -> bytes:
    """Epoch 2**70 - 1 (finding 3): the leader planned 2**70, 11 bytes no member decodes."""
    return subscription(epoch=2**70 - 1)


def epoch_above_the_bound() -> bytes:
    """A readable 64-bit epoch far above any real one: the plan's epoch must not follow it."""
    return subscription(epoch=2**63)


def repeated_topic(topic: str = "impressions", repeats: int = 3000, partitions: int = 3000) -> bytes:
    """One topic named `repeats` times in one entry: its list was copied once per name."""
    return subscription([topic], epoch=5, active=[entry([0] * repeats, list(range(partitions)))])


def many_topics(count: int = 1500, partitions: int = 1500) -> bytes:
    """`count` distinct topics sharing one list of `partitions`: count x partitions decoded."""
    names = [f"t{i}" for i in range(count)]
    return subscription(names, epoch=5, active=[entry(list(range(count)), list(range(partitions)))])


def amplification_58k() -> bytes:
    """58 KB like the finding's (18.1 s and 2.96 GB to decode before the fix): 5,000 topics
    sharing a list of 27,000 partitions, 135 million decoded."""
    names = [f"{i:x}" for i in range(5000)]
    return subscription(names, epoch=5, active=[entry(list(range(5000)), list(range(27_000)))])


def claims_beyond_the_topic(topic: str = "impressions") -> bytes:
    """A high epoch claiming partitions the topic does not have, and a topic the group lacks."""
    return subscription(
        [topic, "no-such-topic"],
        epoch=50,
        active=[entry([0], [0, 1, 50, 10**6]), entry([1], [0, 1])],
    )


# The stock `faust` protocol path: metadata that made stock Faust's assign() raise.
STOCK_GARBAGE: dict[str, bytes] = {
    "not UTF-8": b"\xff\xfe\x00garbage",
    "deep nesting": b"[" * 100_000,
    "wrong shapes": b'{"assignment": "x", "url": 5}',
    "claims beyond the topic": json.dumps(
        {"assignment": {"actives": {"impressions": [999, -1, "x"]}, "standbys": []}, "url": "http://x"}
    ).encode(),
    "null fields": b'{"assignment": {"actives": null, "standbys": null}, "url": null}',
    "tandem key not base64": b'{"tandem": "%%%not base64%%%"}',
    "tandem key forged": json.dumps({"tandem": base64.b64encode(huge_epoch()).decode()}).encode(),
    "a list": b"[1, 2, 3]",
}

PAYLOADS: dict[str, Callable[[], bytes]] = {
    "huge-epoch": huge_epoch,
    "epoch-above-bound": epoch_above_the_bound,
    "repeated-topic": repeated_topic,
    "many-topics": many_topics,
    "amplification-58k": amplification_58k,
    "claims-beyond-topic": claims_beyond_the_topic,
    "garbage": lambda: b"TD\x01\x00\x01\x00" + bytes(range(256)) * 4,
}

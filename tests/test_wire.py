"""The wire format: round trips, versions, hostile bytes, and sizes at scale."""

from __future__ import annotations

import contextlib
import logging
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assignor import wire
from assignor.wire import (
    Assignment,
    RebalanceStats,
    RoutingTable,
    Subscription,
    WireError,
    decode_assignment,
    decode_routing,
    decode_subscription,
    encode_assignment,
    encode_routing,
    encode_subscription,
    read_subscription,
)

topic_names = st.text(min_size=1, max_size=20)
partition_lists = st.lists(st.integers(0, 100_000), max_size=30).map(lambda p: sorted(set(p)))
topic_partitions = st.dictionaries(topic_names, partition_lists.filter(bool), max_size=4)
offsets = st.dictionaries(
    topic_names,
    st.dictionaries(st.integers(0, 50_000), st.integers(-2, 2**62), min_size=1, max_size=8),
    max_size=3,
)
subscriptions = st.builds(
    Subscription,
    epoch=st.integers(0, 2**40),
    url=st.text(max_size=40),
    host=st.text(max_size=20),
    rack=st.text(max_size=10),
    capacity=st.floats(allow_nan=False),
    previous_active=topic_partitions,
    previous_standby=topic_partitions,
    local_offsets=offsets,
)
assignments = st.builds(
    Assignment,
    epoch=st.integers(0, 2**40),
    active=topic_partitions,
    standby=topic_partitions,
    topic_groups=st.lists(st.lists(topic_names, min_size=1, max_size=3), max_size=4),
    leader_url=st.text(max_size=40),
    stats=st.builds(RebalanceStats, *[st.integers(0, 10**9)] * 5),
)


@given(subscriptions)
@settings(max_examples=200, deadline=None)
def test_subscription_round_trip(sub: Subscription) -> None:
    assert decode_subscription(encode_subscription(sub)) == sub


@given(assignments)
@settings(max_examples=200, deadline=None)
def test_assignment_round_trip(assignment: Assignment) -> None:
    assert decode_assignment(encode_assignment(assignment)) == assignment


def test_routing_round_trip_and_lookup() -> None:
    table = RoutingTable(4, ["http://a:1", "http://b:1"], [["x", "y"], ["z"]], [[0, 1, -1], [1]])
    assert decode_routing(encode_routing(table)) == table
    assert table.owner("y", 1) == "http://b:1"
    assert table.owner("x", 2) is None and table.owner("nope", 0) is None


def test_header_is_magic_version_flags() -> None:
    data = encode_subscription(Subscription(epoch=3))
    assert data[:2] == b"TD" and data[2] == wire.VERSION and data[3] in (0, wire.FLAG_ZLIB)
    assert wire.is_tandem(data) and not wire.is_tandem(b'{"assignment": {}}')


def test_large_bodies_are_compressed() -> None:
    sub = Subscription(previous_active={"t": list(range(0, 20_000, 2))})
    data = encode_subscription(sub)
    assert data[3] == wire.FLAG_ZLIB and len(data) < 200
    assert decode_subscription(data) == sub


def test_co_partitioned_topics_share_one_partition_list() -> None:
    one = encode_subscription(Subscription(previous_active={"a": [1, 5, 9]}))
    three = encode_subscription(Subscription(previous_active={t: [1, 5, 9] for t in "abc"}))
    assert len(three) - len(one) <= 2 * 3  # two more names and indices, no more lists


def test_messages_are_not_confused() -> None:
    with pytest.raises(WireError, match="kind"):
        decode_assignment(encode_subscription(Subscription()))


def test_other_version_is_refused() -> None:
    data = bytearray(encode_subscription(Subscription(epoch=1)))
    data[2] = wire.VERSION + 1
    with pytest.raises(WireError, match="version"):
        decode_subscription(bytes(data))


GARBAGE = [
    b"",
    b"T",
    b"TD",
    b"TD\x01",
    b"garbage!",
    b'{"assignment":{"actives":{},"standbys":{}},"url":"http://x"}',  # stock Faust metadata
    zlib.compress(b'{"x": 1}'),  # stock Faust assignment
    b"TD\x01\x01not zlib at all",
    b"TD\x01\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # overlong varint
    b"TD\x01\x00\x01\x05",  # 5 names announced, none there
    b"TD\x01\x01" + zlib.compress(b"\x01" + b"\x00" * 10_000_000),  # big and wrong
]


@pytest.mark.parametrize("data", GARBAGE)
def test_garbage_means_no_history_with_a_warning(data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="assignor.wire"):
        sub, warning = read_subscription(data, "member-7")
    assert sub == wire.NO_HISTORY
    if data:
        assert warning is not None and "member-7" in warning
        assert "member-7" in caplog.text


def test_every_truncation_is_refused_or_no_history() -> None:
    sub = Subscription(
        epoch=9,
        url="http://w:6066",
        host="h",
        rack="r",
        previous_active={"a": [1, 2], "b": [1, 2]},
        previous_standby={"c": [3]},
        local_offsets={"c": {3: 77, 1: 5}},
    )
    data = encode_subscription(sub)
    for cut in range(len(data)):
        decoded, warning = read_subscription(data[:cut], "m")
        assert decoded == wire.NO_HISTORY
    for flip in range(len(data)):
        corrupt = bytearray(data)
        corrupt[flip] ^= 0xFF
        read_subscription(bytes(corrupt), "m")  # never raises


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_random_bytes_never_raise(data: bytes) -> None:
    read_subscription(data, "m")
    read_subscription(b"TD\x01\x00" + data, "m")
    for decode in (decode_assignment, decode_routing):
        with contextlib.suppress(WireError):
            decode(b"TD\x01\x00" + data)


def _reference_varints(data: bytes, n: int) -> list[int] | None:
    """LEB128 decoded one byte at a time (at most 10 bytes, 64 bits each); None if truncated or
    overlong."""
    values, pos = [], 0
    for _ in range(n):
        value = shift = 0
        while True:
            if pos >= len(data) or shift > 63:
                return None
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        if value > wire.MAX_VARINT:
            return None
        values.append(value)
    return values


def test_a_varint_over_64_bits_is_refused_and_never_written() -> None:
    """The finding's epoch of 2**70 - 1: read, planned + 1, written in 11 bytes no member read."""
    body = wire.HEADER.pack(wire.MAGIC, wire.VERSION, 0) + bytes([wire.KIND_SUBSCRIPTION, 0])
    top = body + b"\xff" * 9 + b"\x01" + b"\x00" * 3 + bytes(8) + b"\x00" * 3
    assert decode_subscription(top).epoch == 2**64 - 1
    over = body + b"\xff" * 9 + b"\x7f" + b"\x00" * 3 + bytes(8) + b"\x00" * 3
    with pytest.raises(WireError, match="overlong"):
        decode_subscription(over)
    with pytest.raises(WireError, match="64 bits"):
        encode_subscription(Subscription(epoch=2**64))


@given(st.lists(st.one_of(st.integers(0, 127), st.integers(0, 2**64 - 1)), max_size=40), st.data())
@settings(max_examples=300, deadline=None)
def test_runs_of_varints_decode_as_one_at_a_time(values: list[int], data: st.DataObject) -> None:
    """Runs mixing one-byte and longer varints (a partition list whose first delta is large,
    offsets), whole, cut short, or with bytes after them."""
    writer = wire._Writer()
    writer.uint(wire.KIND_ROUTING)
    writer.uint(0)
    for value in values:
        writer.uint(value)
    body = bytes(writer.buf)
    cut = data.draw(st.integers(2, len(body) + 3))
    raw = body[:cut] if cut <= len(body) else body + b"\x05" * (cut - len(body))
    reader = wire._Reader(wire.HEADER.pack(wire.MAGIC, wire.VERSION, 0) + raw, wire.KIND_ROUTING)
    expected = _reference_varints(raw[2:], len(values))
    if expected is None:
        with pytest.raises(WireError):
            reader.uints(len(values))
    else:
        assert reader.uints(len(values)) == expected == values

"""One input's records checked, as the join takes them (the side codecs): from the topic's
types and serializers and the input's declared options, the `SideCodec` that checks each
record (tables/records/codecs.py); the good records of a fetch as operator events, the bad ones
as dead letters (`Letter`), null values counted. Used by the worker's intake
(tables/runtime/intake.py), the output and the handler (letters), and the batch twin
(pipeline/apps.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from faust.types import AppT, TopicT

from tables.operators.base import InputEvent, Side
from tables.records.codecs import (
    CHECK,
    DROPPED,
    IdSpec,
    Rejected,
    SideCodec,
    TimestampSpec,
    Validate,
    key_check,
    value_form,
)

# A record the join cannot use: topic, partition, offset, key, value, why.
Letter = tuple[str, int, int, bytes | None, bytes | None, Rejected]


class Record(Protocol):
    """A fetched record, as the checks read it."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...


class Partition(Protocol):
    """A topic partition (Faust's TP)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...


class Checked(NamedTuple):
    """The good records of a fetch as the operator takes them, with their offsets and times."""

    offsets: list[int]
    stamps: list[int]
    events: list[InputEvent]
    nulls: int


def check_records(
    codec: SideCodec,
    side: Side,
    tp: Partition,
    records: Sequence[Record],
    letters: list[Letter],
    built: dict[int, tuple[bytes, Any]],
) -> Checked:
    """Each record through its side's check (tables/records/codecs.py): accepted ones become
    events (and their values built on arrival go into `built`, by the id of their bytes),
    rejected ones dead letters (into `letters`), null values are counted. The loop over the
    records is compiled where the check is (tables/records/_fastcheck.pyx `check_many`: no
    Python frame per record); `python_check_records` is its reference."""
    fast = CHECK.fast
    if fast is not None:
        many = fast.check_many(codec.accept, side, tp.topic, tp.partition, records, letters, built, DROPPED)
        return Checked(*many)
    return python_check_records(codec, side, tp, records, letters, built)


def python_check_records(
    codec: SideCodec,
    side: Side,
    tp: Partition,
    records: Sequence[Record],
    letters: list[Letter],
    built: dict[int, tuple[bytes, Any]],
) -> Checked:
    """`check_records` in Python: the reference of the compiled loop."""
    accept = codec.accept
    offsets: list[int] = []
    stamps: list[int] = []
    events: list[InputEvent] = []
    nulls = 0
    topic, partition = tp.topic, tp.partition
    for record in records:
        key, value, offset = record.key, record.value, record.offset
        checked = accept(key, value, offset, record.timestamp)
        if type(checked) is tuple:
            ts = checked[0]
            offsets.append(offset)
            stamps.append(ts)
            events.append((side, key, ts, checked[1], value))
            if checked[2] is not None:
                built[id(value)] = (value, checked[2])  # type: ignore[assignment]
        elif checked is DROPPED:
            nulls += 1
        else:
            letters.append((topic, partition, offset, key, value, checked))
    return Checked(offsets, stamps, events, nulls)


def side_codec(
    app: AppT,
    topic: TopicT,
    name: str,
    *,
    timestamp: TimestampSpec = None,
    record_id: IdSpec = None,
    validate: Validate | None = None,
    max_value_bytes: int | None = None,
    max_future_ms: int | None = None,
    max_record_bytes: int | None = None,
    deletes: bool = False,
    null_keys: bool = False,
) -> SideCodec:
    """The check of one input's records, from its Faust topic's types and serializers
    (`deletes`: the input is a table, whose null values delete their key; `null_keys`: a
    null-keyed record is accepted, to be a result with no partner)."""
    key_serializer = topic.key_serializer or app.conf.key_serializer  # type: ignore[attr-defined]
    value_serializer = topic.value_serializer or app.conf.value_serializer  # type: ignore[attr-defined]

    def loads_key(raw: bytes) -> Any:
        return app.serializers.loads_key(topic.key_type, raw, serializer=key_serializer)

    def loads_value(raw: bytes) -> Any:
        return app.serializers.loads_value(topic.value_type, raw, serializer=value_serializer)

    return SideCodec(
        name,
        key_check(topic.key_type, key_serializer, loads_key),  # type: ignore[arg-type]
        value_form(topic.value_type, value_serializer, loads_value),  # type: ignore[arg-type]
        timestamp=timestamp,
        record_id=record_id,
        validate=validate,
        max_value_bytes=max_value_bytes,
        max_future_ms=max_future_ms,
        max_record_bytes=max_record_bytes,
        deletes=deletes,
        null_keys=null_keys,
    )

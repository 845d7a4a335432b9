"""Record batches filled by `fill_batch` (aiokafka's record-batch builder, without
BatchBuilder.append's wrapper) are the batches append builds, byte for byte; and
`start_sending` delivers them to a real broker in order, headers included."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch

from assignor.internals import check
from tables.kafka.batches import batch_problems, create_batch, fill_batch, send_records, start_sending
from tables.kafka.topics import create_topics
from tables.settings import SEND_BATCH_BYTES

BATCH_SIZE = 16384  # aiokafka's default max_batch_size
STAMP_MS = 1_700_000_000_000
Records = Sequence[Any]


def _pairs(count: int) -> list[tuple[bytes | None, bytes | None]]:
    """The join's shape: ~40-byte keys, ~120-byte values; a few keys and values left out."""
    return [
        (None if n % 97 == 5 else os.urandom(40), None if n % 89 == 7 else os.urandom(100 + n % 41))
        for n in range(count)
    ]


def _triples(count: int) -> list[tuple[bytes | None, bytes | None, Any]]:
    """Records with their own headers: lists, tuples, none at all, a header without a value."""
    shapes: list[Any] = [[("h", b"1")], (("a", b"x" * 30), ("b", b"")), [], (), None, [("n", None)]]
    return [(key, value, shapes[n % len(shapes)]) for n, (key, value) in enumerate(_pairs(count))]


def _by_append(records: Records, headers: Any, timestamp_ms: int | None, **kwargs: Any) -> list[BatchBuilder]:
    """start_sending's loop before fill_batch: BatchBuilder.append per record."""
    batches = [BatchBuilder(BATCH_SIZE, 0, **kwargs)]
    for record in records:
        own = list(record[2] or ()) if len(record) > 2 else list(headers)
        for _ in range(2):
            if batches[-1].append(key=record[0], value=record[1], timestamp=timestamp_ms, headers=own):
                break
            batches.append(BatchBuilder(BATCH_SIZE, 0, **kwargs))
    return batches


def _by_fill(records: Records, headers: Any, timestamp_ms: int | None, **kwargs: Any) -> list[BatchBuilder]:
    """start_sending's loop now: fill_batch per batch."""
    batches: list[BatchBuilder] = []
    done = 0
    while done < len(records):
        batches.append(BatchBuilder(BATCH_SIZE, 0, **kwargs))
        count = fill_batch(batches[-1], records, headers, start=done, timestamp_ms=timestamp_ms)
        assert count > 0
        done += count
    return batches


def _built(batches: list[BatchBuilder]) -> list[tuple[int, bool, bytes]]:
    """Each batch's record count, whether it is closed, and its bytes."""
    return [(b.record_count(), b.closed(), bytes(b._build())) for b in batches]


def _decoded(buffer: bytes) -> list[tuple[int, Any, Any, Any]]:
    return [(r.offset, r.key, r.value, r.headers) for r in DefaultRecordBatch(buffer)]


@pytest.mark.parametrize("shape", ["pairs", "triples"])
def test_filled_batches_are_the_appended_ones_byte_for_byte(shape: str) -> None:
    records = _pairs(4000) if shape == "pairs" else _triples(4000)
    headers = [("source", b"join")] if shape == "pairs" else ()
    appended = _built(_by_append(records, headers, STAMP_MS))
    filled = _built(_by_fill(records, headers, STAMP_MS))
    assert len(appended) > 10  # full batches, each followed by one the next record started
    assert all(closed for _, closed, _ in appended[:-1]) and not appended[-1][1]
    assert filled == appended
    assert sum(count for count, _, _ in filled) == len(records)


def test_records_stamped_at_append_time_match_but_for_the_time() -> None:
    records = _triples(1500)
    before = int(time.time() * 1000)
    appended = _built(_by_append(records, (), None))
    filled = _built(_by_fill(records, (), None))
    after = int(time.time() * 1000)
    assert [(n, closed) for n, closed, _ in filled] == [(n, closed) for n, closed, _ in appended]
    for (_, _, mine), (_, _, theirs) in zip(filled, appended, strict=True):
        assert _decoded(mine) == _decoded(theirs)
        assert all(before <= r.timestamp <= after for r in DefaultRecordBatch(mine))


def test_a_batch_holding_records_is_filled_from_where_append_left_it() -> None:
    records = _pairs(300)
    appended = _by_append(records, [("h", b"1")], STAMP_MS)[0]
    started = BatchBuilder(BATCH_SIZE, 0)
    for key, value in records[:7]:
        started.append(key=key, value=value, timestamp=STAMP_MS, headers=[("h", b"1")])
    fitted = appended.record_count()
    assert fill_batch(started, records, [("h", b"1")], start=7, timestamp_ms=STAMP_MS) == fitted - 7
    assert _built([started]) == _built([appended])  # the record after the last that fit closed both
    assert fill_batch(started, records, start=fitted) == 0  # closed: nothing more goes in
    assert fill_batch(BatchBuilder(BATCH_SIZE, 0), records, start=300) == 0


def test_a_producer_with_serializers_gets_the_same_batches() -> None:
    records = [(f"k{n}", {"n": n}) for n in range(2000)]
    serializers = {"key_serializer": str.encode, "value_serializer": lambda v: repr(v).encode() * 4}
    appended = _built(_by_append(records, [("h", b"1")], STAMP_MS, **serializers))
    assert len(appended) > 1
    assert _built(_by_fill(records, [("h", b"1")], STAMP_MS, **serializers)) == appended


def test_a_record_that_cannot_be_encoded_leaves_the_count_at_what_went_in() -> None:
    batch = BatchBuilder(BATCH_SIZE, 0)
    with pytest.raises(TypeError):
        fill_batch(batch, [(b"k", b"v"), (b"k", b"v"), ("text", b"v")])
    assert batch.record_count() == 2 == len(list(DefaultRecordBatch(bytes(batch._build()))))


class _RenamedOffset(BatchBuilder):
    """What a newer aiokafka could do: keep the record count under another name."""

    def __init__(self, batch_size: int, compression_type: int) -> None:
        super().__init__(batch_size, compression_type)
        self._next_offset = self.__dict__.pop("_relative_offset")


class _HeadersAdded(BatchBuilder):
    """...or have append add a header of its own, which fill_batch would leave out."""

    def append(self, *, timestamp: Any, key: Any, value: Any, headers: Sequence[Any] = ()) -> Any:
        return super().append(timestamp=timestamp, key=key, value=value, headers=[*headers, ("v", b"2")])


def test_the_startup_check_refuses_a_batch_builder_fill_batch_was_not_written_for() -> None:
    assert batch_problems() == []
    check()  # the pinned versions: starts
    assert batch_problems(_RenamedOffset) == ["_RenamedOffset._relative_offset is missing"]
    differs = "_HeadersAdded: fill_batch builds other bytes than _HeadersAdded.append"
    assert batch_problems(_HeadersAdded) == [differs]


async def _read_back(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 1)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        read: list[Any] = []
        for _ in range(200):  # bounded: a few fetches are enough
            fetched = await consumer.getmany(tp, timeout_ms=500)
            read += fetched.get(tp, [])
            if len(read) >= count:
                break
        return read
    finally:
        await consumer.stop()


async def _send_and_read(bootstrap: str, topic: str) -> tuple[Any, ...]:
    await create_topics(bootstrap, {topic: 2})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        pairs, triples = _pairs(9000), _triples(2000)  # the pairs fill three 512 KB batches
        acks = await start_sending(producer, topic, 1, pairs, [("h", b"1")])
        counts = [n for _, n in acks]
        small_acks = await start_sending(producer, topic, 0, pairs, batch_bytes=16384)
        small = [n for _, n in small_acks]
        for future, _ in small_acks:
            await future  # type: ignore[misc]
        last = await send_records(producer, topic, 1, triples)
        for future, _ in acks:
            await future  # type: ignore[misc]
    finally:
        await producer.stop()
    sent = [(k, v, [("h", b"1")]) for k, v in pairs] + [(k, v, list(h or ())) for k, v, h in triples]
    return sent, counts, last, await _read_back(bootstrap, topic, len(sent)), small


@pytest.mark.broker
@pytest.mark.timeout(120)
def test_start_sending_delivers_every_record_in_order_with_its_headers(broker: Any, unique: str) -> None:
    sent, counts, last, read, small = asyncio.run(_send_and_read(broker.bootstrap, f"produce-{unique}"))
    assert len(counts) == 3 and sum(counts) == 9000  # whole batches of up to 512 KB, each counted
    assert len(small) > 10 and sum(small) == 9000  # TANDEM_SEND_BATCH_BYTES=16384: the producer's size
    assert last == len(sent) - 1
    assert [r.offset for r in read] == list(range(len(sent)))
    assert [(r.key, r.value, [(k, v) for k, v in r.headers]) for r in read] == sent


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_the_join_s_batches_are_the_producer_s_but_larger(compression: str | None) -> None:
    """create_batch: the bytes producer.create_batch() would build (its codec), in batches of
    up to SEND_BATCH_BYTES instead of the producer's 16 KB."""

    async def build() -> tuple[bytes, bytes, int]:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", compression_type=compression)
        theirs, ours, records = producer.create_batch(), create_batch(producer), _pairs(40)
        for batch in (theirs, ours):
            assert fill_batch(batch, records, timestamp_ms=1_700_000_000_000) == 40
        many = [(b"k" * 40, b"v" * 140)] * (SEND_BATCH_BYTES // 200)  # ~200 bytes each
        fitted = fill_batch(create_batch(producer), many)
        return bytes(theirs._builder.build()), bytes(ours._builder.build()), fitted - len(many)

    theirs, ours, left_out = asyncio.run(build())
    assert ours == theirs
    assert left_out == 0

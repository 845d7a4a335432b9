"""Producing whole record batches with an aiokafka producer (the join's output, its dead
letters and its changelog).

- `start_sending()` / `send_records()`: records handed to the producer as whole, closed
  record batches (far cheaper than one `send()` each; sent at once, without `linger_ms`).
- `fill_batch()`: appends records to an aiokafka `BatchBuilder` through its record-batch
  builder, without `BatchBuilder.append`'s Python wrapper per record (the same bytes).
- `create_batch()`: an empty `BatchBuilder` as the producer makes them, but larger
  (`tables.settings.SEND_BATCH_BYTES`: the join sends thousands of records at once; the
  producer's batches are sized for records trickling in under linger).
- `RecordsTooLarge`: records no batch can carry within the producer's `max_request_size`
  (aiokafka's `send()` refuses them, `send_batch` does not look): refused before anything is
  sent, for the caller to dead-letter or skip (a broker would refuse them for ever).

The private aiokafka names these use are declared to Tandem's check
(assignor/internals.py), with a probe that fills a batch both ways.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

import aiokafka
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.producer.message_accumulator import BatchBuilder
from faust.types import AppT

from assignor import internals
from tables.settings import SEND_BATCH_BYTES

RecordHeaders = Sequence[tuple[str, bytes | None]]
Pair = tuple[bytes | None, bytes | None]
Triple = tuple[bytes | None, bytes | None, RecordHeaders]

# BatchBuilder's instance attributes fill_batch reads or sets (not on the class: set in __init__).
_BATCH_ATTRIBUTES = ("_builder", "_relative_offset", "_closed", "_key_serializer", "_value_serializer")
# A probe for check(): in a batch of _PROBE_SIZE bytes, the last record does not fit.
_PROBE: list[Triple] = [(b"k", b"v" * 8, [("h", b"1")]), (None, b"w" * 8, ()), (b"k", None, [("h", None)])]
_PROBE_SIZE = 100
_PROBE_MS = 1_700_000_000_000
_NO_HEADERS: list[Any] = []  # for records without headers (the builder only reads it)


def fill_batch(
    batch: BatchBuilder,
    records: Sequence[Pair] | Sequence[Triple],
    headers: RecordHeaders = (),
    start: int = 0,
    timestamp_ms: int | None = None,
) -> int:
    """Append `records[start:]` to `batch` until it is full; return how many went in.

    Records are all (key, value), each with `headers`, or all (key, value, its own
    headers). The batch is byte for byte what `batch.append()` per record builds, and is
    closed, as append closes it, when a record does not fit; `timestamp_ms` None stamps
    each record with the time it is appended (as append does). What this saves is
    append's Python wrapper: ~0.25-0.3 us per record (benchmarks/bench_producing.py)."""
    if batch._closed or start >= len(records):
        return 0
    if batch._key_serializer is not None or batch._value_serializer is not None:
        return _fill_by_append(batch, records, headers, start, timestamp_ms)
    before = batch._relative_offset
    if len(records[start]) == 2:
        fitted = _append_pairs(batch, records, list(headers), start, timestamp_ms)  # type: ignore[arg-type]
    else:
        fitted = _append_triples(batch, records, start, timestamp_ms)  # type: ignore[arg-type]
    if not fitted:
        batch.close()
    return int(batch._relative_offset - before)


def _append_pairs(
    batch: BatchBuilder, records: Sequence[Pair], on_each: list[Any], start: int, timestamp_ms: int | None
) -> bool:
    """Whether all of records[start:] went in; the batch's record count follows every append."""
    append = batch._builder.append
    offset = batch._relative_offset
    try:
        for i in range(start, len(records)):
            key, value = records[i]
            if append(offset, timestamp_ms, key, value, on_each) is None:
                return False
            offset += 1
        return True
    finally:
        batch._relative_offset = offset


def _append_triples(
    batch: BatchBuilder, records: Sequence[Triple], start: int, timestamp_ms: int | None
) -> bool:
    """As _append_pairs, each record with its own headers (the builder takes only a list)."""
    append = batch._builder.append
    offset = batch._relative_offset
    try:
        for i in range(start, len(records)):
            key, value, own = records[i]
            if type(own) is not list:
                own = list(own) if own else _NO_HEADERS
            if append(offset, timestamp_ms, key, value, own) is None:
                return False
            offset += 1
        return True
    finally:
        batch._relative_offset = offset


def _fill_by_append(
    batch: BatchBuilder,
    records: Sequence[Pair] | Sequence[Triple],
    headers: RecordHeaders,
    start: int,
    timestamp_ms: int | None,
) -> int:
    """The public path, for a producer with serializers (Faust's has none)."""
    on_each = list(headers)
    for i in range(start, len(records)):
        record = records[i]
        own = list(record[2] or ()) if len(record) > 2 else on_each
        if batch.append(key=record[0], value=record[1], timestamp=timestamp_ms, headers=own) is None:
            return i - start
    return len(records) - start


def batch_problems(builder_type: type[BatchBuilder] = BatchBuilder) -> list[str]:
    """What fill_batch needs of aiokafka's BatchBuilder and is missing, or a probe batch
    it fills differing from the same records appended one by one."""
    name = builder_type.__name__
    filled, appended = builder_type(_PROBE_SIZE, 0), builder_type(_PROBE_SIZE, 0)
    missing = [attribute for attribute in _BATCH_ATTRIBUTES if not hasattr(filled, attribute)]
    if missing:
        return [f"{name}.{attribute} is missing" for attribute in missing]
    for key, value, own in _PROBE:
        appended.append(key=key, value=value, timestamp=_PROBE_MS, headers=list(own))
    try:
        fill_batch(filled, _PROBE, timestamp_ms=_PROBE_MS)
        same = (filled.record_count(), filled.closed(), filled._builder.build()) == (
            appended.record_count(),
            appended.closed(),
            appended._builder.build(),
        )
    except Exception as error:  # e.g. the record-batch builder's append changed its arguments
        return [f"{name}: fill_batch fails ({error!r})"]
    return [] if same else [f"{name}: fill_batch builds other bytes than {name}.append"]


# The producer's instance attributes create_batch reads (set in its __init__).
_PRODUCER_ATTRIBUTES = ("_compression_type", "_txn_manager", "_key_serializer", "_value_serializer")


def producer_problems(producer: aiokafka.AIOKafkaProducer) -> list[str]:
    """What create_batch needs of an aiokafka producer and is missing."""
    missing = [name for name in _PRODUCER_ATTRIBUTES if not hasattr(producer, name)]
    return [f"AIOKafkaProducer.{name} is missing" for name in missing]


def create_batch(producer: aiokafka.AIOKafkaProducer, size: int = SEND_BATCH_BYTES) -> BatchBuilder:
    """An empty record batch of up to `size` bytes, with the producer's compression,
    transactions and serializers, as `producer.create_batch()` makes one."""
    txn, codec = producer._txn_manager, producer._compression_type
    return BatchBuilder(
        size,
        producer._COMPRESSORS[codec][1] if codec else 0,  # the codec's attribute bits
        is_transactional=txn is not None and txn.transactional_id is not None,
        key_serializer=producer._key_serializer,
        value_serializer=producer._value_serializer,
    )


def producer_of(app: AppT) -> aiokafka.AIOKafkaProducer:
    """The aiokafka producer inside Faust's producer (started with the app)."""
    return app.producer._ensure_producer()  # type: ignore[attr-defined]


Headers = Sequence[tuple[str, bytes]]


class RecordsTooLarge(MessageSizeTooLargeError):
    """Records of a send larger than the producer's `max_request_size` (each alone in its
    batch): nothing of the send was handed to the producer. `too_large` maps each one's index
    in the records given to its size in bytes (a record batch of it alone)."""

    def __init__(self, topic: str, too_large: dict[int, int], limit: int) -> None:
        self.topic, self.too_large, self.limit = topic, too_large, limit
        sizes = ", ".join(f"{size} bytes" for size in list(too_large.values())[:3])
        super().__init__(
            f"{len(too_large)} record(s) to {topic} larger than the producer's max_request_size "
            f"({limit} bytes): {sizes}"
        )


def max_record_bytes(producer: AIOKafkaProducer) -> int | None:
    """The largest record batch the producer sends: its `max_request_size` (Faust's
    `producer_max_request_size`, 1,000,000 by default; a broker refuses a batch over its own
    `message.max.bytes`, 1 MB by default, for ever). None: no limit known."""
    return getattr(producer, "_max_request_size", None)


async def send_records(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    records: Sequence[tuple[bytes | None, bytes | None]],
    headers: Headers = (),
    batch_bytes: int = SEND_BATCH_BYTES,
) -> int | None:
    """Produce (key, value) records to one partition in order and wait for the acks.
    Returns the last offset written. `headers` go on every record."""
    acks = await start_sending(producer, topic, partition, records, headers, batch_bytes)
    last = None
    for future, count in acks:
        ack = await future
        last = ack.offset + count - 1
    return last


async def start_sending(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    records: Sequence[Pair] | Sequence[Triple],
    headers: Headers = (),
    batch_bytes: int = SEND_BATCH_BYTES,
) -> list[tuple[Awaitable[Any], int]]:
    """Hand records to the producer as whole record batches (far cheaper than one send()
    each) and return (ack future, records in its batch) pairs to await. The records are
    all (key, value), each with `headers`, or all (key, value, its own headers).

    Batches are up to `batch_bytes` (512 KB), not the producer's 16 KB,
    and each is closed before it is handed over: a closed batch is sent at once, an open
    one would wait out the producer's `linger_ms` first.

    A record that does not fit in `batch_bytes` goes alone in its batch; one whose batch is
    over the producer's `max_request_size` raises `RecordsTooLarge` before anything is sent."""
    if not records:
        return []
    limit = max_record_bytes(producer)
    if limit is not None:
        batch_bytes = min(batch_bytes, limit)  # then only a record alone can make a batch too large
    batches: list[tuple[BatchBuilder, int]] = []
    too_large: dict[int, int] = {}
    done = 0
    while done < len(records):
        batch = create_batch(producer, batch_bytes)
        count = fill_batch(batch, records, headers, start=done)
        if count == 0:
            value = records[done][1]
            raise ValueError(f"a record of {len(value or b'')} bytes does not fit in a batch of {topic}")
        if count == 1 and limit is not None and (size := batch.size()) > limit:
            too_large[done] = size
        batches.append((batch, count))
        done += count
    if too_large:
        raise RecordsTooLarge(topic, too_large, limit)  # type: ignore[arg-type]
    sent = []
    for b, n in batches:
        b.close()
        sent.append((await producer.send_batch(b, topic, partition=partition), n))
    return sent


internals.require(__name__, aiokafka.AIOKafkaProducer, "_COMPRESSORS", "send_batch")
internals.require(__name__, aiokafka.AIOKafkaProducer, *_PRODUCER_ATTRIBUTES, instance=True)
internals.require(__name__, BatchBuilder, *_BATCH_ATTRIBUTES, instance=True)
internals.require(__name__, aiokafka.AIOKafkaProducer, "_max_request_size", instance=True)

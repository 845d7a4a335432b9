"""Small blocking helpers over aiokafka for the Spark data source and the jobs.

The embedded broker answers ListOffsets(latest) with the first offset of the
last batch + 1 (docs/embedded-broker.md), so the end of a partition is read
from a fetch response's high watermark, which is right on every broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

FETCH_SETTINGS: dict[str, int] = {
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
    "fetch_max_bytes": 32 * 1024 * 1024,
    "request_timeout_ms": 20000,
}


class KafkaReadError(RuntimeError):
    """A partition could not be read to its planned end."""


@dataclass(frozen=True, slots=True)
class Span:
    """Offsets [start, end) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **FETCH_SETTINGS,
    )


async def _partitions(consumer: AIOKafkaConsumer, topics: list[str]) -> list[TopicPartition]:
    await consumer.topics()  # refreshes the metadata that partitions_for_topic reads
    tps: list[TopicPartition] = []
    for topic in topics:
        found = consumer.partitions_for_topic(topic)
        if not found:
            raise KafkaReadError(f"topic {topic!r} does not exist or has no partitions")
        tps.extend(TopicPartition(topic, p) for p in sorted(found))
    return tps


async def _offsets(bootstrap: str, topics: list[str], timeout: float) -> dict[str, tuple[int, int]]:
    """'topic:partition' -> (beginning, end), the end from fetch high watermarks."""
    consumer = _consumer(bootstrap)
    await consumer.start()
    try:
        tps = await _partitions(consumer, topics)
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        approx = await consumer.end_offsets(tps)
        for tp in tps:
            # At or below the true end: the fetch from there returns at most one batch.
            consumer.seek(tp, max(begin[tp], approx[tp] - 1))
        deadline = time.monotonic() + timeout
        while any(consumer.highwater(tp) is None for tp in tps):
            if time.monotonic() > deadline:
                raise KafkaReadError(f"no high watermark for {topics} within {timeout} s")
            await consumer.getmany(*tps, timeout_ms=200, max_records=1)
        return {f"{tp.topic}:{tp.partition}": (begin[tp], consumer.highwater(tp)) for tp in tps}
    finally:
        await consumer.stop()


def offsets(bootstrap: str, topics: list[str], timeout: float = 30.0) -> dict[str, tuple[int, int]]:
    """Beginning and end offsets of every partition of `topics`, keyed 'topic:partition'."""
    return asyncio.run(_offsets(bootstrap, topics, timeout))


async def _span_batches(
    bootstrap: str, span: Span, batch_records: int, stall_timeout: float
) -> AsyncIterator[list[ConsumerRecord]]:
    consumer = _consumer(bootstrap)  # aiokafka binds to the loop running at creation
    await consumer.start()
    tp = TopicPartition(span.topic, span.partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, span.start)
        position = span.start
        last_progress = time.monotonic()
        while position < span.end:
            fetched = await consumer.getmany(tp, timeout_ms=500, max_records=batch_records)
            records = [r for r in fetched.get(tp, []) if span.start <= r.offset < span.end]
            new_position = await consumer.position(tp)
            if new_position > position:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout:
                raise KafkaReadError(f"{span} stalled at offset {position}")
            position = new_position
            if records:
                yield records
    finally:
        await consumer.stop()


def read_span(
    bootstrap: str, span: Span, batch_records: int = 5000, stall_timeout: float = 30.0
) -> Iterator[list[ConsumerRecord]]:
    """The records of `span` in offset order, in lists of up to `batch_records`.

    A blocking generator (Spark's read() is one) driving aiokafka on a private loop.
    """
    if span.end <= span.start:
        return
    loop = asyncio.new_event_loop()
    batches = _span_batches(bootstrap, span, batch_records, stall_timeout)
    try:
        while True:
            try:
                yield loop.run_until_complete(batches.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(batches.aclose())
        loop.close()

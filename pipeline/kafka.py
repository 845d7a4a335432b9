"""Small blocking helpers over aiokafka for the Spark data source and the jobs.

The embedded broker answers ListOffsets(latest) with the first offset of the
last batch + 1 (docs/embedded-broker.md), so the end of a partition is read
from a fetch response's high watermark, which is right on every broker.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from assignor import clients

FETCH_SETTINGS: dict[str, int] = {
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
    "fetch_max_bytes": 32 * 1024 * 1024,
    "request_timeout_ms": 20000,
}


class KafkaReadError(RuntimeError):
    """A partition could not be read to its planned end."""


@dataclass(frozen=True, slots=True)
class Connection:
    """How the jobs reach Kafka: bootstrap servers and, for a secured cluster, a client
    properties file (`--client-config`: security.protocol, sasl.*, ssl.*; read where the
    client is made, so Spark's executors need the file and what it names at the same path)."""

    bootstrap: str
    client_config: str | None = None

    def settings(self) -> dict[str, object]:
        found = clients.settings_of(self.bootstrap)
        if self.client_config:
            text = Path(self.client_config).read_text()
            found.update(clients.aiokafka_kwargs(clients.parse_client_config(text), include_endpoints=False))
        return found


def connection_of(target: str | Connection) -> Connection:
    """A Connection from bootstrap servers alone (plaintext) or as it is."""
    return target if isinstance(target, Connection) else Connection(target)


def add_client_config_argument(parser: argparse.ArgumentParser) -> None:
    """`--client-config FILE`, the convention of `kafka-console-consumer --consumer.config`
    and kcat `-F` (docs/operations.md, "Secured clusters")."""
    parser.add_argument(
        "--client-config",
        metavar="FILE",
        help="Kafka client properties for a secured cluster (security.protocol, sasl.*, ssl.*)",
    )


def connection_from(args: argparse.Namespace) -> Connection:
    """The connection the command line names (`--bootstrap`, `--client-config`); checked now,
    so that a bad file is one clear error before Spark starts."""
    found = Connection(args.bootstrap, getattr(args, "client_config", None))
    if found.client_config:
        try:
            found.settings()
        except (OSError, clients.ClientConfigError) as exc:
            raise SystemExit(f"--client-config {found.client_config}: {exc}") from None
    return found


def source_options(target: str | Connection) -> dict[str, str]:
    """The `tandem-topic` source's connection options."""
    found = connection_of(target)
    options = {"bootstrap": found.bootstrap}
    if found.client_config:
        options["kafka.client.config"] = found.client_config
    return options


@dataclass(frozen=True, slots=True)
class Span:
    """Offsets [start, end) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


def _consumer(target: str | Connection) -> AIOKafkaConsumer:
    settings = connection_of(target).settings()
    return clients.consumer(
        settings, enable_auto_commit=False, auto_offset_reset="earliest", **FETCH_SETTINGS
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


async def _offsets(target: str | Connection, topics: list[str], timeout: float) -> dict[str, tuple[int, int]]:
    """'topic:partition' -> (beginning, end), the end from fetch high watermarks."""
    consumer = _consumer(target)
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


def offsets(target: str | Connection, topics: list[str], timeout: float = 30.0) -> dict[str, tuple[int, int]]:
    """Beginning and end offsets of every partition of `topics`, keyed 'topic:partition'."""
    return asyncio.run(_offsets(target, topics, timeout))


async def _span_batches(
    target: str | Connection, span: Span, batch_records: int, stall_timeout: float
) -> AsyncGenerator[list[ConsumerRecord]]:
    consumer = _consumer(target)  # aiokafka binds to the loop running at creation
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
    target: str | Connection, span: Span, batch_records: int = 5000, stall_timeout: float = 30.0
) -> Iterator[list[ConsumerRecord]]:
    """The records of `span` in offset order, in lists of up to `batch_records`.

    A blocking generator (Spark's read() is one) driving aiokafka on a private loop.
    """
    if span.end <= span.start:
        return
    loop = asyncio.new_event_loop()
    batches = _span_batches(target, span, batch_records, stall_timeout)
    try:
        while True:
            try:
                yield loop.run_until_complete(batches.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(batches.aclose())
        loop.close()

"""Producing whole record batches, and creating the join's own topics."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.producer.message_accumulator import BatchBuilder

from assignor.faust_adapter import consumer as faust_internals

Headers = Sequence[tuple[str, bytes]]


async def send_records(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    records: Sequence[tuple[bytes | None, bytes | None]],
    headers: Headers = (),
    batch_bytes: int = faust_internals.JOIN_BATCH_BYTES,
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
    records: Sequence[tuple[bytes | None, bytes | None]]
    | Sequence[tuple[bytes | None, bytes | None, Headers]],
    headers: Headers = (),
    batch_bytes: int = faust_internals.JOIN_BATCH_BYTES,
) -> list[tuple[object, int]]:
    """Hand records to the producer as whole record batches (far cheaper than one send()
    each) and return (ack future, records in its batch) pairs to await. The records are
    all (key, value), each with `headers`, or all (key, value, its own headers).

    Batches are up to `batch_bytes` (512 KB), not the producer's 16 KB,
    and each is closed before it is handed over: a closed batch is sent at once, an open
    one would wait out the producer's `linger_ms` first."""
    if not records:
        return []
    batches: list[tuple[BatchBuilder, int]] = []
    done = 0
    while done < len(records):
        batch = faust_internals.create_batch(producer, batch_bytes)
        count = faust_internals.fill_batch(batch, records, headers, start=done)
        if count == 0:
            value = records[done][1]
            raise ValueError(f"a record of {len(value or b'')} bytes does not fit in a batch of {topic}")
        batches.append((batch, count))
        done += count
    sent = []
    for b, n in batches:
        b.close()
        sent.append((await producer.send_batch(b, topic, partition=partition), n))
    return sent


async def create_topics(
    bootstrap: str,
    counts: Mapping[str, int],
    configs: Mapping[str, Mapping[str, str]] | None = None,
    replication_factor: int = 1,
) -> None:
    """Create topics with their partition counts; existing ones are left as they are."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        for name, count in counts.items():
            topic = NewTopic(
                name, count, replication_factor, topic_configs=dict((configs or {}).get(name, {}))
            )
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics([topic])
    finally:
        await admin.close()


def changelog_configs(retention_ms: int | None) -> dict[str, str]:
    """A join changelog's topic settings: compacted, and deleted by time once no record
    in it can still be needed (the join writes no tombstones for expired records)."""
    if retention_ms is None:
        return {"cleanup.policy": "compact"}
    return {"cleanup.policy": "compact,delete", "retention.ms": str(retention_ms)}

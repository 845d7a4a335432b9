"""The embedded broker starts, carries records, and stops by its process id."""

from __future__ import annotations

import asyncio
import os

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tables.testing import EmbeddedBroker, create_topics


async def _round_trip(bootstrap: str, topic: str) -> list[bytes]:
    await create_topics(bootstrap, {topic: 2})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(10):
            await producer.send_and_wait(topic, f"v{i}".encode(), key=f"k{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(20):
            while len(seen) < 10:
                batch = await consumer.getmany(timeout_ms=500)
                seen.extend(r.value for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return seen


def test_records_round_trip_through_the_embedded_broker(unique: str) -> None:
    with EmbeddedBroker() as broker:
        pid = broker.pid
        seen = asyncio.run(_round_trip(broker.bootstrap, f"t-{unique}"))
        assert sorted(seen) == sorted(f"v{i}".encode() for i in range(10))
    assert pid is not None
    # Stopped by its id: the process is gone.
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive

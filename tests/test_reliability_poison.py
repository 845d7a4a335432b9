"""A poison record on a real worker (issue 36, finding 1): a 1,000,000-byte value of `\\x01`
bytes became a 6,001,140-byte dead letter, which a broker with Kafka's default 1 MB
`message.max.bytes` refuses; the batch then failed, and the restarted worker read the same
record again, for ever. Its letter is now bounded, and the worker goes on joining.

The embedded broker (tansu) enforces no size limit (neither `message.max.bytes` nor a topic's
`max.message.bytes`: checked, a 3 MB record is taken): the limit is the producer's own
`max_request_size` (Faust's `producer_max_request_size`, 1,000,000 by default), which the join's
batch path now checks as aiokafka's `send()` does (tables/kafka/batches.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tables.kafka.batches import RecordsTooLarge, start_sending
from tables.testing import EmbeddedBroker, create_topics, high_watermarks
from tests.workers import cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]
POISON = b"\x01" * 1_000_000


async def _send(bootstrap: str, sends: list[tuple[str, bytes, bytes]]) -> list[tuple[int, int]]:
    """Send in order (a producer that takes the poison record); where each landed."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 << 20)
    await producer.start()
    try:
        landed = []
        for topic, key, value in sends:
            meta = await producer.send_and_wait(topic, value, key=key)
            landed.append((meta.partition, meta.offset))
        return landed
    finally:
        await producer.stop()


def _pair(run: str, n: int, now: int, impressions: str, clicks: str) -> list[tuple[str, bytes, bytes]]:
    auction = f"{run}-a{n}"
    imp = {"event_id": f"i{n}", "auction_id": auction, "campaign_id": "c", "ts": now}
    click = {"event_id": f"c{n}", "auction_id": auction, "ts": now + 10}
    return [
        (impressions, auction.encode(), json.dumps(imp).encode()),
        (clicks, auction.encode(), json.dumps(click).encode()),
    ]


def test_a_poison_record_gets_a_bounded_letter_and_the_worker_goes_on_joining(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path) as c:
        worker = c.worker("w1", "host-a").start()
        c.wait_covered(90)
        pid = worker.process.pid if worker.process else None
        s = c.settings
        now = int(time.time() * 1000)
        first, after = (
            _pair(unique, 1, now, s.impressions, s.clicks),
            _pair(unique, 2, now, s.impressions, s.clicks),
        )
        poison = (s.impressions, f"{unique}-a1".encode(), POISON)  # between a pair, on its key
        landed = asyncio.run(_send(broker.bootstrap, [first[0], poison, first[1], *after]))

        joined = c.joins({"i1|c1", "i2|c2"}, timeout=90)
        assert {"i1|c1", "i2|c2"} <= joined, f"the pairs around the poison record were not joined: {joined}"
        letters = c.read(s.dead_letters, lambda rs: len(rs) >= 1, 30)
        (letter,) = [x for x in letters if (x["partition"], x["offset"]) == landed[1]]
        assert letter["category"] == "too_large" and letter["value_bytes"] == len(POISON)
        assert letter["value_sha256"] == hashlib.sha256(POISON).hexdigest()
        assert len(json.dumps(letter)) < 200_000  # 6,001,140 bytes before
        worker.check()
        assert worker.alive and worker.process is not None and worker.process.pid == pid


async def _refused_before_sending(bootstrap: str, topic: str) -> tuple[RecordsTooLarge, dict[int, int]]:
    await create_topics(bootstrap, [topic], partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=100_000)
    await producer.start()
    try:
        records = [(b"k", b"small"), (b"k", b"x" * 150_000), (b"k", b"small")]
        with pytest.raises(RecordsTooLarge) as refused:
            await start_sending(producer, topic, 0, records)
        acks = await start_sending(producer, topic, 0, [records[0], records[2]])
        for future, _ in acks:
            await future  # type: ignore[misc]
    finally:
        await producer.stop()
    return refused.value, await high_watermarks(bootstrap, topic, 1, 15)


def test_a_record_over_the_producers_max_request_size_is_refused_before_anything_is_sent(
    broker: EmbeddedBroker, unique: str
) -> None:
    """Handed to `send_batch` alone in its batch, it went out however large; now the whole send
    is refused with the record named, and nothing of it reaches the broker."""
    refused, ends = asyncio.run(_refused_before_sending(broker.bootstrap, f"too-large-{unique}"))
    assert list(refused.too_large) == [1] and refused.too_large[1] > 150_000 and refused.limit == 100_000
    assert ends == {0: 2}  # only the two small records of the second send

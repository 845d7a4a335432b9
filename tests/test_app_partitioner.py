"""Clicks from a librdkafka producer (confluent-kafka) joined with impressions from aiokafka:
with librdkafka's default partitioner most clicks land where their impressions never are.
The worker dead-letters each with a reason that names both partitions, counts it, and
joins every correctly placed click (the issue's mixed-producer scenario)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from app.cluster import WorkerProcess, covered
from app.settings import create_topics, from_env
from tables.records.partitioners import partition_for
from tables.testing import EmbeddedBroker, read_records, wait_for
from tests.librdkafka_producer import produce_with_librdkafka
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

PARTITIONS = 4
N = 1000


async def _impressions(bootstrap: str, topic: str, rows: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)  # murmur2, as Kafka's Java client
    await producer.start()
    try:
        for key, value in rows:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def test_a_librdkafka_producer_on_its_default_partitioner_is_caught(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    settings = dataclasses.replace(
        from_env(), app_id=f"part-{unique}", topic_prefix=f"p{unique}-", partitions=PARTITIONS
    )
    asyncio.run(create_topics(broker.bootstrap, settings))
    worker = WorkerProcess(
        "w1", "host-a", "r", broker.bootstrap, settings.app_id, tmp_path,
        standby_replicas=0, partitions=PARTITIONS, topic_prefix=settings.topic_prefix,
    ).start()  # fmt: skip
    try:
        assert wait_for(lambda: covered([worker], PARTITIONS), 60)
        now = int(time.time() * 1000)
        auctions = [f"{unique}-a{n}" for n in range(2 * N)]
        impressions = [
            (
                a.encode(),
                json.dumps({"event_id": f"i{n}", "auction_id": a, "campaign_id": "c", "ts": now}).encode(),
            )
            for n, a in enumerate(auctions)
        ]
        clicks = [
            (a.encode(), json.dumps({"event_id": f"k{n}", "auction_id": a, "ts": now + 1}).encode())
            for n, a in enumerate(auctions)
        ]
        asyncio.run(_impressions(broker.bootstrap, settings.impressions, impressions))
        produce_with_librdkafka(broker.bootstrap, settings.clicks, clicks[:N])  # librdkafka's default
        produce_with_librdkafka(broker.bootstrap, settings.clicks, clicks[N:], partitioner="murmur2_random")

        placed = [n for n, a in enumerate(auctions[:N]) if _agree(a.encode())]
        expected = {f"i{n}|k{n}" for n in placed} | {f"i{n}|k{n}" for n in range(N, 2 * N)}
        letters = asyncio.run(
            _read(broker.bootstrap, settings.dead_letters, lambda rs: len(rs) >= N - len(placed), 60)
        )
        joins = {
            r["join_id"]
            for r in asyncio.run(
                _read(broker.bootstrap, settings.joins, lambda rs: {r["join_id"] for r in rs} >= expected, 60)
            )
        }
        print(f"joined {len(joins)} ({len(placed)} by the default partitioner), dead letters {len(letters)}")
        assert joins == expected  # every correctly placed click joined, the misplaced none
        assert 150 < len(placed) < 350  # about a quarter land where murmur2 would put them
        assert len(letters) == N - len(placed)
        for letter in letters:
            assert letter["category"] == "wrong_partition" and letter["topic"] == settings.clicks
            expected_partition = partition_for(letter["key"].encode(), PARTITIONS, "murmur2")
            assert f"belongs to partition {expected_partition} under murmur2" in letter["reason"]
            assert f"read from partition {letter['partition']}" in letter["reason"]
            assert "murmur2_random" in letter["reason"]  # what to change in the producer
        # Results go to the partition Kafka's partitioner gives their key (they are keyed by
        # auction id, so the partition of the impression and click they join).
        outputs = asyncio.run(read_records(broker.bootstrap, settings.joins, PARTITIONS))
        assert outputs and all(partition_for(r.key, PARTITIONS, "murmur2") == r.partition for r in outputs)
        view = worker.join()
        assert view is not None and view["dead_letters_by_category"] == {"wrong_partition": N - len(placed)}
        log = worker.log_path.read_text()
        assert "belong to another partition under murmur2" in log
        assert log.count("belong to another partition") == 1  # at most once a minute per input
    finally:
        worker.stop(15)


def _agree(key: bytes) -> bool:
    return partition_for(key, PARTITIONS, "crc32") == partition_for(key, PARTITIONS, "murmur2")

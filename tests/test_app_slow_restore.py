"""A long restore never lets input be committed before it is joined (the old worker gave up
waiting after 30 s and acked records it had not joined: data loss)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.cluster import WorkerProcess
from app.settings import create_topics, from_env
from tables.kafka.batches import send_records
from tables.kafka.topics import changelog_configs
from tables.kafka.topics import create_topics as create_with_configs
from tables.operators.kv import MemoryKV
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin
from tables.testing import EmbeddedBroker, wait_for
from tests.workers import _read

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

IMPRESSIONS = 150_000


async def _fill_changelog(bootstrap: str, topic: str, base_ts: int) -> int:
    """The changelog a worker would have written for IMPRESSIONS impressions of partition 0."""
    join = WindowedJoin(MemoryKV(), JoinWindow(0, 600_000, 60_000), JoinType.INNER, ids=True)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_batch_size=512 * 1024)
    await producer.start()
    try:
        for start in range(0, IMPRESSIONS, 20_000):
            for n in range(start, start + 20_000):
                ts = base_ts + n // 1000  # all within a few minutes: clicks sent later are not late
                value = {"event_id": f"i{n}", "auction_id": f"a{n}", "campaign_id": "c", "ts": ts}
                join.process("left", f"a{n}".encode(), ts, f"i{n}".encode(), orjson.dumps(value))
            await send_records(producer, topic, 0, join.take_changes())
    finally:
        await producer.stop()
    return IMPRESSIONS


async def _committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(tp)
    finally:
        await consumer.stop()


def test_input_is_not_committed_until_its_partition_is_restored_and_joined(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    settings = dataclasses.replace(
        from_env(), app_id=f"slow-{unique}", topic_prefix=f"s{unique}-", partitions=1
    )
    asyncio.run(create_topics(broker.bootstrap, settings))
    asyncio.run(
        create_with_configs(
            broker.bootstrap, {settings.changelog: 1}, {settings.changelog: changelog_configs(None)}
        )
    )
    base_ts = int(time.time() * 1000) - 3_600_000
    asyncio.run(_fill_changelog(broker.bootstrap, settings.changelog, base_ts))
    worker = WorkerProcess(
        "w1", "host-a", "r", broker.bootstrap, settings.app_id, tmp_path,
        standby_replicas=0, partitions=1, topic_prefix=settings.topic_prefix,
    ).start()  # fmt: skip
    try:
        assert wait_for(lambda: (worker.join() or {}).get("restoring"), 60, 0.05), "no restore seen"
        # Clicks for impressions that only the restored state holds, sent while it restores.
        clicks = [
            (f"a{n}", {"event_id": f"k{n}", "auction_id": f"a{n}", "ts": base_ts + n + 5})
            for n in range(0, IMPRESSIONS, 1000)
        ]
        asyncio.run(_send(broker.bootstrap, settings.clicks, clicks))
        tp = TopicPartition(settings.clicks, 0)
        seen_during_restore = []
        while (worker.join() or {}).get("restoring"):
            worker.check()
            seen_during_restore.append(asyncio.run(_committed(broker.bootstrap, settings.app_id, tp)))
        assert seen_during_restore, "the restore ended before the clicks were sent"
        assert all(offset in (None, 0) for offset in seen_during_restore), seen_during_restore
        restored = worker.join()["last_rebalance"]  # type: ignore[index]
        assert restored["replayed"] >= IMPRESSIONS, restored
        expected = {f"i{n}|k{n}" for n in range(0, IMPRESSIONS, 1000)}
        joined = {r["join_id"] for r in _read_sync(broker.bootstrap, settings.joins, expected)}
        assert expected <= joined, f"missing {len(expected - joined)}"
        assert wait_for(
            lambda: asyncio.run(_committed(broker.bootstrap, settings.app_id, tp)) == len(clicks), 15
        )
    finally:
        worker.stop(15)


async def _send(bootstrap: str, topic: str, rows: list[tuple[str, dict]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for key, value in rows:
            await producer.send(topic, orjson.dumps(value), key=key.encode())
        await producer.flush()
    finally:
        await producer.stop()


def _read_sync(bootstrap: str, topic: str, expected: set[str]) -> list[dict]:
    return asyncio.run(_read(bootstrap, topic, lambda rs: expected <= {r["join_id"] for r in rs}, 60))

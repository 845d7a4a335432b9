"""Restore, rebalances and standbys of a join's state (tables/state/manager.py) on the real embedded
broker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tables.kafka.topics import changelog_configs, create_topics
from tables.operators.windowed import JoinType, JoinWindow, Match
from tables.operators.windowed_kind import WindowedKind
from tables.state.manager import JoinState
from tables.testing import EmbeddedBroker
from tests.tables_helpers import comparable, dump

pytestmark = pytest.mark.broker

WINDOW = JoinWindow(before=0, after=1000, grace=10**7)


class Worker:
    """One worker's view of a join's state, with a producer for its changelog."""

    def __init__(
        self, broker: EmbeddedBroker, topic: str, data_dir: Path, window: JoinWindow = WINDOW
    ) -> None:
        self.state = JoinState(
            broker.bootstrap, topic, data_dir, kind=WindowedKind(window, JoinType.LEFT), table="joins"
        )
        self.producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        self.replayed: dict[int, int] = {}

    async def start(self) -> Worker:
        await self.producer.start()
        return self

    async def assign(self, active: set[int], standby: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        """Assign, then restore the new actives before returning (the runtime does it in the
        background, holding those partitions back)."""
        moves = await self.state.assign(active, standby)
        ready: list[int] = []
        await self.state.restore(moves.to_restore, ready.append)
        assert sorted(ready) == moves.to_restore
        self.replayed = {p: self.state.recovery.progress[p].restored for p in moves.to_restore}

    def process(self, partition: int, *event: Any) -> list[Match]:
        return self.state.active(partition).operator.process(*event)

    async def commit(self, partition: int) -> int | None:
        return await self.state.commit(partition, self.producer)

    async def close(self) -> None:
        await self.state.close()
        await self.producer.stop()


async def changelog(broker: EmbeddedBroker, topic: str, partitions: int) -> None:
    await create_topics(broker.bootstrap, {topic: partitions}, {topic: changelog_configs(None)})


async def feed(worker: Worker, partition: int, start: int, count: int) -> list[Match]:
    """Impressions start..start+count, each clicked once; one commit."""
    results = []
    for n in range(start, start + count):
        key, ts = f"p{partition}-a{n}".encode(), 1_000_000 + n
        results += worker.process(partition, "left", key, ts, b"i%d" % n, b"i%d" % n)
        results += worker.process(partition, "right", key, ts + 5, b"k%d" % n, b"k%d" % n)
    await worker.commit(partition)
    return results


def state_of(data_dir: Path, partition: int) -> dict[bytes, bytes]:
    return comparable(dump(data_dir / "joins" / str(partition)))


async def wait_until(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_rebalance_that_keeps_a_partition_replays_nothing(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topic = f"cl-{unique}"
    await changelog(broker, topic, 2)
    first = await Worker(broker, topic, tmp_path).start()
    await first.assign({0, 1})
    await feed(first, 0, 0, 200)
    await feed(first, 1, 0, 100)
    offsets = first.state.local_offsets()
    assert offsets == {0: 399, 1: 199}  # one changelog record per impression and click

    await first.assign({0})  # keeps 0, gives up 1
    assert first.replayed == {}
    assert first.state.local_offsets() == offsets  # 1 is closed but still on disk
    await first.close()

    restarted = await Worker(broker, topic, tmp_path).start()
    assert restarted.state.local_offsets() == offsets  # known before any assignment, for the assignor
    await restarted.assign({0, 1})
    assert restarted.replayed == {0: 0, 1: 0}
    assert [(m.left, m.right) for m in await feed(restarted, 0, 200, 1)] == [(b"i200", b"k200")]
    await restarted.close()


async def test_returning_partition_replays_only_what_it_missed(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topic = f"cl-{unique}"
    await changelog(broker, topic, 1)
    here = await Worker(broker, topic, tmp_path / "a").start()
    there = await Worker(broker, topic, tmp_path / "b").start()
    await here.assign({0})
    await feed(here, 0, 0, 150)
    await here.assign(set())  # revoked: files stay

    await there.assign({0})
    assert there.replayed == {0: 300}  # a new owner with no files replays everything
    await feed(there, 0, 150, 40)
    await there.assign(set())

    await here.assign({0})
    assert here.replayed == {0: 80}  # only the 40 impressions and 40 clicks it missed
    await here.close()
    await there.close()
    assert state_of(tmp_path / "a", 0) == state_of(tmp_path / "b", 0)


async def test_standby_tails_and_is_promoted_without_replay(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topic = f"cl-{unique}"
    await changelog(broker, topic, 1)
    active = await Worker(broker, topic, tmp_path / "a").start()
    standby = await Worker(broker, topic, tmp_path / "b").start()
    await active.assign({0})
    await standby.assign(set(), {0})
    await feed(active, 0, 0, 100)
    # An impression that will only be clicked after the standby is promoted.
    active.process(0, "left", b"open", 1_000_200, b"i-open", b"i-open")
    active.process(0, "left", b"open", 1_000_200, b"i-open", b"i-open")  # a duplicate, counted
    checkpoint = await active.commit(0)
    await wait_until(lambda: standby.state.local_offsets().get(0) == checkpoint)
    assert standby.state.standbys() == [0]
    assert standby.state.recovery.standby_lag == {0: 0}

    await active.assign(set())
    await standby.assign({0})
    assert standby.replayed == {0: 0}
    (result,) = standby.process(0, "right", b"open", 1_000_300, b"k-open", b"k-open")
    assert (result.left, result.right) == (b"i-open", b"k-open")
    join = standby.state.active(0).operator
    assert join.stream_time == 1_000_300 and join.duplicates == 1  # counters travel with the state
    await standby.commit(0)
    await active.close()
    await standby.close()


async def test_restore_ends_at_the_high_watermark_not_the_short_end_offset(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """Many changelog records per produce batch: tansu's ListOffsets is short, the fetch
    high watermark is right, and restore reads every record."""
    topic = f"cl-{unique}"
    await changelog(broker, topic, 1)
    writer = await Worker(broker, topic, tmp_path / "w").start()
    await writer.assign({0})
    await feed(writer, 0, 0, 2000)
    await writer.close()

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    end = (await consumer.end_offsets([tp]))[tp]
    await consumer.stop()
    assert end < 4000, "the broker fault this test is about is gone"

    reader = await Worker(broker, topic, tmp_path / "r").start()
    await reader.assign({0})
    assert reader.replayed == {0: 4000}
    assert reader.state.local_offsets() == {0: 3999}
    await reader.close()
    assert state_of(tmp_path / "r", 0) == state_of(tmp_path / "w", 0)


async def test_files_ahead_of_their_changelog_are_rebuilt(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """Local files whose checkpoint lies past the changelog's end (a recreated topic, a new
    cluster) are not trusted: they are dropped and the changelog replayed."""
    old, new = f"cl-old-{unique}", f"cl-new-{unique}"
    for topic in (old, new):
        await changelog(broker, topic, 1)
    writer = await Worker(broker, old, tmp_path).start()
    await writer.assign({0})
    await feed(writer, 0, 0, 50)
    await writer.close()

    reader = await Worker(broker, new, tmp_path).start()  # same files, other (empty) changelog
    await reader.assign({0})
    assert reader.state.active(0).operator.stream_time is None
    assert reader.state.local_offsets() == {}
    assert "discarding the local state" in reader.state.recovery.events[-1]
    await reader.close()


async def test_promoted_standby_emits_each_unmatched_record_once(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """What the old owner emitted is not emitted again; what was not yet due is, once."""
    topic = f"cl-{unique}"
    await changelog(broker, topic, 1)
    window = JoinWindow(before=0, after=100, grace=10)
    active = await Worker(broker, topic, tmp_path / "a", window).start()
    standby = await Worker(broker, topic, tmp_path / "b", window).start()
    await active.assign({0})
    await standby.assign(set(), {0})

    def impression(event_id: str, ts: int) -> tuple[Any, ...]:
        raw = event_id.encode()
        return ("left", raw, ts, raw, raw)

    assert active.process(0, *impression("i1", 1000)) == []
    assert active.process(0, *impression("i2", 1100)) == []
    emitted = active.process(0, *impression("i3", 1111))  # passes i1's 1000 + 100 + 10
    assert [m.left for m in emitted] == [b"i1"]
    checkpoint = await active.commit(0)
    await wait_until(lambda: standby.state.local_offsets().get(0) == checkpoint)

    await active.assign(set())
    await standby.assign({0})
    emitted = standby.process(0, *impression("i4", 1300))
    assert sorted(m.left for m in emitted) == [b"i2", b"i3"]  # type: ignore[type-var]
    await active.close()
    await standby.close()


async def test_a_standby_that_hit_a_full_disk_catches_up_once_space_returns(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """The standby's files on a real 16 MB tmpfs, filled up while it tails: its writes fail, it
    retries every second (its store reopened at its checkpoint first: a store takes no writes
    after a failed one); once space returns it catches up, and is promoted without a replay,
    holding what the active holds."""
    from tests.test_tables_store_faults import fill_disk, tmpfs

    topic = f"cl-{unique}"
    await changelog(broker, topic, 1)
    active = await Worker(broker, topic, tmp_path / "a").start()
    await active.assign({0})
    with tmpfs(tmp_path / "b", "16m") as disk:
        standby = await Worker(broker, topic, disk).start()
        try:
            await standby.assign(set(), {0})
            await feed(active, 0, 0, 100)
            filler = fill_disk(disk)
            for start in range(100, 6100, 2000):
                await feed(active, 0, start, 2000)
            checkpoint = active.state.local_offsets()[0]
            await wait_until(lambda: standby.state.partitions[0].store.failed is not None)
            await asyncio.sleep(2.5)  # retries while the disk is full (the reopen itself fails)
            assert standby.state.local_offsets().get(0, -1) < checkpoint
            filler.unlink()
            await wait_until(lambda: standby.state.local_offsets().get(0) == checkpoint, 30)
            assert any("(ENOSPC): reopened" in e for e in standby.state.recovery.events)
            await standby.assign({0})
            assert standby.replayed == {0: 0}
            # An impression the active wrote while the standby's disk was full: it is there.
            (result,) = standby.process(0, "right", b"p0-a5000", 1_005_010, b"k2-5000", b"k2-5000")
            assert result.left == b"i5000"
        finally:
            await standby.close()
    await active.close()

"""Restore, rebalances and standbys of JoinTables on the real embedded broker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.broker import EmbeddedBroker
from tables.changelog import JoinTables, create_changelog_topic
from tables.join import JoinType, JoinWindow
from tests.tables_helpers import comparable, dump

pytestmark = pytest.mark.broker

WINDOW = JoinWindow(before=0, after=1000, grace=10**7)


def tables_at(broker: EmbeddedBroker, topic: str, data_dir: Path, window: JoinWindow = WINDOW) -> JoinTables:
    return JoinTables(
        broker.bootstrap, topic, data_dir, table="joins", window=window, join_type=JoinType.LEFT
    )


async def feed(tables: JoinTables, partition: int, start: int, count: int) -> list[Any]:
    """Impressions start..start+count, each clicked once; one commit."""
    join = tables.operator(partition)
    results = []
    for n in range(start, start + count):
        auction, ts = f"p{partition}-a{n}", 1_000_000 + n
        imp = {"event_id": f"i{n}", "auction_id": auction, "campaign_id": "c", "ts": ts}
        results += join.process("left", imp)
        results += join.process("right", {"event_id": f"k{n}", "auction_id": auction, "ts": ts + 5})
    await tables.commit(partition)
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
    await create_changelog_topic(broker.bootstrap, topic, 2)
    first = tables_at(broker, topic, tmp_path)
    await first.start()
    await first.on_assignment({0, 1}, set())
    await feed(first, 0, 0, 200)
    await feed(first, 1, 0, 100)
    offsets = first.local_offsets()
    assert offsets == {0: 399, 1: 199}  # one changelog record per impression and click

    await first.on_assignment({0}, set())  # keeps 0, gives up 1
    assert first.replayed == {0: 0}
    assert first.local_offsets() == offsets  # 1 is closed but still on disk
    await first.close()

    restarted = tables_at(broker, topic, tmp_path)
    assert restarted.local_offsets() == offsets  # known before any assignment, for the assignor
    assert restarted.changelog_offsets() == {topic: offsets}
    await restarted.start()
    await restarted.on_assignment({0, 1}, set())
    assert restarted.replayed == {0: 0, 1: 0}
    results = await feed(restarted, 0, 200, 1)
    assert [r["join_id"] for r in results] == ["i200|k200"]
    await restarted.close()


async def test_returning_partition_replays_only_what_it_missed(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topic = f"cl-{unique}"
    await create_changelog_topic(broker.bootstrap, topic, 1)
    here, there = tables_at(broker, topic, tmp_path / "a"), tables_at(broker, topic, tmp_path / "b")
    await here.start()
    await there.start()
    await here.on_assignment({0}, set())
    await feed(here, 0, 0, 150)
    await here.on_assignment(set(), set())  # revoked: files stay

    await there.on_assignment({0}, set())
    assert there.replayed == {0: 300}  # a new owner with no files replays everything
    await feed(there, 0, 150, 40)
    await there.on_assignment(set(), set())

    await here.on_assignment({0}, set())
    assert here.replayed == {0: 80}  # only the 40 impressions and 40 clicks it missed
    await here.close()
    await there.close()
    assert state_of(tmp_path / "a", 0) == state_of(tmp_path / "b", 0)


async def test_standby_tails_and_is_promoted_without_replay(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    topic = f"cl-{unique}"
    await create_changelog_topic(broker.bootstrap, topic, 1)
    active, standby = (
        tables_at(broker, topic, tmp_path / "a"),
        tables_at(broker, topic, tmp_path / "b"),
    )
    await active.start()
    await standby.start()
    await active.on_assignment({0}, set())
    await standby.on_assignment(set(), {0})
    await feed(active, 0, 0, 100)
    # An impression that will only be clicked after the standby is promoted.
    active.operator(0).process(
        "left", {"event_id": "i-open", "auction_id": "open", "campaign_id": "c", "ts": 1_000_200}
    )
    active.operator(0).add_counter("clicks:c7", 2)
    active.operator(0).add_counter("clicks:c8")
    assert active.operator(0).counters("clicks:") == {"clicks:c7": 2, "clicks:c8": 1}
    checkpoint = await active.commit(0)
    await wait_until(lambda: standby.local_offsets().get(0) == checkpoint)
    assert standby.assigned() == {0: "standby"}

    await active.on_assignment(set(), set())
    await standby.on_assignment({0}, set())
    assert standby.replayed == {0: 0}
    join = standby.operator(0)
    (result,) = join.process("right", {"event_id": "k-open", "auction_id": "open", "ts": 1_000_300})
    assert result["join_id"] == "i-open|k-open"
    assert join.stream_time == 1_000_300
    assert join.counters() == {"clicks:c7": 2, "clicks:c8": 1}  # counters travel with the state
    await standby.commit(0)
    await active.close()
    await standby.close()


async def test_restore_ends_at_the_high_watermark_not_the_short_end_offset(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """Many changelog records per produce batch: tansu's ListOffsets is short, the fetch
    high watermark is right, and restore reads every record."""
    topic = f"cl-{unique}"
    await create_changelog_topic(broker.bootstrap, topic, 1)
    writer = tables_at(broker, topic, tmp_path / "w")
    await writer.start()
    await writer.on_assignment({0}, set())
    await feed(writer, 0, 0, 2000)
    await writer.close()

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    end = (await consumer.end_offsets([tp]))[tp]
    await consumer.stop()
    assert end < 4000, "the broker fault this test is about is gone"

    reader = tables_at(broker, topic, tmp_path / "r")
    await reader.start()
    await reader.on_assignment({0}, set())
    assert reader.replayed == {0: 4000}
    assert reader.local_offsets() == {0: 3999}
    await reader.close()
    assert state_of(tmp_path / "r", 0) == state_of(tmp_path / "w", 0)


async def test_files_ahead_of_their_changelog_are_rebuilt(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """Local files whose checkpoint lies past the changelog's end (a recreated topic, a new
    cluster) are not trusted: they are dropped and the changelog replayed."""
    old, new = f"cl-old-{unique}", f"cl-new-{unique}"
    for topic in (old, new):
        await create_changelog_topic(broker.bootstrap, topic, 1)
    writer = tables_at(broker, old, tmp_path)
    await writer.start()
    await writer.on_assignment({0}, set())
    await feed(writer, 0, 0, 50)
    await writer.close()

    reader = tables_at(broker, new, tmp_path)  # same files, other (empty) changelog
    await reader.start()
    await reader.on_assignment({0}, set())
    assert reader.operator(0).stream_time is None
    assert reader.local_offsets() == {}
    await reader.close()


async def test_promoted_standby_emits_each_unmatched_record_once(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """What the old owner emitted is not emitted again; what was not yet due is, once."""
    topic = f"cl-{unique}"
    await create_changelog_topic(broker.bootstrap, topic, 1)
    window = JoinWindow(before=0, after=100, grace=10)
    active = tables_at(broker, topic, tmp_path / "a", window)
    standby = tables_at(broker, topic, tmp_path / "b", window)
    await active.start()
    await standby.start()
    await active.on_assignment({0}, set())
    await standby.on_assignment(set(), {0})

    def impression(event_id: str, ts: int) -> dict[str, Any]:
        return {"event_id": event_id, "auction_id": event_id, "campaign_id": "c", "ts": ts}

    join = active.operator(0)
    assert join.process("left", impression("i1", 1000)) == []
    assert join.process("left", impression("i2", 1100)) == []
    emitted = join.process("left", impression("i3", 1111))  # passes i1's 1000 + 100 + 10
    assert [r["join_id"] for r in emitted] == ["i1|"]
    checkpoint = await active.commit(0)
    await wait_until(lambda: standby.local_offsets().get(0) == checkpoint)

    await active.on_assignment(set(), set())
    await standby.on_assignment({0}, set())
    emitted = standby.operator(0).process("left", impression("i4", 1300))
    assert sorted(r["join_id"] for r in emitted) == ["i2|", "i3|"]
    await active.close()
    await standby.close()

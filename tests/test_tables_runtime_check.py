"""`Intake.check` (tables/runtime/intake.py) on the reference app's own join task, without a
broker: what a fetch of one topic partition becomes (held records, dead letters with their
reasons, null values counted, the next offset to read), including a fetch whose every
record belongs to another partition."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiokafka.structs import ConsumerRecord
from faust.types import TP

from app.join import build
from app.settings import JOIN_NAME, from_env
from tables import runtime_of
from tables.kafka import consumer as faust_consumer
from tables.operators.windowed import Match
from tables.records.partitioners import partition_for
from tables.runtime.results import Feed, JoinResults
from tables.runtime.task import JoinTask

PARTITIONS = 4


def runner() -> JoinTask:
    settings = from_env()
    found = runtime_of(build(settings)).tasks[JOIN_NAME]
    found.partitions = PARTITIONS  # as the start-up check finds them
    return found


def keys_of(partition: int, count: int) -> list[bytes]:
    """Auction ids that a Kafka producer (murmur2) puts on `partition`."""
    found = [f"a-{i}".encode() for i in range(10 * count * PARTITIONS)]
    return [k for k in found if partition_for(k, PARTITIONS, "murmur2") == partition][:count]


def record(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord(topic, partition, offset, 0, 0, key, value, None, 0, 0, [])


def impression(key: bytes, ts: int, **changes: Any) -> bytes:
    event = {"event_id": f"i-{key.decode()}-{ts}", "auction_id": key.decode(), "campaign_id": "c", "ts": ts}
    return orjson.dumps({**event, **changes})


def test_a_fetch_becomes_held_records_dead_letters_and_counted_nulls() -> None:
    join = runner()
    topic = join.spec.left.name
    tp = TP(topic, 1)
    now = int(time.time() * 1000)
    mine, other = keys_of(1, 4), keys_of(2, 1)[0]
    records = [
        record(topic, 1, 10, mine[0], impression(mine[0], now)),
        record(topic, 1, 11, mine[1], b"{not json"),
        record(topic, 1, 12, other, impression(other, now)),  # another partition's key
        record(topic, 1, 13, mine[2], None),  # a null value: dropped, counted
        record(topic, 1, 14, mine[3], impression(mine[3], now + 1, auction_id="elsewhere")),
        record(topic, 1, 15, mine[0], impression(mine[0], now + 2)),
    ]
    letters: list[Any] = []
    join.intake.check(tp, records, letters)
    reasons = {offset: (rejected.category, rejected.reason) for _, _, offset, _, _, rejected in letters}
    assert reasons == {
        12: ("wrong_partition", reasons[12][1]),
        11: ("undecodable", "malformed JSON: JSONDecodeError"),
        14: ("rejected", "key does not match auction_id"),
    }
    assert join.intake.aligner.held(1) == 2 and join.intake.aligner.first_held(1) == {topic: 10}
    assert join.stats.read["left"] == 6 and join.stats.null_values["left"] == 1
    assert join.intake.read_next[tp] == 16
    # Both inputs caught up: released in event-time order, with the ids and values read.
    released = join.intake.aligner.release(1, {topic: 16, join.spec.right.name: 0})
    assert [(side, key, ts) for side, key, ts, _, _ in released] == [
        ("left", mine[0], now),
        ("left", mine[0], now + 2),
    ]
    assert [value for *_, value in released] == [records[0].value, records[5].value]


def test_a_fetch_of_only_misplaced_records_is_dead_lettered_and_read_past() -> None:
    join = runner()
    topic = join.spec.left.name
    tp = TP(topic, 0)
    now = int(time.time() * 1000)
    others = keys_of(3, 2)
    records = [record(topic, 0, 7 + i, key, impression(key, now)) for i, key in enumerate(others)]
    letters: list[Any] = []
    join.intake.check(tp, records, letters)
    assert [(offset, rejected.category) for _, _, offset, _, _, rejected in letters] == [
        (7, "wrong_partition"),
        (8, "wrong_partition"),
    ]
    assert join.intake.aligner.held(0) == 0 and join.intake.read_next[tp] == 9


def test_a_result_takes_the_value_built_on_arrival_once() -> None:
    """The record checked on arrival is handed to the first result it is part of (its bytes
    are not decoded again); a second result of it, and a stored partner, are decoded."""
    join = runner()
    topic = join.spec.right.name
    key = keys_of(1, 1)[0]
    now = int(time.time() * 1000)
    click = orjson.dumps({"event_id": "c1", "auction_id": key.decode(), "ts": now})
    arrived = record(topic, 1, 5, key, click)
    join.intake.check(TP(topic, 1), [arrived], [])
    assert [v for v, _ in join.intake.built.values()] == [arrived.value]
    built = join.intake.built[id(arrived.value)][1]
    feed = Feed(built=join.intake.built)
    results: JoinResults[Any, Any, Any] = JoinResults(
        join.app, feed, join.spec.left.name, join.intake.codecs["left"].key, join.intake.codecs["left"].value,
        join.intake.codecs["right"].value, [], join.worker.serializers,
    )  # fmt: skip
    first, second = impression(key, now - 1), impression(key, now - 2)
    matches = [Match(key, first, arrived.value, now), Match(key, second, arrived.value, now)]
    one, two = results._results(matches)
    assert one.right is built and two.right is not built and two.right == built
    assert one.left == join.intake.codecs["left"].value(first) and two.left.ts == now - 2
    assert feed.built == {}


def test_a_fetch_dropped_after_a_revocation_never_moves_the_restart_past_records_kept_aside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An input paused from its start (read ahead of its partner) has its fetched records kept
    aside and nothing committed. The revocation rewinds it to its first kept-aside record; a
    fetch still in flight, dropped after that (taken across the rebalance), starts later and
    must not move the restart there: a worker lost 44,000-83,000 joins of a partition it kept
    that way (tests/test_app_backlog.py, under load)."""
    monkeypatch.setattr(faust_consumer, "SEEK_TIMEOUT_S", 0.1)  # no consumer runs here to seek
    join = runner()
    tp = TP(join.spec.left.name, 0)
    key = keys_of(0, 1)[0]
    now = int(time.time() * 1000)
    join.intake.deferred = {tp: [record(tp.topic, 0, n, key, impression(key, now + n)) for n in range(5)]}
    assert tp not in join.intake.commit_at  # nothing of it joined yet

    async def revoke_then_drop_a_later_fetch() -> None:
        await join.quiesce()
        assert join.intake.read_next[tp] == 0
        later = [record(tp.topic, 0, n, key, impression(key, now + n)) for n in range(5, 9)]
        await join.dropped({tp: later})

    asyncio.run(revoke_then_drop_a_later_fetch())
    assert join.intake.read_next[tp] == 0
    assert join._dropped_from[tp] == 0  # where the next assignment rewinds a kept partition

"""Bad input on a real worker: every kind goes to the dead-letter topic with its reason,
the worker keeps running, its counter shows it, and the valid records around each bad
one still join. A null value is no dead letter: it is dropped and counted (`null_values`).

Each bad record shares its Kafka key with a valid impression sent just before it and a
valid click sent just after it, so all three sit next to each other on one partition.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from app.chaos import DAY_MS, bad_records
from app.contract import Rejected, validate
from tables.runtime.output import LETTER_KEEPS_BYTES
from tables.testing import EmbeddedBroker
from tests.workers import cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

# The reason each kind of bad record must be dead-lettered with (a substring of it).
REASONS = {
    "malformed": "malformed JSON",
    "not-utf8": "malformed JSON",
    "array": "not an object",
    "wrong-type": "field 'ts' is str",
    "bool-ts": "field 'ts' is bool",
    "missing-field": "missing or null field 'event_id'",
    "null-key": "missing or null field 'auction_id'",
    "empty-key": "empty auction_id",
    "key-mismatch": "key does not match",
    "oversized": "exceeds",
    "past": "in the past",
    "future": "in the future",
    "null-kafka-key": "null Kafka key",
}
CATEGORIES = {
    "malformed": "undecodable",
    "not-utf8": "undecodable",
    "array": "wrong_type",
    "wrong-type": "wrong_type",
    "bool-ts": "wrong_type",
    "missing-field": "wrong_type",
    "null-key": "wrong_type",
    "empty-key": "rejected",
    "key-mismatch": "rejected",
    "oversized": "too_large",
    "past": "rejected",
    "future": "rejected",
    "null-kafka-key": "null_key",
}
DROPPED = "null-value"  # dropped and counted, never dead-lettered (Kafka Streams 3.8+)


def _plan(run: str, now: int, impressions: str, clicks: str) -> tuple[list[Any], dict, set[str]]:
    """(topic, key, value, tag) to send, the bad ones by tag, the join ids expected."""
    sends: list[Any] = []
    bad: dict[str, tuple[str, bytes | None, bytes | None]] = {}
    expected: set[str] = set()
    for i, (tag, key, value) in enumerate(bad_records(0, run, now)):
        auction = f"{run}-k{i}"
        imp = {"event_id": f"i{i}", "auction_id": auction, "campaign_id": "c", "ts": now}
        click = {"event_id": f"c{i}", "auction_id": auction, "ts": now + 10}
        topic = impressions if i % 2 else clicks  # bad records on both inputs
        # The bad record keeps its own defect but sits on the same key as the valid pair.
        sends.append((impressions, auction.encode(), json.dumps(imp).encode(), None))
        own_key = key if not key else auction.encode()  # an empty or null key stays so
        sends.append((topic, own_key, _rekey(value, key, auction), tag))
        sends.append((clicks, auction.encode(), json.dumps(click).encode(), None))
        bad[tag] = (topic, key, value)
        expected.add(f"i{i}|c{i}")
    return sends, bad, expected


def _rekey(value: bytes | None, old: bytes | None, auction: str) -> bytes | None:
    """The bad value with its auction id moved to the shared key (defects kept)."""
    if value is None or old is None or not old:
        return value
    return value.replace(json.dumps(old.decode()).encode(), json.dumps(auction).encode())


async def _send(bootstrap: str, sends: list[Any]) -> dict[str, tuple[str, int, int]]:
    """Send in order; where each bad record landed (topic, partition, offset) by tag."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2 << 20)
    await producer.start()
    landed: dict[str, tuple[str, int, int]] = {}
    try:
        for topic, key, value, tag in sends:
            meta = await producer.send_and_wait(topic, value, key=key)
            if tag is not None:
                landed[tag] = (topic, meta.partition, meta.offset)
    finally:
        await producer.stop()
    return landed


def test_every_bad_record_is_dead_lettered_and_its_neighbours_join(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path) as c:
        worker = c.worker("w1", "host-a").start()
        c.wait_covered(90)
        pid = worker.process.pid if worker.process else None
        s = c.settings
        now = int(time.time() * 1000)
        sends, bad, expected = _plan(unique, now, s.impressions, s.clicks)
        assert set(bad) == set(REASONS) | {DROPPED}
        landed = asyncio.run(_send(broker.bootstrap, sends))

        joined = c.joins(expected, timeout=60)
        assert expected <= joined, f"valid records next to bad ones were lost: {expected - joined}"
        letters = c.read(s.dead_letters, lambda rs: len(rs) >= len(REASONS), 30)
        by_place = {(x["topic"], x["partition"], x["offset"]): x for x in letters}
        for tag, place in landed.items():
            letter = by_place.get(place)
            if tag == DROPPED:
                assert letter is None, f"a null value was dead-lettered: {letter}"
                continue
            assert letter is not None, f"{tag} at {place} not dead-lettered"
            assert REASONS[tag] in letter["reason"], (tag, letter["reason"])
            assert letter["category"] == CATEGORIES[tag] and letter["join"] == "ad-join", (tag, letter)
        oversized = by_place[landed["oversized"]]
        # Its first 16 KiB are kept, its length and hash beside (a letter stays bounded).
        assert len(oversized["value"]) == LETTER_KEEPS_BYTES and oversized["value_bytes"] > 70 * 1024
        assert len(oversized["value_sha256"]) == 64
        assert by_place[landed["null-kafka-key"]]["key"] is None

        assert worker.alive and worker.process is not None and worker.process.pid == pid
        view = worker.join()
        assert view is not None, "the worker does not answer"
        assert view["dead_letters"] == len(REASONS), view
        by_category = {c: list(CATEGORIES.values()).count(c) for c in set(CATEGORIES.values())}
        assert view["dead_letters_by_category"] == by_category, view
        side = "left" if bad[DROPPED][0] == s.impressions else "right"
        assert view["null_values"] == {"left": 0, "right": 0, side: 1}, view


def test_a_null_kafka_key_is_rejected() -> None:
    now = int(time.time() * 1000)
    value = json.dumps({"event_id": "e", "auction_id": "a1", "campaign_id": "c", "ts": now})
    assert isinstance(validate("left", None, value.encode(), now), Rejected)


def test_the_day_constant_matches_the_validation_window() -> None:
    now = int(time.time() * 1000)
    ok = json.dumps({"event_id": "e", "auction_id": "a", "ts": now - 6 * DAY_MS}).encode()
    assert not isinstance(validate("right", b"a", ok, now), Rejected)

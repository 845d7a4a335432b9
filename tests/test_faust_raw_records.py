"""Records of join inputs stay as aiokafka's fetcher reads them (`RawRecords`): read from a
real broker through a real fetcher, a topic the join takes gives the fetched records with
their key, value, offset and timestamp, any other topic ConsumerRecords as before; and the
start-up check notices an aiokafka whose fetcher no longer works this way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, ConsumerRecord
from aiokafka.consumer.fetcher import PartitionRecords

from assignor.internals import IncompatibleInternals, check
from tables.kafka.consumer import RawRecords, install_raw_records, raw_record_problems
from tables.kafka.topics import create_topics
from tables.testing import read_records

STAMP_MS = 1_700_000_000_000
COUNT = 300


async def _produce(bootstrap: str, topics: list[str]) -> None:
    await create_topics(bootstrap, {topic: 1 for topic in topics})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for topic in topics:
            for n in range(COUNT):
                await producer.send(topic, key=b"k%d" % n, value=b"v%d" % n, timestamp_ms=STAMP_MS + n)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.broker
@pytest.mark.timeout(120)
def test_a_taken_topic_gives_the_fetched_records_and_another_topic_consumer_records(
    broker: Any, unique: str
) -> None:
    install_raw_records()
    taken, other = f"raw-taken-{unique}", f"raw-other-{unique}"
    asyncio.run(_produce(broker.bootstrap, [taken, other]))
    keys = RawRecords(lambda topic: topic == taken)
    wanted = [(b"k%d" % n, b"v%d" % n, n, STAMP_MS + n) for n in range(COUNT)]
    raw = asyncio.run(read_records(broker.bootstrap, taken, 1, key_deserializer=keys))
    assert [(r.key, r.value, r.offset, r.timestamp) for r in raw] == wanted
    assert not any(isinstance(r, ConsumerRecord) for r in raw)
    built = asyncio.run(read_records(broker.bootstrap, other, 1, key_deserializer=keys))
    assert [(r.key, r.value, r.offset, r.timestamp) for r in built] == wanted
    assert all(type(r) is ConsumerRecord and r.topic == other for r in built)


def _unpack_building_records_itself(self: Any) -> Any:
    """An aiokafka that builds its ConsumerRecords inline, without `_consumer_record`."""
    while self._records.has_next():
        for record in self._records.next_batch():
            self.next_fetch_offset = record.offset + 1
            yield ConsumerRecord(self._tp.topic, self._tp.partition, record.offset, record.timestamp,
                                 0, record.key, record.value, None, 0, 0, ())  # fmt: skip


def test_the_startup_check_refuses_a_fetcher_raw_records_were_not_written_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert raw_record_problems() == []
    check()
    monkeypatch.setattr(PartitionRecords, "_unpack_records", _unpack_building_records_itself)
    assert raw_record_problems() == ["PartitionRecords: raw records differ from the records fetched"]
    with pytest.raises(IncompatibleInternals, match="raw records differ"):
        check()

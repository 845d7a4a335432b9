"""Where real clients put the same keys on the embedded broker, against tables.records.partitioners.

Three producers send the same keys to a 4-partition topic: confluent-kafka (librdkafka
2.16) with its default `consistent_random`, the same with `murmur2_random`, and aiokafka's
default partitioner. The records are read back from the broker, partition by partition,
and the check a join runs per fetch (`find_misplaced`) is applied to what was read.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.kafka import Span, offsets, read_span
from tables.records.partitioners import Partitioner, find_misplaced, partition_for
from tables.testing import EmbeddedBroker, create_topics
from tests.librdkafka_producer import LibrdkafkaPartitioner, produce_with_librdkafka

PARTITIONS = 4
AUCTIONS = [f"auction-{i:06d}".encode() for i in range(300)]
ODD_KEYS = [b"\x00", b"\xff\xfe\xfd", "enchère-é".encode(), b"k" * 301]
CLIENTS: list[LibrdkafkaPartitioner | str] = ["consistent_random", "murmur2_random", "consistent", "aiokafka"]

pytestmark = pytest.mark.broker


async def _produce_with_aiokafka(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list[int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in records]
        sent = await asyncio.wait_for(asyncio.gather(*futures), timeout=30)
    finally:
        await producer.stop()
    return [metadata.partition for metadata in sent]


def produce(bootstrap: str, topic: str, client: str, keys: list[bytes]) -> list[int]:
    """Send each key (value: 'client|index') with `client`; the partition each landed on."""
    records = [(key, f"{client}|{i}".encode()) for i, key in enumerate(keys)]
    if client == "aiokafka":
        return asyncio.run(_produce_with_aiokafka(bootstrap, topic, records))
    delivered = produce_with_librdkafka(bootstrap, topic, records, client)  # type: ignore[arg-type]
    assert [d.key for d in delivered] == keys
    return [d.partition for d in delivered]


def read_back(bootstrap: str, topic: str) -> dict[int, list[tuple[bytes, bytes]]]:
    """(key, value) of every record, per partition, as a consumer of that partition reads them."""
    found: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
    for name, (begin, end) in offsets(bootstrap, [topic]).items():
        partition = int(name.rsplit(":", 1)[1])
        for batch in read_span(bootstrap, Span(topic, partition, begin, end)):
            found[partition] += [(r.key, r.value) for r in batch]
    return found


@pytest.fixture(scope="module")
def placed(broker: EmbeddedBroker) -> tuple[str, dict[str, list[int]]]:
    """A topic holding every key once per client, and the partitions each client chose."""
    topic = "partitioners-clients"
    asyncio.run(create_topics(broker.bootstrap, [topic], PARTITIONS))
    keys = AUCTIONS + ODD_KEYS + [b""]
    return topic, {client: produce(broker.bootstrap, topic, client, keys) for client in CLIENTS}


def expected(keys: list[bytes], partitioner: Partitioner) -> list[int]:
    return [partition_for(k, PARTITIONS, partitioner) for k in keys]


def test_librdkafkas_default_is_crc32_of_the_key(placed: tuple[str, dict[str, list[int]]]) -> None:
    _, chosen = placed
    keys = AUCTIONS + ODD_KEYS
    assert chosen["consistent_random"][: len(keys)] == expected(keys, "crc32")
    assert chosen["consistent"] == expected([*keys, b""], "crc32")  # the empty key: partition 0


def test_murmur2_random_and_aiokafka_are_murmur2_of_the_key(placed: tuple[str, dict[str, list[int]]]) -> None:
    _, chosen = placed
    keys = AUCTIONS + ODD_KEYS + [b""]  # an empty (not null) key is hashed by both
    assert chosen["murmur2_random"] == chosen["aiokafka"] == expected(keys, "murmur2")


def test_the_two_defaults_disagree_on_most_keys(placed: tuple[str, dict[str, list[int]]]) -> None:
    _, chosen = placed
    pairs = zip(chosen["consistent_random"], chosen["aiokafka"], strict=True)
    differ = sum(a != b for a, b in list(pairs)[: len(AUCTIONS)])
    assert differ == sum(
        a != b for a, b in zip(expected(AUCTIONS, "crc32"), expected(AUCTIONS, "murmur2"), strict=True)
    )
    assert 0.6 * len(AUCTIONS) < differ < 0.9 * len(AUCTIONS)  # ~3 in 4 on 4 partitions


# Under each setting of the join, the clients whose records it must flag when they differ.
FOREIGN: list[tuple[Partitioner, set[str]]] = [
    ("murmur2", {"consistent_random", "consistent"}),
    ("crc32", {"murmur2_random", "aiokafka"}),
]


def flagged_on_fetch(stored: dict[int, list[tuple[bytes, bytes]]], partitioner: Partitioner) -> set[bytes]:
    """Values of the records `find_misplaced` flags, fetch by fetch (one per partition)."""
    flagged: set[bytes] = set()
    for partition, records in stored.items():
        found = find_misplaced([key for key, _ in records], partition, PARTITIONS, partitioner)
        for m in found:
            key, value = records[m.index]
            assert m.expected == partition_for(key, PARTITIONS, partitioner) != partition
            flagged.add(value)
    return flagged


@pytest.mark.parametrize(("partitioner", "foreign"), FOREIGN, ids=[p for p, _ in FOREIGN])
def test_the_fetch_check_flags_exactly_the_other_clients_records(
    broker: EmbeddedBroker,
    placed: tuple[str, dict[str, list[int]]],
    partitioner: Partitioner,
    foreign: set[str],
) -> None:
    """Read back from the broker: under murmur2 only librdkafka-default records whose CRC32
    partition differs are misplaced, under crc32 only the murmur2 clients' ones."""
    topic, chosen = placed
    stored = read_back(broker.bootstrap, topic)
    keys = AUCTIONS + ODD_KEYS + [b""]
    assert sum(len(records) for records in stored.values()) == len(CLIENTS) * len(keys)
    should = {
        f"{client}|{i}".encode()
        for client in foreign
        for i, (key, partition) in enumerate(zip(keys, chosen[client], strict=True))
        # consistent_random puts an empty key anywhere: the crc32 check does not judge it
        if (key or partitioner == "murmur2") and partition != partition_for(key, PARTITIONS, partitioner)
    }
    assert flagged_on_fetch(stored, partitioner) == should
    assert len(should) > 150  # the check is not vacuous

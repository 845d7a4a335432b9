"""The tandem-topic data source against the embedded broker, in batch and as a stream."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka.partitioner import DefaultPartitioner
from pyspark.sql import SparkSession

from pipeline.kafka import Connection, offsets, source_options
from pipeline.source import advance, plan_spans
from tables.testing import EmbeddedBroker, create_topics
from tests.secure_kafka import SecuredBroker
from tests.spark_fixtures import produce_values, spark_session

PARTITIONS = 3
COUNT = 900


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    return spark_session()


@pytest.fixture
def filled(broker: EmbeddedBroker, unique: str) -> str:
    """A 3-partition topic with 900 keyed records produced in multi-record batches."""
    topic = f"src-{unique}"
    records = [(f"k{i % 50}".encode(), f"v{i}".encode()) for i in range(COUNT)]
    asyncio.run(create_topics(broker.bootstrap, [topic], PARTITIONS))
    asyncio.run(produce_values(broker.bootstrap, topic, records))
    return topic


def expected_values() -> dict[int, list[bytes]]:
    """Values per partition in produce order, partitioned as aiokafka does."""
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    parts = list(range(PARTITIONS))
    for i in range(COUNT):
        p = DefaultPartitioner()(f"k{i % 50}".encode(), parts, parts)
        by_partition[p].append(f"v{i}".encode())
    return by_partition


def test_advance_spreads_a_read_limit_over_partitions() -> None:
    start = {"t:0": 0, "t:1": 10, "t:2": 5}
    latest = {"t:0": 100, "t:1": 12, "t:2": 5, "t:3": 40}
    moved = advance(start, latest, 50)
    assert sum(moved[tp] - start.get(tp, 0) for tp in moved) == 50
    assert moved["t:1"] == 12 and moved["t:2"] == 5  # never past the end
    assert all(moved[tp] <= latest[tp] for tp in latest)
    assert advance(start, latest, 10_000) == {**latest, "t:2": 5}


def test_plan_spans_split_ranges() -> None:
    spans = [p.span for p in plan_spans({"t:0": 3}, {"t:0": 10, "t:1": 4}, split=4)]
    assert [(s.partition, s.start, s.end) for s in spans] == [(0, 3, 7), (0, 7, 10), (1, 0, 4)]


@pytest.mark.spark
def test_end_offsets_come_from_the_high_watermark(broker: EmbeddedBroker, filled: str) -> None:
    ends = offsets(broker.bootstrap, [filled])
    expected = expected_values()
    assert {tp: end for tp, (_, end) in ends.items()} == {
        f"{filled}:{p}": len(v) for p, v in expected.items()
    }


@pytest.mark.spark
def test_batch_read_returns_every_record_in_offset_order(
    spark: SparkSession, broker: EmbeddedBroker, filled: str
) -> None:
    df = (
        spark.read.format("tandem-topic")
        .option("bootstrap", broker.bootstrap)
        .option("topic", filled)
        .option("splitSize", "100")
        .load()
    )
    assert df.rdd.getNumPartitions() >= COUNT // 100  # read in parallel, by offset range
    rows = df.orderBy("partition", "offset").collect()
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for row in rows:
        assert row["offset"] == len(got[row["partition"]])
        got[row["partition"]].append(bytes(row["value"]))
    assert got == expected_values()


@pytest.mark.spark
def test_batch_read_honours_starting_and_ending_offsets(
    spark: SparkSession, broker: EmbeddedBroker, filled: str
) -> None:
    df = (
        spark.read.format("tandem-topic")
        .option("bootstrap", broker.bootstrap)
        .option("topic", filled)
        .option("startingOffsets", json.dumps({filled: {"0": 10}}))
        .option("endingOffsets", json.dumps({filled: {"0": 20, "1": 5, "2": -2}}))
        .load()
    )
    got = {(r["partition"], r["offset"]) for r in df.select("partition", "offset").collect()}
    assert got == {(0, o) for o in range(10, 20)} | {(1, o) for o in range(5)}


def _stream_all(spark: SparkSession, bootstrap: str, topic: str, form: str) -> tuple[int, int]:
    name = f"mem_{form}_{topic.replace('-', '_')}"
    query = (
        spark.readStream.format("tandem-topic")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("maxOffsetsPerTrigger", "250")
        .option("latestOffsetForm", form)
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    deadline = time.monotonic() + 120
    while query.isActive and time.monotonic() < deadline:
        query.awaitTermination(5)
    assert not query.isActive, "availableNow query did not finish"
    batches = sum(1 for p in query.recentProgress if p.numInputRows > 0)
    rows = spark.sql(f"select count(*) n, count(distinct partition, offset) d from {name}").first()
    assert rows is not None and rows["n"] == rows["d"]  # nothing read twice
    return int(rows["n"]), batches


@pytest.mark.spark
def test_stream_available_now_with_read_limit(
    spark: SparkSession, broker: EmbeddedBroker, filled: str
) -> None:
    count, batches = _stream_all(spark, broker.bootstrap, filled, "current")
    assert count == COUNT
    assert batches == -(-COUNT // 250)  # latestOffset(start, limit) honoured ReadMaxRows


@pytest.mark.spark
def test_stream_with_the_legacy_latest_offset_form(
    spark: SparkSession, broker: EmbeddedBroker, filled: str
) -> None:
    count, batches = _stream_all(spark, broker.bootstrap, filled, "legacy")
    assert count == COUNT and batches == 1  # latestOffset() has no limit: one batch


def test_end_offsets_of_empty_and_single_key_partitions(broker: EmbeddedBroker, unique: str) -> None:
    topic = f"sparse-{unique}"
    asyncio.run(create_topics(broker.bootstrap, [topic], 3))
    assert {end for _, end in offsets(broker.bootstrap, [topic], timeout=20).values()} == {0}
    asyncio.run(produce_values(broker.bootstrap, topic, [(b"one-key", b"v")] * 5))
    parts = list(range(3))
    busy = DefaultPartitioner()(b"one-key", parts, parts)
    ends = offsets(broker.bootstrap, [topic], timeout=20)
    assert {tp: end for tp, (_, end) in ends.items()} == {
        f"{topic}:{p}": 5 if p == busy else 0 for p in parts
    }


def test_the_source_reads_a_secured_cluster_with_a_client_config(
    spark: SparkSession, unique: str, tmp_path: Path
) -> None:
    """SASL over TLS: the offsets and every reader go through the front with the file's
    settings (`kafka.client.config`; the pipeline's --client-config sets it)."""
    topic = f"sec-{unique}"
    records = [(f"k{i % 7}".encode(), f"v{i}".encode()) for i in range(120)]
    with SecuredBroker(tls=True, sasl=True, work_dir=tmp_path / "b") as secured:
        config = secured.write_client_config(tmp_path / "client.properties", "SCRAM-SHA-256")
        settings = secured.aiokafka_settings("SCRAM-SHA-256")
        asyncio.run(create_topics(settings, [topic], PARTITIONS))
        asyncio.run(produce_values(settings, topic, records))
        connection = Connection(secured.bootstrap, str(config))
        bounds = offsets(connection, [topic])
        rows = (
            spark.read.format("tandem-topic")
            .options(**source_options(connection))
            .option("topic", topic)
            .load()
            .collect()
        )
        refusals = secured.refusals()
    assert sum(end for _, end in bounds.values()) == len(records)
    assert sorted(r["value"] for r in rows) == sorted(v for _, v in records)
    assert refusals == []


@pytest.mark.spark
def test_batch_read_of_an_empty_topic_is_empty(
    spark: SparkSession, broker: EmbeddedBroker, unique: str
) -> None:
    """Nothing to plan (a dead-letter topic with no letter, as reconcile reads it): no rows,
    not a failed Spark job."""
    topic = f"empty-{unique}"
    asyncio.run(create_topics(broker.bootstrap, [topic], 2))
    frame = (
        spark.read.format("tandem-topic").option("bootstrap", broker.bootstrap).option("topic", topic).load()
    )
    assert frame.count() == 0

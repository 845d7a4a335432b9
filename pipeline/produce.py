"""produce: send generated traffic (Parquet from `generate`) to the two input topics.

Records go out in arrival order (`seq`), so a consumer reading live sees them
in that order, and each carries its `seq` in a header so the batch twin can
rebuild the merged order of both topics exactly. Each record goes to the
partition `tables.records.partitioners` gives its key: murmur2 by default (as the Java
client and aiokafka), the generator's own `partition`; the command checks that the
topics have the generator's partition count. `--clicks-partitioner crc32` (or
`--impressions-partitioner`) places a topic as a librdkafka producer with its
default partitioner would, so the stream's misplaced-record handling can be tried.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from pipeline.generate import read_meta
from tables.records.partitioners import Partitioner, partitions_for


def load_in_arrival_order(path: Path) -> list[dict[str, object]]:
    """All records, ordered by (seq, partition): arrival order within each partition."""
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(
        columns=["topic", "partition", "seq", "key", "value"]
    )
    return table.sort_by([("seq", "ascending"), ("partition", "ascending")]).to_pylist()


async def ensure_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(n, partitions, 1) for n in names if n not in existing]
        if missing:
            await admin.create_topics(missing)
    finally:
        await admin.close()


def place(
    records: list[dict[str, object]], partitions: int, partitioners: dict[str, Partitioner]
) -> list[int]:
    """The partition of each record: its key's under its topic's partitioner."""
    placed = [0] * len(records)
    for topic, partitioner in partitioners.items():
        mine = [i for i, r in enumerate(records) if r["topic"] == topic]
        keys = [records[i]["key"] for i in mine]
        for i, p in zip(mine, partitions_for(keys, partitions, partitioner).tolist(), strict=True):  # type: ignore[arg-type]
            placed[i] = p
    return placed


async def produce(
    bootstrap: str,
    path: Path,
    topics: dict[str, str],
    report_every: int = 50_000,
    partitioners: dict[str, Partitioner] | None = None,
) -> int:
    """Produce every record of `path`; returns the count.

    `partitioners` maps the generator's topic names ("impressions", "clicks") to how their
    keys are placed (default murmur2, the generator's `partition`). Fails if a topic does
    not have the generator's partition count.
    """
    partitions = int(read_meta(path)["config"]["partitions"])  # type: ignore[index]
    await ensure_topics(bootstrap, list(topics.values()), partitions)
    records = load_in_arrival_order(path)
    placed = place(records, partitions, {**dict.fromkeys(topics, "murmur2"), **(partitioners or {})})  # type: ignore[arg-type]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await producer.start()
    began = time.monotonic()
    try:
        await _check_partition_counts(producer, list(topics.values()), partitions)
        pending = []
        for sent, (record, partition) in enumerate(zip(records, placed, strict=True), 1):
            pending.append(await producer.send(
                topics[str(record["topic"])],
                record["value"],
                key=record["key"],
                partition=partition,
                headers=[("seq", str(record["seq"]).encode())],
            ))  # fmt: skip
            if len(pending) >= 10_000 or sent == len(records):
                await asyncio.gather(*pending)
                pending = []
            if sent % report_every == 0:
                rate = sent / (time.monotonic() - began)
                print(f"produce: {sent:,}/{len(records):,} ({rate:,.0f} records/s)", flush=True)
    finally:
        await producer.stop()
    return len(records)


async def _check_partition_counts(producer: AIOKafkaProducer, topics: list[str], partitions: int) -> None:
    for topic in topics:
        found = await producer.partitions_for(topic)
        if len(found) != partitions:
            raise RuntimeError(
                f"topic {topic} has {len(found)} partitions, the generator's --partitions "
                f"was {partitions}: keys would not sit where the generator put them"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline produce",
        description="Produce generated Parquet traffic to the input topics in arrival order.",
    )
    parser.add_argument("--input", type=Path, required=True, help="directory from `generate`")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--impressions-topic", default="impressions")
    parser.add_argument("--clicks-topic", default="clicks")
    for side in ("impressions", "clicks"):
        parser.add_argument(f"--{side}-partitioner", choices=["murmur2", "crc32"], default="murmur2",
                            help=f"how {side} keys are placed (default murmur2, the generator's; "
                            "crc32: as librdkafka's default partitioner)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    topics = {"impressions": args.impressions_topic, "clicks": args.clicks_topic}
    partitioners = {"impressions": args.impressions_partitioner, "clicks": args.clicks_partitioner}
    began = time.monotonic()
    count = asyncio.run(produce(args.bootstrap, args.input, topics, partitioners=partitioners))
    print(f"produce: {count:,} records in {time.monotonic() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

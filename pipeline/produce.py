"""produce: send generated traffic (Parquet from `generate`) to the two input topics.

Records go out in arrival order (`seq`), so a consumer reading live sees them
in that order, and each carries its `seq` in a header so the batch twin can
rebuild the merged order of both topics exactly. Partitions are left to
aiokafka's default partitioner (murmur2 of the key), which must agree with the
`partition` the generator computed: the command checks it.
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


async def produce(
    bootstrap: str, path: Path, topics: dict[str, str], report_every: int = 50_000
) -> int:
    """Produce every record of `path`; returns the count. Fails if a partition disagrees."""
    partitions = int(read_meta(path)["config"]["partitions"])  # type: ignore[index]
    await ensure_topics(bootstrap, list(topics.values()), partitions)
    records = load_in_arrival_order(path)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await producer.start()
    began = time.monotonic()
    try:
        pending = []
        for sent, record in enumerate(records, 1):
            future = await producer.send(
                topics[str(record["topic"])],
                record["value"],
                key=record["key"],
                headers=[("seq", str(record["seq"]).encode())],
            )
            pending.append((future, record["partition"]))
            if len(pending) >= 10_000 or sent == len(records):
                await _check(pending)
                pending = []
            if sent % report_every == 0:
                rate = sent / (time.monotonic() - began)
                print(f"produce: {sent:,}/{len(records):,} ({rate:,.0f} records/s)", flush=True)
    finally:
        await producer.stop()
    return len(records)


async def _check(pending: list[tuple[asyncio.Future[object], object]]) -> None:
    for future, expected in pending:
        metadata = await future
        if metadata.partition != expected:  # type: ignore[attr-defined]
            raise RuntimeError(
                f"producer chose partition {metadata.partition}, generator {expected}: "  # type: ignore[attr-defined]
                "topic partition count differs from the generator's --partitions"
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    topics = {"impressions": args.impressions_topic, "clicks": args.clicks_topic}
    began = time.monotonic()
    count = asyncio.run(produce(args.bootstrap, args.input, topics))
    print(f"produce: {count:,} records in {time.monotonic() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the batch side: the reference join at scale, and the topic data source.

    python benchmarks/bench_pipeline.py --impressions 10000000 --source-records 500000 \\
        --report docs/bench/pipeline.md

1. Generates `--impressions` auctions (CTR 10 %: about a tenth as many clicks) to
   Parquet, then times the reference join over them (results to Spark's `noop`
   sink, so the time is the join, not the writing): seconds and input records
   per second per core.
2. Produces `--source-records` 100-byte records to a 4-partition topic on the
   embedded broker and reads them all (a) through the `tandem-topic` Spark data
   source and (b) with one plain aiokafka consumer assigned the same partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.generate import TrafficConfig, generate  # noqa: E402
from pipeline.join import load_parquet, reference_join  # noqa: E402
from pipeline.kafka import offsets  # noqa: E402
from pipeline.semantics import JoinParams  # noqa: E402
from pipeline.spark import session  # noqa: E402
from tables.testing import EmbeddedBroker  # noqa: E402

PARTITIONS = 4


def bench_join(spark: object, impressions: int, workdir: Path, cores: int, kinds: list[str]) -> list[str]:
    cfg = TrafficConfig(impressions=impressions, partitions=8, start_ms=1_700_000_000_000)
    data = workdir / "traffic"
    began = time.monotonic()
    counts = generate(spark, cfg, data)
    generated = time.monotonic() - began
    total = sum(counts.values())
    print(f"bench: generated {counts} in {generated:.1f} s", flush=True)
    lines = [f"| generate | {total:,} records | {generated:.1f} s | "
             f"{total / generated / cores:,.0f} |"]  # fmt: skip
    for kind in kinds:
        output = reference_join(load_parquet(spark, str(data)), JoinParams(kind=kind))  # type: ignore[arg-type]
        began = time.monotonic()
        output.results.write.format("noop").mode("overwrite").save()
        took = time.monotonic() - began
        output.decoded.unpersist()
        rate = total / took / cores
        print(f"bench: {kind} join of {total:,} records in {took:.1f} s ({rate:,.0f}/s/core)", flush=True)
        lines.append(f"| reference join, {kind} | {total:,} records "
                     f"({counts['impressions']:,} impressions, {counts['clicks']:,} clicks) | "
                     f"{took:.1f} s | {rate:,.0f} |")  # fmt: skip
    return lines


async def fill_topic(bootstrap: str, topic: str, records: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20,
                                max_batch_size=256 * 1024)  # fmt: skip
    await producer.start()
    try:
        value = b"x" * 100
        for i in range(records):
            await producer.send(topic, value, key=f"k{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()


async def plain_consumer(bootstrap: str, topic: str, ends: dict[str, tuple[int, int]]) -> int:
    """One aiokafka consumer reading every partition to its end: records read."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest",
                                max_partition_fetch_bytes=4 * 1024 * 1024)  # fmt: skip
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        goal = {tp: ends[f"{topic}:{tp.partition}"][1] for tp in tps}
        seen = 0
        deadline = time.monotonic() + 600
        while [tp for tp in tps if await consumer.position(tp) < goal[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError("plain consumer did not reach the end")
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            seen += sum(len(v) for v in batch.values())
        return seen
    finally:
        await consumer.stop()


def bench_source(spark: object, records: int) -> list[str]:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    lines = []
    with EmbeddedBroker() as broker:
        topic = "bench-source"
        began = time.monotonic()
        asyncio.run(fill_topic(broker.bootstrap, topic, records))
        print(f"bench: produced {records:,} in {time.monotonic() - began:.1f} s", flush=True)
        ends = offsets(broker.bootstrap, [topic])
        assert sum(end for _, end in ends.values()) == records
        for split in (records, records // 8):
            df = (spark.read.format("tandem-topic").option("bootstrap", broker.bootstrap)
                  .option("topic", topic).option("splitSize", str(split)).load())  # fmt: skip
            df.write.format("noop").mode("overwrite").save()  # warm the Python workers
            began = time.monotonic()
            df.write.format("noop").mode("overwrite").save()
            took = time.monotonic() - began
            spans = df.rdd.getNumPartitions()
            lines.append(f"| tandem-topic data source, {spans} input partitions | "
                         f"{records:,} | {took:.1f} s | {records / took:,.0f} |")  # fmt: skip
            print(lines[-1], flush=True)
        began = time.monotonic()
        seen = asyncio.run(plain_consumer(broker.bootstrap, topic, ends))
        took = time.monotonic() - began
        assert seen == records
        lines.append(f"| plain aiokafka consumer, 1 process | {records:,} | {took:.1f} s | "
                     f"{records / took:,.0f} |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impressions", type=int, default=10_000_000)
    parser.add_argument("--source-records", type=int, default=500_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--report", type=Path, help="write the Markdown results here")
    parser.add_argument("--kinds", default="inner,left", help="join kinds to time")
    parser.add_argument("--skip-join", action="store_true")
    parser.add_argument("--skip-source", action="store_true")
    args = parser.parse_args()
    spark = session(args.master, "tandem-bench", conf={"spark.ui.showConsoleProgress": "false"})
    cores = spark.sparkContext.defaultParallelism
    report = [
        f"Command: `python benchmarks/bench_pipeline.py {shlex.join(sys.argv[1:])}`",
        f"Machine: {os.cpu_count()} cores, Spark {spark.version} `{args.master}` "
        f"({cores} cores used), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average at the start {os.getloadavg()[0]:.1f} (1 min)",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        if not args.skip_source:
            report += ["| reader | records | time | records/s |", "|---|---|---|---|"]
            report += bench_source(spark, args.source_records)
            report.append("")
            save(report, args.report)
        if not args.skip_join:
            report += ["| run | input | time | records/s per core |", "|---|---|---|---|"]
            kinds = args.kinds.split(",")
            report += bench_join(spark, args.impressions, Path(tmp), cores, kinds)
            report.append("")
    report.append(f"Load average at the end: {os.getloadavg()[0]:.1f} (1 min)")
    print(save(report, args.report))
    return 0


def save(lines: list[str], path: Path | None) -> str:
    """Write what is measured so far (a long run keeps its first results if cut short)."""
    text = "\n".join(lines) + "\n"
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())

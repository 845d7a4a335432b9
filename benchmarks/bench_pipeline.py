"""Benchmark of the batch side: the twin of a generic join against one worker replaying the
same topics, and the topic data source against a plain consumer.

    python benchmarks/bench_pipeline.py --records 1000000,10000000 --report docs/bench/pipeline.md
    python benchmarks/bench_pipeline.py --kind temporal --records 1000000 --skip-source

1. For each input size (`--kind windowed`, the default): orders and payments
   (benchmarks/pipeline_app.py: int keys as JSON, `faust.Record` values, time and id fields,
   a left join of 10 minutes; 70 % of orders paid 0-5 minutes later, in time order with `seq`
   headers) produced to a 4-partition pair of topics on an embedded broker of their own; then,
   in the same run:
   - the twin (`python -m pipeline join --app benchmarks.pipeline_app`'s work: `run_twin` from
     the topics, the typed results written to Parquet, the counts) on `--master`;
   - one worker (`faust -A benchmarks.pipeline_app worker`, a fresh group) replaying the topics
     from the beginning, timed as benchmarks/bench_worker.py times it: from owning every
     partition with nothing read to every record read and every result handed over (its
     result count must equal the twin's).
   `--kind temporal`: the same with an enrichment join (benchmarks/pipeline_enrich_app.py:
   trades enriched with the quote of their symbol as of their time, str keys, `faust.Record`
   values, time and id fields, a left join with 5 s of grace and an hour of history; a trade
   every 20 ms of event time on one of 100,000 symbols, a quote of a random symbol on 70 %
   of those ticks, in time order with `seq` headers).
   Wall time, CPU time (the Spark JVM and its Python workers; the worker process) and input
   records per second per core of each, and the ratio.
2. `--source-records` 100-byte records on a 4-partition topic read (a) through the
   `tandem-topic` Spark source and (b) by one plain aiokafka consumer.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.apps import JoinRef  # noqa: E402
from pipeline.inputs import Topics  # noqa: E402
from pipeline.kafka import offsets  # noqa: E402
from pipeline.spark import session  # noqa: E402
from pipeline.twin import run_twin  # noqa: E402
from tables.kafka.batches import start_sending  # noqa: E402
from tables.records.partitioners import partitions_for  # noqa: E402
from tables.testing import EmbeddedBroker, WorkerProcess, create_topics, embedded_env  # noqa: E402

PARTITIONS = 4
SYMBOLS = 100_000  # --kind temporal: the table's keys
REPO = Path(__file__).resolve().parent.parent
# In the past: a run's event time spans days (one record every 20 ms), and a join dead-letters
# records timed over a day ahead of its clock (`max_future`).
T0 = 1_700_000_000_000
_TICK = os.sysconf("SC_CLK_TCK")
CHUNK = 200_000  # orders generated and produced at a time


# -- the input -------------------------------------------------------------------------------


def chunk_records(first: int, last: int, rng: random.Random, pending: list[tuple[int, int, bytes]],
                  flush: bool) -> list[tuple[str, bytes, bytes]]:  # fmt: skip
    """(topic, key, value) of orders [first, last), one every 20 ms, with the payments due by
    then (a heap carried over chunks), in time order."""
    out: list[tuple[str, bytes, bytes]] = []
    for i in range(first, last):
        ts = T0 + i * 20
        while pending and pending[0][0] <= ts:
            _, order_id, value = heapq.heappop(pending)
            out.append(("bench-payments", str(order_id).encode(), value))
        order = {"order_id": i, "customer": f"c{i % 1000}", "amount_cents": 100 + i % 900, "ts": ts}
        out.append(("bench-orders", str(i).encode(), orjson.dumps(order)))
        if rng.random() < 0.7:
            paid = ts + rng.randint(0, 300_000)
            payment = {"payment_id": f"p{i}", "order_id": i, "amount_cents": 100 + i % 900, "ts": paid}
            heapq.heappush(pending, (paid, i, orjson.dumps(payment)))
    while flush and pending:
        _, order_id, value = heapq.heappop(pending)
        out.append(("bench-payments", str(order_id).encode(), value))
    return out


def enrich_chunk_records(first: int, last: int, rng: random.Random, pending: list[tuple[int, int, bytes]],
                         flush: bool) -> list[tuple[str, bytes, bytes]]:  # fmt: skip
    """(topic, key, value) of ticks [first, last), one every 20 ms: a trade of a random symbol,
    and on 70 % of them a quote of another, in time order."""
    out: list[tuple[str, bytes, bytes]] = []
    for i in range(first, last):
        ts = T0 + i * 20
        symbol = f"S{rng.randrange(SYMBOLS)}"
        if rng.random() < 0.7:
            quoted = f"S{rng.randrange(SYMBOLS)}"
            quote = {"symbol": quoted, "bid_cents": 100 + i % 900, "ask_cents": 102 + i % 900, "ts": ts}
            out.append(("bench-quotes", quoted.encode(), orjson.dumps(quote)))
        trade = {
            "trade_id": f"t{i}",
            "symbol": symbol,
            "qty": 1 + i % 9,
            "price_cents": 101 + i % 900,
            "ts": ts,
        }
        out.append(("bench-trades", symbol.encode(), orjson.dumps(trade)))
    return out


# --kind -> the app's module, its join's topics (left, right) and its input generator.
KINDS = {
    "windowed": ("benchmarks.pipeline_app", ("bench-orders", "bench-payments"), chunk_records),
    "temporal": ("benchmarks.pipeline_enrich_app", ("bench-trades", "bench-quotes"), enrich_chunk_records),
}


async def fill(bootstrap: str, records: int, kind: str) -> int:
    """About `records` input records (orders and payments, or trades and quotes) on the join's
    topics, placed by murmur2, each with its `seq` (production order); returns how many."""
    _, topics, chunk_records = KINDS[kind]
    await create_topics(bootstrap, list(topics), PARTITIONS)
    orders = int(records / 1.7)
    rng, pending = random.Random(7), []  # type: ignore[var-annotated]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1)
    await producer.start()
    sent, seq = 0, 0
    try:
        for first in range(0, orders, CHUNK):
            chunk = chunk_records(first, min(orders, first + CHUNK), rng, pending, first + CHUNK >= orders)
            placed = partitions_for([key for _, key, _ in chunk], PARTITIONS, "murmur2").tolist()
            grouped: dict[tuple[str, int], list[tuple[bytes, bytes, Any]]] = {}
            for (topic, key, value), partition in zip(chunk, placed, strict=True):
                grouped.setdefault((topic, partition), []).append((key, value, [("seq", str(seq).encode())]))
                seq += 1
            acks = []
            for (topic, partition), batch in grouped.items():
                acks += await start_sending(producer, topic, partition, batch)
            for future, _ in acks:
                await future  # type: ignore[misc]
            sent += len(chunk)
            print(f"bench: produced {sent:,}", flush=True)
    finally:
        await producer.stop()
    return sent


# -- CPU of a process tree ------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu(root: int) -> float:
    """CPU seconds of `root` and its live descendants, with what their reaped children used."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except OSError:
                continue
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = _stat(pid)
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / _TICK
        todo += children.get(pid, [])
    return total


# -- the twin and the worker -----------------------------------------------------------------------


def time_twin(spark: Any, app: str, bootstrap: str, out: Path) -> dict[str, Any]:
    """The join command's work over the topics: results to Parquet, then the counts."""
    jvm = spark.sparkContext._gateway.proc.pid
    began, cpu, own = time.monotonic(), tree_cpu(jvm), time.process_time()
    output = run_twin(spark, JoinRef.of(app), Topics(bootstrap))
    output.results.write.mode("overwrite").parquet(str(out))
    counts = output.counts()
    wall = time.monotonic() - began
    used = tree_cpu(jvm) - cpu + time.process_time() - own
    output.unpersist()
    results = sum(counts["results"].values())
    return {"wall": wall, "cpu": used, "results": results, "counts": counts}


def time_worker(
    app: str, bootstrap: str, total: int, results: int, run_dir: Path, timeout: float
) -> dict[str, Any]:
    """One worker replaying the topics from the beginning (a fresh group)."""
    env = {**embedded_env(), "BENCH_BROKER": f"kafka://{bootstrap}",
           "BENCH_APP_ID": f"bench-{time.time_ns()}", "BENCH_DATA_DIR": str(run_dir / "worker"),
           "BENCH_PARTITIONS": str(PARTITIONS), "TANDEM_STANDBY_REPLICAS": "0"}  # fmt: skip
    worker = WorkerProcess("worker", app, run_dir, env, cwd=REPO)
    name = JoinRef.of(app).join
    worker.extra_env["BENCH_WEB_PORT"] = str(worker.port)
    worker.start()
    first = last = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            worker.check()
            view = worker.view()
            join = (view or {}).get("joins", {}).get(name)
            assert worker.process is not None
            now, cpu = time.perf_counter(), _cpu(worker.process.pid)
            if join and len(join["actives"]) == PARTITIONS:
                # From the last poll that saw it own every partition with nothing read (as
                # benchmarks/bench_worker.py: the view may not answer during the first batches).
                read = sum(join["read"].values())
                if read == 0:
                    first = (now, 0, cpu)
                if first is not None:
                    last = (now, read, cpu, join["results"])
                if read >= total and join["results"] >= results:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"the worker did not finish in {timeout} s (last: {last})")
    finally:
        worker.stop(15)
    assert first is not None and last is not None
    if last[3] != results or last[1] != total:
        raise RuntimeError(f"the worker read {last[1]:,} and handed over {last[3]:,} results; the input "
                           f"is {total:,} records, the twin made {results:,} results")  # fmt: skip
    return {"wall": last[0] - first[0], "cpu": last[2] - first[2], "results": last[3], "read": last[1]}


def _cpu(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / _TICK


def bench_twin(spark: Any, kind: str, sizes: list[int], cores: int, timeout: float) -> list[str]:
    app = KINDS[kind][0]
    lines = []
    for n, size in enumerate([20_000, *sizes]):  # the first warms the session (workers, JIT): not shown
        with (
            tempfile.TemporaryDirectory(prefix="bench-twin-") as tmp,
            EmbeddedBroker(log_dir=Path(tmp)) as broker,
        ):
            began = time.monotonic()
            total = asyncio.run(fill(broker.bootstrap, size, kind))
            print(f"bench: {total:,} input records produced in {time.monotonic() - began:.0f} s", flush=True)
            twin = time_twin(spark, app, broker.bootstrap, Path(tmp) / "results")
            print(f"bench: twin {twin['wall']:.1f} s wall, {twin['cpu']:.1f} s CPU", flush=True)
            print(f"bench: {twin['counts']}", flush=True)
            if n == 0:
                continue
            worker = time_worker(app, broker.bootstrap, total, twin["results"], Path(tmp), timeout)
            print(f"bench: worker {worker['wall']:.1f} s wall, {worker['cpu']:.1f} s CPU", flush=True)
        lines.append(
            f"| {total:,} | {twin['results']:,} | {twin['wall']:.1f} s | {twin['cpu']:.0f} s | "
            f"{total / twin['wall'] / cores:,.0f} | {total / twin['cpu']:,.0f} | {worker['wall']:.1f} s | "
            f"{worker['cpu']:.0f} s | {total / worker['wall']:,.0f} | {total / worker['cpu']:,.0f} | "
            f"{twin['wall'] / worker['wall']:.2f} | {twin['cpu'] / worker['cpu']:.2f} |"
        )
        print(lines[-1], flush=True)
    return lines


# -- the topic data source ------------------------------------------------------------------------


async def fill_topic(bootstrap: str, topic: str, records: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024)
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


def bench_source(spark: Any, records: int) -> list[str]:
    lines = []
    with EmbeddedBroker() as broker:
        topic = "bench-source"
        asyncio.run(fill_topic(broker.bootstrap, topic, records))
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
    parser.add_argument("--records", default="1000000,10000000", help="input sizes of the twin run")
    parser.add_argument("--kind", choices=sorted(KINDS), default="windowed", help="the join of the twin run")
    parser.add_argument("--source-records", type=int, default=500_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--worker-timeout", type=float, default=3600)
    parser.add_argument("--report", type=Path, help="write the Markdown results here")
    parser.add_argument("--skip-twin", action="store_true")
    parser.add_argument("--skip-source", action="store_true")
    args = parser.parse_args()
    spark = session(args.master, "tandem-bench", args.shuffle_partitions)
    cores = spark.sparkContext.defaultParallelism
    report = [
        f"Command: `python benchmarks/bench_pipeline.py {shlex.join(sys.argv[1:])}`",
        f"Machine: {os.cpu_count()} cores, Spark {spark.version} `{args.master}` "
        f"({cores} cores used), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average at the start {os.getloadavg()[0]:.1f} (1 min); join: {KINDS[args.kind][0]}",
        "",
    ]
    if not args.skip_twin:
        report += [
            "| input records | results | twin wall | twin CPU | twin records/s per core (wall) | "
            "twin records per CPU s | worker wall | worker CPU | worker records/s (1 process) | "
            "worker records per CPU s | wall ratio (twin / worker) | CPU ratio (twin / worker) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        sizes = [int(s) for s in args.records.split(",") if s]
        report += bench_twin(spark, args.kind, sizes, cores, args.worker_timeout)
        report.append("")
        save(report, args.report)
    if not args.skip_source:
        report += ["| reader | records | time | records/s |", "|---|---|---|---|"]
        report += bench_source(spark, args.source_records)
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

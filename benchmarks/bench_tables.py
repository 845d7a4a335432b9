"""Benchmarks of the tables package; prints Markdown tables (results: docs/bench/tables.md).

    .venv/bin/python -m benchmarks.bench_tables                       # everything
    .venv/bin/python -m benchmarks.bench_tables --only throughput --records 100000
    .venv/bin/python -m benchmarks.bench_tables --only memory --memory-keys 10000000
    .venv/bin/python -m benchmarks.bench_tables --only restore --restore-records 1000000
    .venv/bin/python -m benchmarks.bench_tables --only stages --records 100000 [--profile]

Every comparison is a ratio measured in the same run on the same machine:
- throughput: the windowed join (Tandem) and a join written the usual way on
  Faust-style tables, each against the raw consume rate of the same topics;
- memory: resident set size as the join state grows to N keys;
- restore: local files plus the changelog tail, against a full changelog replay;
- stages: CPU per record of each stage of the join loop, without Kafka.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import heapq
import itertools
import json
import pstats
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from rocksdict import Options, Rdict
from app.traffic import ad_events
from tables.changelog import JoinTables, caught_up, create_changelog_topic, send_records

from pipeline.records import Rejected, validate
from tables.keys import POINT_ONLY, record_key
from tables.kv import Overlay
from tables.operator import JoinType, JoinWindow, WindowedJoin
from tables.store import PartitionStore
from tables.testing import EmbeddedBroker

BASE_TS = 1_700_000_000_000
WINDOW = JoinWindow()  # the contract's defaults: before 0, after 10 min, grace 1 min


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


# -- throughput ---------------------------------------------------------------------

Rates = tuple[int, float, float]  # records, wall seconds, CPU seconds of this process


async def load_topics(bootstrap: str, names: dict[str, str], partitions: int, records: int) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(n, partitions, 1) for n in names.values()])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    per_tp: dict[tuple[str, int], list[tuple[bytes, bytes]]] = {}
    total = 0
    for side, event in ad_events(records):
        topic = names["left" if side == "left" else "right"]
        partition = hash(event["auction_id"]) % partitions
        per_tp.setdefault((topic, partition), []).append(
            (event["auction_id"].encode(), json.dumps(event).encode())
        )
        total += 1
    for (topic, partition), rows in per_tp.items():
        for start in range(0, len(rows), 5000):
            await send_records(producer, topic, partition, rows[start : start + 5000])
    await producer.stop()
    return total


async def consume_all(
    bootstrap: str,
    topics: list[str],
    partitions: int,
    handle: Callable[[int, list[tuple[str, list[Any]]]], Any] | None,
    finish: Callable[[], Any] | None = None,
) -> Rates:
    """Read every record of the topics (manual assignment); `handle(partition, parts)` is
    awaited per partition and fetch, `finish()` once caught up (timed too). Returns (records,
    wall seconds, CPU seconds)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=4 << 20,
    )
    await consumer.start()
    tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    count = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while True:
        fetched = await consumer.getmany(timeout_ms=100, max_records=5000)
        by_partition: dict[int, list[tuple[str, list[Any]]]] = {}
        for tp, records in fetched.items():
            count += len(records)
            by_partition.setdefault(tp.partition, []).append((tp.topic, records))
        if handle is not None:
            # Partitions are independent: one's acknowledgements overlap the other's work.
            await asyncio.gather(*(handle(p, parts) for p, parts in by_partition.items()))
        if not fetched and await caught_up(consumer, tps):
            break
    if finish is not None:
        await finish()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    await consumer.stop()
    return count, wall, cpu


# What the Tandem runs did: results produced, late records dropped (the two topics are read
# without aligning their timestamps, so how many clicks arrive after stream time has passed
# their window depends on how the fetches of the two topics interleave).
TANDEM_WORK: list[dict[str, int]] = []


async def tandem_join(bootstrap: str, names: dict[str, str], partitions: int, data: Path) -> Rates:
    """Consume, validate, join, produce results, then changelog + RocksDB commit per fetch.

    The two topics are joined in event-time order, as Kafka Streams does (it picks the
    record with the lowest timestamp among a task's partitions): the fetches of two topics
    do not advance in step, and taken as they come, impressions run minutes ahead of
    clicks, whose windows then close before they arrive (measured: 80 % of the clicks
    dropped as late). Per partition, validated records are buffered and released in
    timestamp order up to the lower of the two topics' highest timestamps seen; the rest
    when the input is exhausted. The input offset kept with the state is that of the
    first record of each topic not yet processed."""
    await create_changelog_topic(bootstrap, names["changelog"], partitions)
    tables = JoinTables(bootstrap, names["changelog"], data, window=WINDOW, join_type=JoinType.LEFT)
    await tables.start()
    await tables.on_assignment(set(range(partitions)), set())
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    sides = {names["left"]: "left", names["right"]: "right"}
    # Per partition: (ts, arrival, side, record, topic, offset) not yet joined; per topic the
    # highest timestamp seen and the next offset to fetch.
    buffered: dict[int, list[tuple[int, int, str, dict[str, Any], str, int]]] = {}
    highest: dict[int, dict[str, int]] = {}
    fetched_to: dict[int, dict[str, int]] = {}
    arrivals = itertools.count()

    async def join_released(partition: int, everything: bool) -> None:
        waiting = buffered.setdefault(partition, [])
        marks = highest.get(partition, {})
        if everything:
            ready, rest = waiting, []
        else:
            if len(marks) < len(sides):
                return
            until = min(marks.values())
            ready = [r for r in waiting if r[0] <= until]
            rest = [r for r in waiting if r[0] > until]
        buffered[partition] = rest
        join = tables.operator(partition)
        out: list[tuple[bytes | None, bytes | None]] = []
        process, dumps = join.process, orjson.dumps
        ready.sort()
        for _ts, _n, side, value, _topic, _offset in ready:
            out += [(r["auction_id"].encode(), dumps(r)) for r in process(side, value)]
        for topic, end in fetched_to.get(partition, {}).items():
            first_waiting = min((r[5] for r in rest if r[4] == topic), default=end)
            join.set_input_offset(topic, first_waiting)
        await send_records(producer, names["output"], partition, out)
        await tables.commit(partition)
        work["results"] += len(out)

    async def handle(partition: int, parts: list[tuple[str, list[Any]]]) -> None:
        waiting = buffered.setdefault(partition, [])
        marks = highest.setdefault(partition, {})
        for topic, records in parts:
            side = sides[topic]
            top = marks.get(topic, -(1 << 62))
            for record in records:
                value = validate(side, record.key, record.value, None)
                if not isinstance(value, Rejected):
                    ts = value["ts"]
                    top = ts if ts > top else top
                    waiting.append((ts, next(arrivals), side, value, topic, record.offset))
            marks[topic] = top
            fetched_to.setdefault(partition, {})[topic] = records[-1].offset + 1
        await join_released(partition, everything=False)

    async def finish() -> None:
        await asyncio.gather(*(join_released(p, everything=True) for p in range(partitions)))

    work = {"results": 0}
    rates = await consume_all(bootstrap, [names["left"], names["right"]], partitions, handle, finish)
    work["late"] = sum(tables.operator(p).late for p in range(partitions))
    work["duplicates"] = sum(tables.operator(p).duplicates for p in range(partitions))
    TANDEM_WORK.append(work)
    await producer.stop()
    await tables.close()
    return rates


class FaustStyleTable:
    """A join written the usual way on Faust tables: one table keyed by auction_id whose
    value (JSON) holds the impressions and clicks seen; every update rewrites the whole value
    in RocksDB (Faust's rocksdb store does one put per set) and sends it to the changelog
    with one `send()` per update (what `table[key] = value` does). JSON by orjson, as
    Faust's json codec does when orjson is installed (faust/utils/json.py)."""

    def __init__(self, path: Path, producer: AIOKafkaProducer, changelog: str) -> None:
        self.db = Rdict(str(path), Options(raw_mode=True))
        self.producer = producer
        self.changelog = changelog

    async def process(self, partition: int, side: str, event: dict[str, Any]) -> list[dict[str, Any]]:
        key = event["auction_id"].encode()
        raw = self.db.get(key)
        value = orjson.loads(raw) if raw else {"left": [], "right": []}
        if any(e["event_id"] == event["event_id"] for e in value[side]):
            return []
        other = "right" if side == "left" else "left"
        results = []
        for seen in value[other]:
            left, right = (event, seen) if side == "left" else (seen, event)
            if left["ts"] - WINDOW.before <= right["ts"] <= left["ts"] + WINDOW.after:
                results.append(
                    {
                        "join_id": f"{left['event_id']}|{right['event_id']}",
                        "ts": max(left["ts"], right["ts"]),
                    }
                )
        value[side].append(event)
        encoded = orjson.dumps(value)
        self.db.put(key, encoded)
        await self.producer.send(self.changelog, encoded, key=key, partition=partition)
        return results


async def faust_style_join(bootstrap: str, names: dict[str, str], partitions: int, data: Path) -> Rates:
    await create_changelog_topic(bootstrap, names["changelog"], partitions)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    tables = {p: FaustStyleTable(data / str(p), producer, names["changelog"]) for p in range(partitions)}

    async def handle(partition: int, parts: list[tuple[str, list[Any]]]) -> None:
        for topic, records in parts:
            side = "left" if topic == names["left"] else "right"
            for record in records:
                value = validate(side, record.key, record.value, None)
                if isinstance(value, Rejected):
                    continue
                for result in await tables[partition].process(partition, side, value):
                    await producer.send(names["output"], orjson.dumps(result), partition=partition)
        await producer.flush()

    rates = await consume_all(bootstrap, [names["left"], names["right"]], partitions, handle)
    await producer.stop()
    for table in tables.values():
        table.db.close()
    return rates


async def validate_only(bootstrap: str, names: dict[str, str], partitions: int) -> Rates:
    """Consume and validate, no join: the floor every join pays in Python."""

    async def handle(partition: int, parts: list[tuple[str, list[Any]]]) -> None:
        for topic, records in parts:
            side = "left" if topic == names["left"] else "right"
            for record in records:
                validate(side, record.key, record.value, None)

    rates = await consume_all(bootstrap, [names["left"], names["right"]], partitions, handle)
    return rates


async def bench_throughput(records: int, partitions: int, rounds: int, work: Path) -> list[str]:
    """Each pipeline runs `rounds` times, interleaved, on the same topics; the best round
    of each counts (the least disturbed by other load on the machine)."""
    best: dict[str, tuple[float, float]] = {}
    with EmbeddedBroker(log_dir=work / "broker") as broker:
        inputs = {"left": "impressions", "right": "clicks"}
        bootstrap = broker.bootstrap
        total = await load_topics(bootstrap, inputs, partitions, records)
        for n in range(rounds):
            tandem = {**inputs, "output": f"out-t{n}", "changelog": f"cl-t{n}"}
            faust = {**inputs, "output": f"out-f{n}", "changelog": f"cl-f{n}"}
            runs = {
                "raw": consume_all(bootstrap, list(inputs.values()), partitions, None),
                "validate": validate_only(bootstrap, inputs, partitions),
                "tandem": tandem_join(bootstrap, tandem, partitions, work / f"t{n}"),
                "faust": faust_style_join(bootstrap, faust, partitions, work / f"f{n}"),
            }
            for name, run in runs.items():
                count, wall, cpu = await run
                wall_rate, cpu_rate = best.get(name, (0.0, 0.0))
                best[name] = (max(wall_rate, count / wall), max(cpu_rate, count / cpu))
    raw, faust_best = best["raw"], best["faust"]
    labels = {
        "raw": "raw consume",
        "validate": "consume + decode/validate, no join",
        "tandem": "Tandem windowed join (left) + changelog + RocksDB commit",
        "faust": "Faust-style table join (no expiry)",
    }
    rows = [
        f"| {labels[name]} | {wall:,.0f} | {wall / raw[0]:.2f} | {wall / faust_best[0]:.2f} "
        f"| {cpu:,.0f} | {cpu / raw[1]:.2f} | {cpu / faust_best[1]:.2f} |"
        for name, (wall, cpu) in best.items()
    ]
    return [
        f"Input: {total:,} records ({records:,} impressions, their clicks), {partitions} "
        f"partitions, one worker, embedded tansu broker; best of {rounds} interleaved rounds.",
        "",
        "| pipeline | records/s (wall) | vs raw | vs Faust-style | records per CPU-s | vs raw "
        "| vs Faust-style |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "Tandem rounds (results produced / late records dropped / duplicates): "
        + "; ".join(f"{w['results']:,} / {w['late']:,} / {w['duplicates']:,}" for w in TANDEM_WORK)
        + ".",
    ]


# -- stages: where the CPU of a record goes, without Kafka ---------------------------


def bench_stages(records: int, batch: int, work: Path, profile: bool) -> list[str]:
    """The join alone over RocksDB + overlay (left join, event-time order, a commit every
    `batch` records): CPU per input record of each stage of the loop a worker runs."""
    events = [(s, e["auction_id"].encode(), orjson.dumps(e)) for s, e in ad_events(records)]
    store = PartitionStore(work / "stages" / "joins" / "0")
    overlay = Overlay(store, unscanned=POINT_ONLY)
    join = WindowedJoin(overlay, WINDOW, JoinType.LEFT)
    names = ["decode + validate", "process", "encode results", "take_changes", "RocksDB write"]
    spent = dict.fromkeys(names, 0.0)
    results = changes = 0
    clock = time.process_time
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    for start in range(0, len(events), batch):
        t0 = clock()
        valid = [
            (side, validate(side, key, value, None)) for side, key, value in events[start : start + batch]
        ]
        t1 = clock()
        out: list[dict[str, Any]] = []
        for side, value in valid:
            if not isinstance(value, Rejected):
                out += join.process(side, value)
        t2 = clock()
        encoded = [(r["auction_id"].encode(), orjson.dumps(r)) for r in out]
        t3 = clock()
        logged = join.take_changes()
        t4 = clock()
        store.write(overlay.pending, start)
        overlay.clear()
        t5 = clock()
        for name, spent_here in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            spent[name] += spent_here
        results, changes = results + len(encoded), changes + len(logged)
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    store.close()
    n = len(events)
    return [
        f"{n:,} records ({records:,} impressions), left join, a commit every {batch:,} records: "
        f"{results:,} results, {changes:,} changelog records.",
        "",
        "| stage | µs CPU per input record |",
        "| --- | ---: |",
        *(f"| {name} | {value / n * 1e6:.2f} |" for name, value in spent.items()),
        f"| **total** | **{sum(spent.values()) / n * 1e6:.2f}** |",
    ]


# -- memory -------------------------------------------------------------------------


def bench_memory(keys: int, step: int, work: Path, path: str) -> list[str]:
    """Left-join state of `keys` impressions that never expire (the window outlasts the
    run), one join key each. path=process: through WindowedJoin.process (matching and
    expiry included); path=restore: through WindowedJoin.restore, the path of a standby
    or a restore, which writes the same keys for a fraction of the CPU."""
    store = PartitionStore(work / "mem" / "joins" / "0")
    overlay = Overlay(store, unscanned=POINT_ONLY)
    join = WindowedJoin(overlay, JoinWindow(0, 10**12, 0), JoinType.LEFT)
    rows = [f"| 0 | {rss_mb():.0f} | 0 | |"]
    started = time.perf_counter()
    for n in range(1, keys + 1):
        if path == "process":
            event = {"event_id": f"i{n}", "auction_id": f"auction-{n}", "campaign_id": "c7"}
            join.process("left", {**event, "ts": BASE_TS + n})
        else:
            join.restore(record_key("left", f"auction-{n}", BASE_TS + n, f"i{n}"), b"\x00c7")
        if n % 2000 == 0:
            join.take_changes()  # the changelog is not part of this measurement
            store.write(overlay.pending, n)
            overlay.clear()
        if n % step == 0:
            rate = n / (time.perf_counter() - started)
            rows.append(f"| {n:,} | {rss_mb():.0f} | {dir_mb(store.path):.0f} | {rate:,.0f} |")
            print(rows[-1], flush=True)
    store.close()
    return [
        f"Path: `{path}`. Keys = impressions held in state (4 RocksDB entries each).",
        "",
        "| join keys in state | resident MB | files MB | keys/s so far |",
        "| ---: | ---: | ---: | ---: |",
        *rows,
    ]


# -- restore ------------------------------------------------------------------------


async def bench_restore(records: int, tail_fraction: float, work: Path) -> list[str]:
    """A worker writes `records` changelog records; a copy of its files is taken when all
    but the tail is written. Restore from that copy + tail, then from nothing."""
    with EmbeddedBroker(log_dir=work / "broker-r") as broker:
        topic = "restore-changelog"
        await create_changelog_topic(broker.bootstrap, topic, 1)
        writer_dir, local_dir = work / "writer", work / "local"
        writer = JoinTables(broker.bootstrap, topic, writer_dir, window=WINDOW, join_type=JoinType.INNER)
        await writer.start()
        await writer.on_assignment({0}, set())
        snapshot_at = int(records * (1 - tail_fraction))
        written = 0
        for n, (side, event) in enumerate(ad_events(records), 1):
            writer.operator(0).process(side, event)
            written = n
            if n % 5000 == 0 or n == snapshot_at:
                await writer.commit(0)
            if n == snapshot_at:
                await writer.close()  # files are copied closed, then the writer goes on
                shutil.copytree(writer_dir, local_dir)
                await writer.start()
                await writer.on_assignment({0}, set())
            if n >= records:
                break
        await writer.commit(0)
        end = writer.local_offsets()[0] + 1
        await writer.close()

        timings = {}
        for name, data_dir in (("local files + tail", local_dir), ("full replay", work / "empty")):
            tables = JoinTables(broker.bootstrap, topic, data_dir, window=WINDOW, join_type=JoinType.INNER)
            await tables.start()
            started = time.perf_counter()
            await tables.on_assignment({0}, set())
            timings[name] = (time.perf_counter() - started, tables.replayed[0])
            assert tables.local_offsets()[0] == end - 1
            await tables.close()
    local, full = timings["local files + tail"], timings["full replay"]
    return [
        f"Changelog of {end:,} records ({written:,} input records, inner join), one partition; "
        f"tail = the last {tail_fraction:.0%} of the input.",
        "",
        "| restore | changelog records read | seconds | speed-up |",
        "| --- | ---: | ---: | ---: |",
        f"| full replay (no local files) | {full[1]:,} | {full[0]:.2f} | 1.0 |",
        f"| local files + tail | {local[1]:,} | {local[0]:.2f} | {full[0] / local[0]:.1f}x |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["throughput", "memory", "restore", "stages"])
    parser.add_argument("--records", type=int, default=100_000, help="impressions for throughput")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-keys", type=int, default=10_000_000)
    parser.add_argument("--memory-step", type=int, default=1_000_000)
    parser.add_argument("--memory-path", choices=["restore", "process"], default="restore")
    parser.add_argument("--restore-records", type=int, default=1_000_000)
    parser.add_argument("--tail-fraction", type=float, default=0.01)
    parser.add_argument("--stages-batch", type=int, default=3000, help="records per commit")
    parser.add_argument("--profile", action="store_true", help="stages: cProfile, top 20")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tables-") as tmp:
        work = Path(tmp)
        if args.only in (None, "throughput"):
            print(
                "\n## Throughput\n\n"
                + "\n".join(asyncio.run(bench_throughput(args.records, args.partitions, args.rounds, work))),
                flush=True,
            )
        if args.only in (None, "stages"):
            print(
                "\n## Stages\n\n"
                + "\n".join(bench_stages(args.records, args.stages_batch, work, args.profile)),
                flush=True,
            )
        if args.only in (None, "restore"):
            print(
                "\n## Restore\n\n"
                + "\n".join(asyncio.run(bench_restore(args.restore_records, args.tail_fraction, work))),
                flush=True,
            )
        if args.only in (None, "memory"):
            print(
                "\n## Memory\n\n"
                + "\n".join(bench_memory(args.memory_keys, args.memory_step, work, args.memory_path)),
                flush=True,
            )


if __name__ == "__main__":
    main()

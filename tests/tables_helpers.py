"""Helpers for the tables tests: topics, records, state dumps, and a join worker process.

`python -m tests.tables_helpers --bootstrap ... ` runs a worker that joins two
co-partitioned topics with JoinTables; the crash tests kill it and restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rocksdict import AccessType, Options, Rdict

from app.contract import Rejected, validate
from app.contract import result as ad_result
from tables.operators import keys
from tables.operators.windowed import JoinType, JoinWindow, Match
from tables.operators.windowed_kind import WindowedKind
from tables.state.manager import JoinState
from tables.state.store import CHECKPOINT_KEY, FORMAT_KEY, PartitionStore
from tables.testing import caught_up, read_records


def compiled_at_import(module: str, pure_python: str) -> bool:
    """Whether the compiled part `module.PART` (a tables.compiled.CompiledPart, e.g.
    "tables.operators.windowed.LOOP") runs, in a fresh interpreter with TANDEM_PURE_PYTHON=`pure_python` (the
    variable is read once, at import: only a new process shows its effect)."""
    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": repo, "TANDEM_PURE_PYTHON": pure_python}
    owner, _, part = module.rpartition(".")
    done = subprocess.run(
        [sys.executable, "-c", f"import {owner} as m; print(m.{part}.active)"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() in ("True", "False"), done.stderr
    return done.stdout.strip() == "True"


Record = tuple[str, dict[str, Any]]  # (side, value)


def partition_of(key: str, partitions: int) -> int:
    """Co-partitioning for tests: a stable hash (the producer is told the partition)."""
    return sum(key.encode()) % partitions


async def produce(bootstrap: str, topic: str, values: list[dict[str, Any]], partitions: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        sent = [
            await producer.send(
                topic,
                json.dumps(v).encode(),
                key=v["auction_id"].encode(),
                partition=partition_of(v["auction_id"], partitions),
            )
            for v in values
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> list[Any]:
    """Every record's JSON value, read up to the high watermark of each partition."""
    return [json.loads(r.value) for r in await read_records(bootstrap, topic, partitions, timeout)]


def dump(path: Path) -> dict[bytes, bytes]:
    """Every key of a closed partition database."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return dict(db.items())
    finally:
        db.close()


def comparable(state: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """State without the store's own keys (checkpoint, format), which legitimately
    differ between runs or are not join state, nor the index the windowed join derives from
    its records with TANDEM_WINDOW_INDEX=rocksdb (never in the changelog)."""
    own = (CHECKPOINT_KEY, FORMAT_KEY)
    derived = (keys.EXPIRY_INDEX, keys.ID_INDEX, keys.INDEX_MARK)
    return {k: v for k, v in state.items() if k not in own and not k.startswith(derived)}


def ad_data(auctions: int, after: int, seed: int = 7) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Impressions and clicks: matches, clicks outside the window, lone clicks, duplicates,
    and (last) impressions far too old to join."""
    rng = random.Random(seed)
    base = 1_000_000_000
    impressions, clicks = [], []
    for n in range(auctions):
        auction, ts = f"a{n}", base + n * 10
        impressions.append({"event_id": f"i{n}", "auction_id": auction, "campaign_id": f"c{n % 7}", "ts": ts})
        roll = rng.random()
        if roll < 0.6:
            clicks.append({"event_id": f"k{n}", "auction_id": auction, "ts": ts + rng.randint(0, after)})
        elif roll < 0.7:
            clicks.append(
                {
                    "event_id": f"k{n}",
                    "auction_id": auction,
                    "ts": ts + after + 1 + rng.randint(0, 50),
                }
            )
        elif roll < 0.8:
            clicks.append({"event_id": f"k{n}", "auction_id": f"lone{n}", "ts": ts})
    impressions += rng.sample(impressions, auctions // 20)
    clicks += rng.sample(clicks, len(clicks) // 20)
    impressions += [
        {"event_id": f"old{n}", "auction_id": f"a{n}", "campaign_id": "c0", "ts": base - 10**8}
        for n in range(10)
    ]
    return impressions, clicks


# -- the worker process ---------------------------------------------------------------


_ARMED = {"now": False}  # the crash point is reached once enough results were produced


def _kill_self_at(point: str, wanted: str | None) -> None:
    if _ARMED["now"] and point == wanted:
        os.kill(os.getpid(), signal.SIGKILL)


async def run_worker(args: argparse.Namespace) -> None:
    window = JoinWindow(args.before, args.after, args.grace)
    state = JoinState(
        args.bootstrap, args.changelog, args.data_dir, kind=WindowedKind(window, JoinType(args.join_type))
    )
    partitions = set(range(args.partitions))
    moves = await state.assign(partitions, set())
    await state.restore(moves.to_restore, lambda p: None)
    replayed = {p: state.recovery.progress[p].restored for p in moves.to_restore}
    _kill_in_state_write(args.crash_point)
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=5, acks="all")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        group_id=f"{args.output}-worker",
    )
    await producer.start()
    await consumer.start()
    tps = [TopicPartition(t, p) for t in (args.left, args.right) for p in sorted(partitions)]
    consumer.assign(tps)
    for tp in tps:  # Kafka's committed offsets, which lag the state: the input is replayed
        consumer.seek(tp, await consumer.committed(tp) or 0)
    print(f"ready replayed={json.dumps(replayed)}", flush=True)
    batches = produced = 0
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        fetched = await consumer.getmany(timeout_ms=200, max_records=args.batch)
        if not fetched:
            if args.exit_when_done and await caught_up(consumer, tps):
                break
            continue
        by_partition: dict[int, list[Any]] = defaultdict(list)
        for tp, records in fetched.items():
            by_partition[tp.partition].append((tp.topic, records))
        for partition, parts in by_partition.items():
            batches += 1
            results = _process(state, partition, parts, args.left)
            sent = [
                await producer.send(
                    args.output,
                    json.dumps(r).encode(),
                    key=r["auction_id"].encode(),
                    partition=partition,
                )
                for r in results
            ]
            await asyncio.gather(*sent)
            produced += len(results)
            _ARMED["now"] = bool(args.crash_point) and produced >= args.crash_after_results
            _kill_self_at("before_changelog", args.crash_point)
            await state.commit(partition, producer)
            await consumer.commit(
                {tp: records[-1].offset + 1 for tp, records in fetched.items() if tp.partition == partition}
            )
            print(f"committed {partition} {batches} results={produced}", flush=True)
        if args.pause:
            await asyncio.sleep(args.pause)
    await consumer.stop()
    await producer.stop()
    await state.close()
    print("done", flush=True)


def as_event(side: str, record: dict[str, Any]) -> tuple[Any, ...]:
    """A validated ad record as the generic operator's input: key, ts, id, value."""
    return (
        side,
        record["auction_id"].encode(),
        record["ts"],
        record["event_id"].encode(),
        orjson.dumps(record),
    )


def as_output(match: Match) -> dict[str, Any]:
    """An operator's match as an `ad-joins` record."""
    left = None if match.left is None else orjson.loads(match.left)
    right = None if match.right is None else orjson.loads(match.right)
    return ad_result(left, right)


def _process(state: JoinState, partition: int, parts: list[Any], left_topic: str) -> list[Any]:
    join = state.active(partition).operator
    results: list[Any] = []
    for topic, records in parts:
        side = "left" if topic == left_topic else "right"
        for record in records:
            value = validate(side, record.key, record.value, None)  # type: ignore[arg-type]
            if not isinstance(value, Rejected):
                results += [as_output(m) for m in join.process(*as_event(side, value))]
    return results


def _kill_in_state_write(crash_point: str | None) -> None:
    """Die inside commit(), just before or just after RocksDB is written."""
    original = PartitionStore.write

    def write(self: PartitionStore, changes: Any, checkpoint: int | None) -> None:
        _kill_self_at("before_state_write", crash_point)
        original(self, changes, checkpoint)
        _kill_self_at("after_state_write", crash_point)

    PartitionStore.write = write  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "left", "right", "output", "changelog", "data-dir"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--join-type", default="outer")
    parser.add_argument("--before", type=int, default=0)
    parser.add_argument("--after", type=int, default=1000)
    parser.add_argument("--grace", type=int, default=10**7)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--exit-when-done", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument(
        "--crash-point", choices=["before_changelog", "before_state_write", "after_state_write"]
    )
    parser.add_argument("--crash-after-results", type=int, default=20)
    asyncio.run(run_worker(parser.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])

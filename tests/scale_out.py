"""Shared parts of the scale-out test and benchmark (issue 12): join state written straight
into the changelog, continuous traffic in a thread, and each partition's output gaps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from app.traffic import Traffic, run_traffic, send_all
from tables.kafka.batches import send_records
from tables.operators.kv import MemoryKV
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin
from tables.records.partitioners import partitions_for

WINDOW = JoinWindow(0, 600_000, 60_000)  # the reference app's (app/join.py)
CHUNK = 20_000


def keys_by_partition(per_partition: int, partitions: int, run: str) -> dict[int, list[str]]:
    """`per_partition` auction ids for each partition under the app's murmur2 partitioner."""
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while min(len(keys) for keys in found.values()) < per_partition:
        batch = [f"{run}-a{i}" for i in range(n, n + per_partition * partitions * 11 // 10 + 64)]
        n += len(batch)
        owners = partitions_for([k.encode() for k in batch], partitions, "murmur2").tolist()
        for key, p in zip(batch, owners, strict=True):
            if len(found[p]) < per_partition:
                found[p].append(key)
    return found


def state_records(keys: dict[int, list[str]], ts: int) -> dict[int, list[tuple[bytes, bytes]]]:
    """The changelog records a worker would have written after joining these impressions (no
    clicks yet), per partition: what a restore or a standby reads."""
    found: dict[int, list[tuple[bytes, bytes]]] = {}
    for partition, auctions in keys.items():
        records = found[partition] = []
        for start in range(0, len(auctions), CHUNK):
            # A fresh operator per chunk: the records are the same (every key is new), and the
            # in-memory store stays small (its sorted inserts slow down as it grows).
            join = WindowedJoin(MemoryKV(), WINDOW, JoinType.INNER, ids=True)
            for auction in auctions[start : start + CHUNK]:
                value = {"event_id": f"{auction}-i", "auction_id": auction, "campaign_id": "c", "ts": ts}
                join.process("left", auction.encode(), ts, f"{auction}-i".encode(), orjson.dumps(value))
            records += join.take_changes()
    return found


async def send_changelog(
    bootstrap: str, changelog: str, records: dict[int, list[tuple[bytes, bytes]]]
) -> int:
    """Write the records to their changelog partitions; how many."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_batch_size=512 * 1024)
    await producer.start()
    try:
        for partition, found in records.items():
            for start in range(0, len(found), CHUNK):
                await send_records(producer, changelog, partition, found[start : start + CHUNK])
    finally:
        await producer.stop()
    return sum(map(len, records.values()))


async def fill_changelog(bootstrap: str, changelog: str, keys: dict[int, list[str]], ts: int) -> int:
    """The join state of these impressions, written into the changelog. Returns the records."""
    return await send_changelog(bootstrap, changelog, state_records(keys, ts))


async def send_state_clicks(bootstrap: str, clicks_topic: str, keys: dict[int, list[str]]) -> set[str]:
    """A click for every impression held only in the pre-written state; the join ids expected."""
    now = int(time.time() * 1000)
    records = [
        (clicks_topic, auction, orjson.dumps({"event_id": f"{auction}-c", "auction_id": auction, "ts": now}))
        for auctions in keys.values()
        for auction in auctions
    ]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        await send_all(producer, records)
        await producer.flush()
    finally:
        await producer.stop()
    return {f"{a}-i|{a}-c" for auctions in keys.values() for a in auctions}


@dataclass
class Background:
    """Traffic at a steady rate in its own thread until stopped."""

    bootstrap: str
    traffic: Traffic
    rate: float
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    errors: list[BaseException] = field(default_factory=list)

    def start(self) -> Background:
        ready = threading.Event()

        async def run() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            ready.set()
            await run_traffic(self.bootstrap, self.traffic, self.rate, self._stop)

        def main() -> None:
            try:
                asyncio.run(run())
            except BaseException as exc:  # shown by stop()
                self.errors.append(exc)
                ready.set()

        self._thread = threading.Thread(target=main, name="traffic", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> Traffic:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
        if self.errors:
            raise self.errors[0]
        return self.traffic


async def read_output(bootstrap: str, topic: str, expected: set[str], timeout: float) -> list[Any]:
    """The output records (partition, timestamp in ms, join id) until `expected` are all there."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    seen: list[tuple[int, int, str]] = []
    ids: set[str] = set()
    try:
        deadline = time.monotonic() + timeout
        while not expected <= ids and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300, max_records=50_000)
            for records in batch.values():
                for r in records:
                    join_id = orjson.loads(r.value)["join_id"]
                    seen.append((r.partition, r.timestamp, join_id))
                    ids.add(join_id)
    finally:
        await consumer.stop()
    return seen


def longest_gaps(outputs: list[Any], partitions: int, start_ms: int, end_ms: int) -> dict[int, float]:
    """Per partition, the longest time in [start, end] without an output record, in seconds."""
    times: dict[int, list[int]] = {p: [start_ms, end_ms] for p in range(partitions)}
    for partition, ts, _ in outputs:
        if start_ms <= ts <= end_ms:
            times[partition].append(ts)
    gaps = {}
    for partition, stamps in times.items():
        stamps.sort()
        gaps[partition] = max(b - a for a, b in zip(stamps, stamps[1:], strict=False)) / 1000
    return gaps

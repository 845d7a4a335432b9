"""Synthetic ad traffic for the demo, the tests and the benchmark.

Impressions keyed by auction id; a share of them get a click a little later
(within the join window); a few records are malformed (dead letters) and a few
are delivered twice (the join must ignore them). `expected` is what the join
must produce: one join id per clicked auction.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from app.settings import Settings
from assignor import clients
from tables.kafka.batches import send_records
from tables.records.partitioners import partition_for

BASE_TS = 1_700_000_000_000


@dataclass
class Traffic:
    impressions_topic: str
    clicks_topic: str
    run: str = "t"
    click_ratio: float = 0.5
    bad_every: int = 50
    duplicate_every: int = 40
    campaigns: int = 5
    seed: int = 7
    sent: int = 0
    bad: int = 0
    expected: set[str] = field(default_factory=set)
    _pending: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def _impression(self, i: int, now: int) -> tuple[str, str, dict[str, object]]:
        auction = f"{self.run}-a{i}"
        record = {
            "event_id": f"{self.run}-i{i}",
            "auction_id": auction,
            "campaign_id": f"campaign-{i % self.campaigns}",
            "ts": now,
        }
        if self._random.random() < self.click_ratio:
            self._pending.append((auction, now + self._random.randint(1, 5000)))
            self.expected.add(f"{self.run}-i{i}|{self.run}-c{i}")
        return self.impressions_topic, auction, record

    def batch(self, i: int) -> list[tuple[str, str, bytes]]:
        """Records to send for step `i`: an impression, maybe an earlier auction's click."""
        now = int(time.time() * 1000)
        topic, key, record = self._impression(i, now)
        out = [(topic, key, json.dumps(record).encode())]
        if self._pending and (len(self._pending) > 5 or self._random.random() < 0.3):
            auction, ts = self._pending.pop(0)
            n = auction.rsplit("-a", 1)[1]
            click = {"event_id": f"{self.run}-c{n}", "auction_id": auction, "ts": ts}
            out.append((self.clicks_topic, auction, json.dumps(click).encode()))
        if self.duplicate_every and i % self.duplicate_every == 0:
            out.append(out[-1])
        if self.bad_every and i % self.bad_every == self.bad_every - 1:
            out.append((self.impressions_topic, f"{self.run}-bad{i}", b"{not json"))
            self.bad += 1
        return out

    def flush_clicks(self) -> list[tuple[str, str, bytes]]:
        """The clicks still pending (send at the end so every expected join can happen)."""
        out = []
        for auction, ts in self._pending:
            n = auction.rsplit("-a", 1)[1]
            click = {"event_id": f"{self.run}-c{n}", "auction_id": auction, "ts": ts}
            out.append((self.clicks_topic, auction, json.dumps(click).encode()))
        self._pending.clear()
        return out


async def send_all(producer: AIOKafkaProducer, records: list[tuple[str, str, bytes]]) -> None:
    for topic, key, value in records:
        await producer.send(topic, value, key=key.encode())


async def run_traffic(
    connection: str | Mapping[str, Any],
    traffic: Traffic,
    rate: float,
    stop: asyncio.Event,
    limit: int | None = None,
) -> Traffic:
    """Send about `rate` impressions a second until `stop` is set (or `limit` is reached)."""
    producer = clients.producer(clients.settings_of(connection), linger_ms=5)
    await producer.start()
    try:
        i = 0
        started = time.monotonic()
        while not stop.is_set() and (limit is None or i < limit):
            await send_all(producer, traffic.batch(i))
            i += 1
            traffic.sent = i
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await send_all(producer, traffic.flush_clicks())
        await producer.flush()
    finally:
        await producer.stop()
    return traffic


# -- a backlog: many events at once, in event time -----------------------------------


def ad_events(
    impressions: int, seed: int = 1, base_ts: int = BASE_TS, every: int = 1
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Impressions 10 ms apart from `base_ts`; 60 % get a click up to 5 min later. Events
    arrive in time order, up to 2 s out of order (within the default 1 min grace).

    `every`: only every `every`-th auction of the `impressions` (a thinner traffic over the
    same span of event time), generated without making the others (a test that filtered
    30 min of full traffic spent most of its time building records it dropped)."""
    rng = random.Random(seed)
    clicks: list[tuple[int, int, dict[str, Any]]] = []  # (arrival, n, click)
    for n in range(0, impressions, every):
        auction, ts = f"auction-{n}", base_ts + n * 10
        while clicks and clicks[0][0] <= ts:
            yield "right", heapq.heappop(clicks)[2]
        yield (
            "left",
            {"event_id": f"i{n}", "auction_id": auction, "campaign_id": f"c{n % 97}", "ts": ts},
        )
        if rng.random() < 0.6:
            click = {"event_id": f"k{n}", "auction_id": auction, "ts": ts + rng.randint(0, 300_000)}
            heapq.heappush(clicks, (click["ts"] + rng.randint(0, 2_000), n, click))
    while clicks:
        yield "right", heapq.heappop(clicks)[2]


async def produce_events(
    settings: Settings, events: Iterable[tuple[str, dict[str, Any]]], partitions: int
) -> int:
    """Produce (side, event) pairs to the join's input topics in order, keyed and
    co-partitioned by auction id (Kafka's murmur2 partitioner); returns how many."""
    per_tp: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = {}
    for side, event in events:
        topic = settings.impressions if side == "left" else settings.clicks
        key = event["auction_id"].encode()
        per_tp.setdefault((topic, partition_for(key, partitions, "murmur2")), []).append(
            (key, orjson.dumps(event))
        )
    producer = clients.producer(clients.settings_of(settings.broker.removeprefix("kafka://")), linger_ms=5)
    await producer.start()
    try:
        for (topic, partition), rows in per_tp.items():
            for start in range(0, len(rows), 5000):
                await send_records(producer, topic, partition, rows[start : start + 5000])
    finally:
        await producer.stop()
    return sum(len(rows) for rows in per_tp.values())

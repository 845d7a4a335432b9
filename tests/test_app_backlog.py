"""End to end: one worker started on a backlog joins all of it and drops nothing as late.

After downtime, `impressions` and `clicks` already hold records when a worker starts.
Impressions are dense in event time and clicks sparse (each up to 5 min after its
impression), so the same number of records read from each topic covers very different
spans of event time. A worker that hands records to the join in fetch order lets stream
time follow whichever topic runs ahead, and drops records as late that were never late.
Kafka Streams avoids this by taking a task's records in timestamp order across its
partitions. Processed that way, this backlog has no late record: clicks are out of order
by at most 2 s, and the window is 10 min with 1 min of grace.

Nothing can be late unless the backlog spans more event time than the window plus its
grace, so the input is every STRIDE-th auction of benchmarks.bench_tables.ad_events: the
same traffic, thinner (5 impressions and 3 clicks a second), about 30 min of it in
13,000 records. Taken in timestamp order per partition, the join drops nothing and
finds every click's impression; taken alternately from the two topics, as Faust's
round-robin does, it drops about 2,100 records as late and loses about 1,300 joins.

Every wait is bounded; the worker is stopped by its process id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.broker import EmbeddedBroker, high_watermarks
from app.cluster import WorkerProcess
from app.settings import Settings, from_env
from app.topics import create_topics
from benchmarks.bench_tables import ad_events
from tables.changelog import send_records

pytestmark = [pytest.mark.broker, pytest.mark.timeout(150)]

PARTITIONS = 4
IMPRESSIONS = 8_000  # and about 4,800 clicks
STRIDE = 20  # every 20th auction: impressions 200 ms apart, ~1,600 s of them
CATCH_UP_S = 90.0  # to own every partition and process the whole backlog
SETTLE_S = 2.0  # "outputs" unchanged this long at lag 0: nothing more is coming


@dataclasses.dataclass
class Backlog:
    total: int  # input records produced
    expected: set[str]  # join ids of the inner matches: one per click
    clicked: set[str]  # impression ids that have a click


async def _load(settings: Settings, bootstrap: str) -> Backlog:
    """Produce the input before any worker runs, keyed and co-partitioned by auction id
    (as benchmarks/bench_worker.py does). Timestamps end about an hour ago: the worker
    rejects records more than 7 days old by the wall clock."""
    span_ms = IMPRESSIONS * STRIDE * 10 + 300_000
    base_ts = int(time.time() * 1000) - 3_600_000 - span_ms
    per_tp: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = {}
    impressions: dict[str, str] = {}  # auction id -> impression id
    clicks: list[dict[str, Any]] = []
    for side, event in ad_events(IMPRESSIONS * STRIDE, base_ts=base_ts):
        if int(event["auction_id"].rsplit("-", 1)[1]) % STRIDE:
            continue
        if side == "left":
            topic = settings.impressions
            impressions[event["auction_id"]] = event["event_id"]
        else:
            topic = settings.clicks
            clicks.append(event)
        key = event["auction_id"].encode()
        per_tp.setdefault((topic, zlib.crc32(key) % PARTITIONS), []).append((key, orjson.dumps(event)))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for (topic, partition), rows in per_tp.items():
            for start in range(0, len(rows), 5000):
                await send_records(producer, topic, partition, rows[start : start + 5000])
    finally:
        await producer.stop()
    assert len(impressions) == IMPRESSIONS
    expected = {f"{impressions[c['auction_id']]}|{c['event_id']}" for c in clicks}
    assert len(expected) == len(clicks) > IMPRESSIONS / 2  # one click per clicked impression
    clicked = {impressions[c["auction_id"]] for c in clicks}
    return Backlog(sum(len(rows) for rows in per_tp.values()), expected, clicked)


async def _read_all(bootstrap: str, topic: str, ends: dict[int, int], timeout: float) -> list[dict]:
    """Every record of `topic` up to the end offsets `ends`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=100)
    await consumer.start()
    seen: list[dict[str, Any]] = []
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout
        while [tp for tp in tps if await consumer.position(tp) < ends[tp.partition]]:
            assert time.monotonic() < deadline, f"{topic}: not read to {ends} within {timeout} s"
            batch = await consumer.getmany(timeout_ms=300)
            seen.extend(json.loads(r.value) for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return seen


def _lags(view: dict[str, Any] | None) -> dict[str, int] | None:
    """Each partition's unprocessed input, once the worker owns every partition and
    knows where each ends (as benchmarks/bench_worker.consumed)."""
    if view is None or len(view["actives"]) < PARTITIONS:
        return None
    lags = view["lag"]
    if any(lag is None for lag in lags.values()):
        return None
    return dict(lags)


def _catch_up(worker: WorkerProcess, timeout: float) -> tuple[dict[str, int], dict[str, Any]]:
    """Poll the worker's view until its lag is 0 on every partition and its outputs have
    settled: returns the first complete lag view and the last view."""
    first: dict[str, int] | None = None
    settled: tuple[float, int] | None = None  # (since when, outputs) at lag 0
    last: dict[str, Any] | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker.check()  # a crashed worker fails now, with its log
        view = worker.view()
        lags = _lags(view)
        if view is not None and lags is not None:
            last = view
            first = first or lags
            if sum(lags.values()) == 0:
                now = time.monotonic()
                if settled is None or settled[1] != view["outputs"]:
                    settled = (now, view["outputs"])
                elif now - settled[0] >= SETTLE_S:
                    return first, view
            else:
                settled = None
        time.sleep(0.1)
    raise AssertionError(f"backlog not processed within {timeout} s; last view: {last}")


def test_worker_started_on_a_backlog_drops_nothing_as_late(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    settings = dataclasses.replace(
        from_env(),
        broker=f"kafka://{broker.bootstrap}",
        app_id=f"tandem-backlog-{unique}",
        topic_prefix=f"b{unique}-",
        partitions=PARTITIONS,
    )
    asyncio.run(create_topics(broker.bootstrap, settings))
    backlog = asyncio.run(_load(settings, broker.bootstrap))
    # The whole backlog is in the broker before the worker starts.
    in_broker = sum(
        sum(asyncio.run(high_watermarks(broker.bootstrap, topic, PARTITIONS, 15)).values())
        for topic in (settings.impressions, settings.clicks)
    )
    assert in_broker == backlog.total, (in_broker, backlog.total)

    worker = WorkerProcess(
        "w1",
        "host-a",
        "rack-1",
        broker.bootstrap,
        settings.app_id,
        tmp_path,
        standby_replicas=0,
        partitions=PARTITIONS,
        topic_prefix=settings.topic_prefix,
    ).start()
    try:
        started = time.monotonic()
        first, view = _catch_up(worker, CATCH_UP_S)
        caught_up_s = time.monotonic() - started
    finally:
        worker.stop(10)
    joins_ends = asyncio.run(high_watermarks(broker.bootstrap, settings.joins, PARTITIONS, 15))
    letter_ends = asyncio.run(high_watermarks(broker.bootstrap, settings.dead_letters, PARTITIONS, 15))
    results = asyncio.run(_read_all(broker.bootstrap, settings.joins, joins_ends, 30))

    # A real backlog: the worker's first complete view had input left to process.
    assert sum(first.values()) > 0, (first, caught_up_s)
    assert view["dead_letters"] == 0 and sum(letter_ends.values()) == 0, (view, letter_ends)
    inner = {r["join_id"] for r in results if r["kind"] == "inner"}
    missing, wrong = backlog.expected - inner, inner - backlog.expected
    summary = (
        f"late {view['late']}, inner joins missing {len(missing)} of {len(backlog.expected)}, "
        f"unexpected {len(wrong)} (backlog {backlog.total} records, first lag {first}, "
        f"caught up in {caught_up_s:.1f} s; log {worker.log_path})"
    )
    assert view["late"] == 0, summary
    assert not missing, summary
    assert not wrong, summary
    assert len(results) == view["outputs"], (len(results), view["outputs"])
    # Records of other kinds (a left join's unmatched impressions) never stand for a
    # clicked impression.
    unmatched = {r["impression_id"] for r in results if r["kind"] != "inner"}
    assert not unmatched & backlog.clicked, sorted(unmatched & backlog.clicked)[:10]

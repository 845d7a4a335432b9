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
grace, so the input is every STRIDE-th auction of app.traffic.ad_events: the
same traffic, thinner (5 impressions and 3 clicks a second), about 30 min of it in
13,000 records. Taken in timestamp order per partition, the join drops nothing and
finds every click's impression; taken alternately from the two topics, as Faust's
round-robin does, it drops about 2,100 records as late and loses about 1,300 joins.

The second test starts a second worker while the first is catching up on a larger
backlog of the same kind: the rebalance must complete and no join may be lost.

Every wait is bounded; workers are stopped by their process ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.cluster import WorkerProcess, wait_for
from app.settings import Settings, create_topics, from_env
from app.traffic import ad_events, produce_events
from tables.testing import EmbeddedBroker, high_watermarks

# Above the sum of each test's own bounded waits (catch-up 90 s, rebalance 30 + 45 s, reads),
# so that a slow run fails on the wait that says what was slow, not on pytest's timeout.
pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

PARTITIONS = 4
IMPRESSIONS = 8_000  # and about 4,800 clicks
LARGE_IMPRESSIONS = 300_000  # ~480,000 records: many fetches per partition
# Per partition: a few fetches (the queue holds up to 8 taken from Faust), with batches of 4,000.
SMALL_MAX_HELD = 20_000
SMALL_CAP_ENV = {"TANDEM_ALIGN_MAX_HELD": str(SMALL_MAX_HELD), "TANDEM_BATCH_MAX_RECORDS": "4000"}
STRIDE = 20  # every 20th auction: impressions 200 ms apart, ~1,600 s of them
CATCH_UP_S = 90.0  # to own every partition and process the whole backlog
SETTLE_S = 2.0  # "results" unchanged this long at lag 0: nothing more is coming


@dataclasses.dataclass
class Backlog:
    total: int  # input records produced
    expected: set[str]  # join ids of the inner matches: one per click
    clicked: set[str]  # impression ids that have a click


def _settings(broker: EmbeddedBroker, unique: str) -> Settings:
    return dataclasses.replace(
        from_env(),
        broker=f"kafka://{broker.bootstrap}",
        app_id=f"tandem-backlog-{unique}",
        topic_prefix=f"b{unique}-",
        partitions=PARTITIONS,
    )


async def _load(settings: Settings, impressions_n: int = IMPRESSIONS) -> Backlog:
    """Produce the input before any worker runs, keyed and co-partitioned by auction id
    (as benchmarks/bench_worker.py does). Timestamps end about an hour ago: the worker
    rejects records more than 7 days old by the wall clock."""
    span_ms = impressions_n * STRIDE * 10 + 300_000
    base_ts = int(time.time() * 1000) - 3_600_000 - span_ms
    impressions: dict[str, str] = {}  # auction id -> impression id
    clicks: list[dict[str, Any]] = []
    events: list[tuple[str, dict[str, Any]]] = []
    for side, event in ad_events(impressions_n * STRIDE, base_ts=base_ts, every=STRIDE):
        if side == "left":
            impressions[event["auction_id"]] = event["event_id"]
        else:
            clicks.append(event)
        events.append((side, event))
    total = await produce_events(settings, events, PARTITIONS)
    assert len(impressions) == impressions_n
    expected = {f"{impressions[c['auction_id']]}|{c['event_id']}" for c in clicks}
    assert len(expected) == len(clicks) > impressions_n / 2  # one click per clicked impression
    clicked = {impressions[c["auction_id"]] for c in clicks}
    return Backlog(total, expected, clicked)


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
    """Each partition's unprocessed input (from the ad join's view), once the worker owns
    every partition and knows where each ends (as benchmarks/bench_worker.consumed)."""
    if view is None or len(view["actives"]) < PARTITIONS:
        return None
    lags = view["lag"]
    if any(lag is None for lag in lags.values()):
        return None
    return dict(lags)


def _lag_text(view: dict[str, Any]) -> str:
    """A view's input lag for a message: the known partitions' sum, and how many are not
    known yet (None: Faust has not positioned a just-assigned partition)."""
    lags = list(view["lag"].values())
    unknown = sum(lag is None for lag in lags)
    known = sum(lag for lag in lags if lag is not None)
    return f"{known}" + (f" (+{unknown} partitions not known yet)" if unknown else "")


def _catch_up(worker: WorkerProcess, timeout: float) -> tuple[int, dict[str, Any]]:
    """Poll the worker's view until its lag is 0 on every partition and its results have
    settled: returns what it had read when it first owned every partition, and the last view."""
    first: int | None = None
    settled: tuple[float, int] | None = None  # (since when, results) at lag 0
    last: dict[str, Any] | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        worker.check()  # a crashed worker fails now, with its log
        view = worker.join()
        lags = _lags(view)
        if first is None and view is not None and len(view["actives"]) == PARTITIONS:
            first = sum(view["read"].values())
        if view is not None and lags is not None:
            last = view
            if sum(lags.values()) == 0:
                now = time.monotonic()
                if settled is None or settled[1] != view["results"]:
                    settled = (now, view["results"])
                elif now - settled[0] >= SETTLE_S:
                    assert first is not None
                    return first, view
            else:
                settled = None
        time.sleep(0.1)
    raise AssertionError(f"backlog not processed within {timeout} s; last view: {last}")


@pytest.mark.parametrize(
    ("impressions", "max_held"),
    [(IMPRESSIONS, None), (LARGE_IMPRESSIONS, None), (LARGE_IMPRESSIONS, SMALL_MAX_HELD)],
    ids=["small", "large", "large-small-cap"],
)
def test_worker_started_on_a_backlog_drops_nothing_as_late(
    broker: EmbeddedBroker, unique: str, tmp_path: Path, impressions: int, max_held: int | None
) -> None:
    """Also on a backlog of many fetches: the input running ahead (clicks: a fetch of them
    covers more event time) is paused before what is held for event-time order reaches its
    cap (`TANDEM_ALIGN_MAX_HELD`), which would force records out of order and make the other
    input's late (`forced` 0 says none was). Without the pause, the large one lost ~15,000
    joins this way. With a cap a few fetches wide, what was fetched before the pause took
    effect must be kept aside too (without that, 57,370 joins were lost)."""
    settings = _settings(broker, unique)
    asyncio.run(create_topics(broker.bootstrap, settings))
    backlog = asyncio.run(_load(settings, impressions))
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
        extra_env={} if max_held is None else SMALL_CAP_ENV,
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

    # A real backlog: when the worker first owned every partition, it had input left to read.
    assert first < backlog.total, (first, backlog.total, caught_up_s)
    assert view["dead_letters"] == 0 and sum(letter_ends.values()) == 0, (view, letter_ends)
    inner = {r["join_id"] for r in results if r["kind"] == "inner"}
    missing, wrong = backlog.expected - inner, inner - backlog.expected
    summary = (
        f"late {view['late']}, inner joins missing {len(missing)} of {len(backlog.expected)}, "
        f"unexpected {len(wrong)} (backlog {backlog.total} records, read {first} at first, "
        f"caught up in {caught_up_s:.1f} s; log {worker.log_path})"
    )
    assert view["late"] == 0 and view["forced"] == 0, summary
    assert not missing, summary
    assert not wrong, summary
    assert len(results) == view["results"], (len(results), view["results"])
    # Records of other kinds (a left join's unmatched impressions) never stand for a
    # clicked impression.
    unmatched = {r["impression_id"] for r in results if r["kind"] != "inner"}
    assert not unmatched & backlog.clicked, sorted(unmatched & backlog.clicked)[:10]


# A rebalance in the middle of the catch-up: a backlog that takes one worker long enough
# for a second one to start and join the group (a Faust process starts in a few seconds,
# the embedded broker holds its JoinGroup for one more). One worker joins about 40,000
# records a second here (docs/bench/worker.md), and w2's JoinGroup comes about 5 s after
# w1 starts joining: the backlog lasts it about 12 s.
REBALANCE_IMPRESSIONS = 300_000  # and about 180,000 clicks
RESTORED = re.compile(r"tandem: join '[^']+' restored in ")
REBALANCE_S = 30.0  # from w2's start until w1 is assigned again (normally a few seconds)
REBALANCE_WAIT_S = 45.0  # then both workers own partitions, all caught up and settled
HELD_DROPPED = re.compile(r"tandem: join '[^']+': (\d+) held records left to be read again")


def _dropped(worker: WorkerProcess) -> list[int]:
    """Records held at each revocation or stop the worker logged (`JoinTask.quiesce`):
    left unjoined and uncommitted, to be read again from the committed offsets."""
    text = worker.log_path.read_text(errors="replace")
    return [int(n) for n in HELD_DROPPED.findall(text)]


def _both_caught_up(
    workers: list[WorkerProcess], timeout: float
) -> tuple[dict[str, dict[str, Any] | None], bool]:
    """Poll until every partition is active on exactly one worker, each worker owns some,
    every owner's lag is 0 and the total results stay unchanged for SETTLE_S. Returns the
    last views and whether that happened within `timeout`."""
    settled: tuple[float, int] | None = None
    last: dict[str, dict[str, Any] | None] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker in workers:
            worker.check()
        last = {w.name: w.join() for w in workers}
        done = all(v is not None and v["actives"] for v in last.values())
        if done:
            owned = sorted(p for v in last.values() for p in v["actives"])  # type: ignore[union-attr]
            lags = [lag for v in last.values() for lag in v["lag"].values()]  # type: ignore[union-attr]
            done = owned == list(range(PARTITIONS)) and all(lag == 0 for lag in lags)
            done = done and all(v["last_rebalance"]["seconds"] is not None for v in last.values())  # type: ignore[index]
        if done:
            results = sum(v["results"] for v in last.values())  # type: ignore[index]
            now = time.monotonic()
            if settled is None or settled[1] != results:
                settled = (now, results)
            elif now - settled[0] >= SETTLE_S:
                return last, True
        else:
            settled = None
        time.sleep(0.2)
    return last, False


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
def test_rebalance_mid_backlog_loses_no_join_and_does_not_hang(
    broker: EmbeddedBroker, unique: str, tmp_path: Path, protocol: str
) -> None:
    """A second worker joins while the first is catching up on a backlog: the group's
    rounds reach the first with records held for event-time order. Before Faust commits for
    a round, the join runtime finishes the batch in flight and leaves its held records
    unjoined and uncommitted (`JoinTask.quiesce`), to be read again from the committed
    offsets; the rebalance must complete, the two workers must finish the backlog between
    them, and every click's join must be in the output (duplicates allowed: at-least-once).
    `late` is reported, not asserted: a click dropped as late loses its join, and that the
    set of joins catches.

    Both protocols: under the cooperative one the first worker keeps the partitions that
    stay through the rounds, with what it holds of them, and drops only what it held of the
    partitions it hands over."""
    settings = _settings(broker, unique)
    asyncio.run(create_topics(broker.bootstrap, settings))
    backlog = asyncio.run(_load(settings, REBALANCE_IMPRESSIONS))

    def worker(name: str, host: str) -> WorkerProcess:
        return WorkerProcess(
            name,
            host,
            "rack-1",
            broker.bootstrap,
            settings.app_id,
            tmp_path,
            standby_replicas=0,
            partitions=PARTITIONS,
            topic_prefix=settings.topic_prefix,
            extra_env={"TANDEM_REBALANCE_PROTOCOL": protocol},
        )

    w1, w2 = worker("w1", "host-a"), worker("w2", "host-b")
    started = time.monotonic()
    w1.start()
    try:
        # w1 alone, its partitions ready: w2 starts now. Read from w1's log, not its view:
        # a batch of the catch-up can keep w1's web server from answering for seconds.
        def ready() -> bool:
            w1.check()
            return bool(RESTORED.search(w1.log_path.read_text(errors="replace")))

        assert wait_for(ready, CATCH_UP_S, interval=0.05), f"w1 never got its partitions: {w1.log_path}"
        w2_started = time.monotonic()
        w2.start()
        mid = w1.join() or {"lag": {}, "held": None}  # what w1 had left when w2 started
        # Until w1 is assigned again. Before its revocation goes on, it drops what it held;
        # a batch that never finished would keep the consumer's wait_empty, and with it the
        # whole group's rebalance, waiting.
        before, stuck = mid, 0  # w1's last view before the revocation; what it holds since
        deadline = time.monotonic() + REBALANCE_S
        while True:
            w1.check()
            w2.check()
            view = w1.join()
            if view is not None:
                if view["rebalances"] >= 2:
                    break
                if not _dropped(w1):
                    before = view
                else:
                    stuck = view["held"]
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"w1 not assigned again within {REBALANCE_S} s of w2's start (a rebalance "
                    f"takes a few): it held {before['held']} records (lag "
                    f"{_lag_text(before)}) before the revocation, dropped "
                    f"{_dropped(w1)} records then, and still holds "
                    f"{None if view is None else view['held']} (the consumer's wait_empty waits "
                    f"for the batch in flight); log {w1.log_path}"
                )
            time.sleep(0.05)
        rebalanced_s = time.monotonic() - w2_started
        final, caught_up = _both_caught_up([w1, w2], REBALANCE_WAIT_S)
        done_s = time.monotonic() - started
        dropped = _dropped(w1) + _dropped(w2)  # before the stops drop anything
    finally:
        w2.stop(10)
        w1.stop(10)
    joins_ends = asyncio.run(high_watermarks(broker.bootstrap, settings.joins, PARTITIONS, 15))
    letter_ends = asyncio.run(high_watermarks(broker.bootstrap, settings.dead_letters, PARTITIONS, 15))
    results = asyncio.run(_read_all(broker.bootstrap, settings.joins, joins_ends, 30))

    inner = [r["join_id"] for r in results if r["kind"] == "inner"]
    missing, wrong = backlog.expected - set(inner), set(inner) - backlog.expected
    v1, v2 = final["w1"], final["w2"]
    # Judge the output even when the workers did not finish: what is missing says why.
    assert caught_up and v1 is not None and v2 is not None, (
        f"not shared and caught up within {REBALANCE_WAIT_S} s; inner joins missing "
        f"{len(missing)} of {len(backlog.expected)}; last views {final}; logs {w1.log_path}, {w2.log_path}"
    )
    summary = (
        f"backlog {backlog.total} records; w2 started at w1's lag "
        f"{_lag_text(mid)}, "
        f"held {mid['held']}; w1 before the revocation: lag {_lag_text(before)}, "
        f"held {before['held']}; held records dropped at the revocation {dropped}; "
        f"held after that {stuck}; w1 assigned again {rebalanced_s:.1f} s after w2 started; "
        f"forced w1 {v1['forced']} w2 {v2['forced']}; late {v1['late'] + v2['late']} "
        f"(w1 {v1['late']}, w2 {v2['late']}); actives w1 {v1['actives']} w2 {v2['actives']}; "
        f"inner joins missing {len(missing)} of {len(backlog.expected)}, unexpected "
        f"{len(wrong)}, duplicates {len(inner) - len(set(inner))}; all done in {done_s:.1f} s "
        f"(logs {w1.log_path}, {w2.log_path})"
    )
    print(summary)
    # The rebalance completed: both own partitions, w1 was assigned twice, none exited.
    assert v1["actives"] and v2["actives"], summary
    assert v1["rebalances"] >= 2, summary
    # And it came mid-backlog: w1 held records at a round, or had input left to join when the
    # group's first round with w2 reached it. (w2 may have nothing left to join when it takes
    # its partitions: it takes them once its warm-ups caught up, KIP-441, and w1 goes on
    # joining until then; under cooperative rounds w1 drops nothing of what it keeps.)
    behind = sum(lag for lag in before["lag"].values() if lag is not None)
    assert sum(dropped) > 0 or behind > 0, summary
    assert v1["dead_letters"] == v2["dead_letters"] == 0 and sum(letter_ends.values()) == 0, summary
    assert not wrong, summary
    assert not missing, summary

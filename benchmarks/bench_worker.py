"""Join throughput of one worker (`faust -A app worker`) against a bare consumer and
the raw consume rate of the same worker on the same topics, measured in the same run.

    .venv/bin/python -m benchmarks.bench_worker --impressions 100000 --rounds 3

Input: impressions and their clicks (app.traffic.ad_events, 60 % clicked,
in event time with up to 2 s of disorder), loaded once, keyed and co-partitioned by
auction id. Each pipeline is one process started fresh (new app id, so a new consumer
group reading from the start and an empty state) on the embedded broker:

- bare consumer: one aiokafka consumer assigned every partition of both topics,
  decoding each value with orjson, nothing else (no Faust, no group): the floor.
- bare confluent-kafka: the same with confluent-kafka (librdkafka) instead of aiokafka.
- bare join, bare join+changelog, bare join+changelog+rocksdb: the floor of any join
  of these topics in Python, with no framework (`join_bare`): the bare consumer pairing
  each click with its impression by key (no window, expiry, validation, event-time
  order, handler or Faust), producing each pair as whole acknowledged record batches;
  then also every input record to a changelog; then also keeping the state in RocksDB
  (a get per lookup, a write batch per fetch) instead of dicts.
- consume-only: the reference worker whose join runner only moves the offsets it may
  commit (benchmarks/consume_only_app.py): same consumer, fetches, settings,
  assignor and state start-up. Its rate is what the runtime can read.
- tandem: the reference worker: validation, dead letters, event-time alignment of
  the two inputs, the windowed join on RocksDB, results produced and acknowledged,
  changelog and state committed.
- tandem (pure Python): the same worker with TANDEM_PURE_PYTHON=1: its per-record loop
  and input check run as Python, not compiled (tables/operators/_fastjoin.pyx, _fastcheck.pyx).
- tandem (2 workers): two such workers of one group (one app id), two partitions each, timed
  together from the last poll that saw each own its partitions with nothing read (a run where
  one of them read before the other was assigned is timed from the first poll that saw both);
  CPU is both processes', peak RSS the larger.
- faust-table: the join written the usual way on Faust's own tables
  (benchmarks/faust_table_app.py): one Table keyed by auction id, one event at a
  time, Faust's RocksDB store and changelog; no expiry, no event-time order.
- quix join_interval: Quix Streams' interval join of the same topics with the same window
  (a click within 10 minutes after its impression, records kept for the window plus the
  minute of grace), results produced as JSON (benchmarks/quix_join.py, in an environment of
  its own: benchmarks/quix_env.py). One process, its consumer group reading from the start.
- bytewax join_window: Bytewax (a Rust core) joining the same topics with its own operators
  (bytewax.connectors.kafka, `join_window` on a session window of the same 10 minutes: the
  closest of its windows to an interval join, equal on this input; how it differs:
  benchmarks/bytewax_join.py), results produced as JSON, in an environment of its own
  (benchmarks/bytewax_env.py). One process, one worker, reading from the start to the end.

The rate counts from the first poll that saw the worker ready (it owns every partition,
restored; normally nothing read yet) to the first that saw every record read and, for
the two joins, every result out (polls of the worker's /tandem/ view every 0.1 s: its
`read` and `results` counters; a join that ends with another count fails), and the worker's CPU time
between the same two polls: the fetches, the consumer thread's decoding and the join
all fall inside, as for the bare consumer, which times itself from its first fetch
request to its last record. On a small input the fixed cost from ready to the first
fetch (Faust resuming its flow, one fetch wait) weighs on the fast pipelines: the lead's
measurements use the default size or more. Rounds alternate the pipelines; the
best round of each counts; peak RSS is the largest of the rounds (each process's VmHWM, read at
its end). Results: docs/bench/worker.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rocksdict import Options, Rdict, WriteBatch

from app.cluster import REPO, WorkerProcess
from app.settings import JOIN_NAME, Settings, create_topics, from_env
from app.traffic import ad_events, produce_events
from benchmarks.bytewax_env import run_bytewax
from benchmarks.quix_env import run_quix
from tables.kafka.batches import start_sending
from tables.kafka.topics import changelog_configs
from tables.kafka.topics import create_topics as create_join_topics
from tables.testing import FAST_GROUP_SETTINGS, EmbeddedBroker

PARTITIONS = 4
BARE = "bare consumer"
BARE_CK = "bare confluent-kafka"
QUIX = "quix join_interval"
BYTEWAX = "bytewax join_window"
PEERS = (QUIX, BYTEWAX)  # other frameworks' joins, each in its own environment
BARE_JOIN = "bare join"
BARE_DURABLE = "bare join+changelog"
BARE_ROCKSDB = "bare join+changelog+rocksdb"
PURE = "tandem (pure Python)"  # the same worker without its compiled parts (TANDEM_PURE_PYTHON=1)
TWO = "tandem (2 workers)"  # two workers of one group sharing the partitions
PIPELINES = {
    BARE: "",
    BARE_CK: "",
    BARE_JOIN: "",
    BARE_DURABLE: "",
    BARE_ROCKSDB: "",
    "consume-only": "benchmarks.consume_only_app",
    "tandem": "app",
    PURE: "app",
    TWO: "app",
    "faust-table": "benchmarks.faust_table_app",
    QUIX: "",
    BYTEWAX: "",
}
# Environment of a worker pipeline beyond the run's own settings.
PIPELINE_ENV = {PURE: {"TANDEM_PURE_PYTHON": "1"}}
WORKERS = {TWO: 2}  # worker processes of a pipeline (1 unless said)
# The pipelines that produce results: timed until all are out.
JOINING = ("tandem", PURE, TWO, "faust-table", BARE_JOIN, BARE_DURABLE, BARE_ROCKSDB, *PEERS)
BARE_PIPELINES = {
    BARE: "read", BARE_CK: "confluent", BARE_JOIN: "join", BARE_DURABLE: "durable", BARE_ROCKSDB: "rocksdb"
}  # fmt: skip
# Input topics kept forever, said so at creation: Quix reads `retention.ms` and
# `retention.bytes` of its input topics, and tansu reports only what a topic was created with.
KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}
POLL_S = 0.1
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def peak_rss_kb(pid: int) -> int:
    """The largest resident set a live process has had (VmHWM, kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def own_peak_rss_kb() -> int:
    """This process's peak resident set (kB): VmHWM, not ru_maxrss, which Linux carries over
    an exec from the parent (a child of a large benchmark would report the benchmark's)."""
    return peak_rss_kb(os.getpid())


async def create_inputs(bootstrap: str, topics: list[str], partitions: int) -> None:
    """Topics with one partition count, kept forever (`KEEP_FOREVER`: what Quix needs to read)."""
    counts, configs = dict.fromkeys(topics, partitions), dict.fromkeys(topics, KEEP_FOREVER)
    await create_join_topics(bootstrap, counts, configs)


async def load_inputs(settings: Settings, impressions: int) -> int:
    """Produce the input once; timestamps end an hour ago (the worker rejects records
    more than 7 days old by the wall clock)."""
    base_ts = int(time.time() * 1000) - 3_600_000 - impressions * 10
    return await produce_events(settings, ad_events(impressions, base_ts=base_ts), PARTITIONS)


def join_part(view: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ad join's fields: `joins["ad-join"]` of a worker's view, or a flat view as is."""
    if view is None:
        return None
    joins = view.get("joins")
    return dict(joins[JOIN_NAME]) if isinstance(joins, dict) else view


def results_out(view: dict[str, Any] | None) -> int:
    """Join results handled so far (0 in a view without them)."""
    return int((join_part(view) or {}).get("results", 0))


def owns_all(view: dict[str, Any] | None) -> bool:
    """The worker owns every partition of the join (restored or not) and has read nothing."""
    join = join_part(view)
    if join is None or len(join["actives"]) < PARTITIONS:
        return False
    return not sum(join.get("read", {}).values())


def consumed(view: dict[str, Any] | None, total: int) -> int | None:
    """Input records the worker has read, once it owns every partition: its `read` counters
    (0 before its first fetch), or, in a view without them, the input less its lag."""
    join = join_part(view)
    if join is None or len(join["actives"]) < PARTITIONS or join.get("restoring"):
        return None
    if "read" in join:
        return int(sum(join["read"].values()))
    lags = join["lag"].values()
    if any(lag is None for lag in lags):
        return None
    return total - sum(lags)


async def read_bare(bootstrap: str, topics: list[str], partitions: int) -> dict[str, float]:
    """Read every record of `topics` with one aiokafka consumer, orjson-decoding each value;
    records, wall and CPU seconds from the first fetch request to the last record (a fetch
    can hold a whole small input, so there is no later first poll to start from)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=FAST_GROUP_SETTINGS["fetch_max_wait_ms"],
    )
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while True:
            fetched = await consumer.getmany(timeout_ms=200)
            for found in fetched.values():
                for record in found:
                    orjson.loads(record.value)
                records += len(found)
            if not fetched and await _at_end(consumer, tps):
                break
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        await consumer.stop()
    return {"records": records, "wall": wall, "cpu": cpu}


def read_confluent(bootstrap: str, topics: list[str], partitions: int) -> dict[str, float]:
    """`read_bare` with confluent-kafka: a consumer assigned every partition from its start,
    `consume()` in batches, orjson-decoding each value, until each partition said it is at its
    end (librdkafka's partition EOF comes from the fetch's high watermark)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError
    from confluent_kafka import TopicPartition as Partition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bare-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "fetch.wait.max.ms": FAST_GROUP_SETTINGS["fetch_max_wait_ms"],
    })  # fmt: skip
    try:
        consumer.assign([Partition(t, p, OFFSET_BEGINNING) for t in topics for p in range(partitions)])
        at_end: set[tuple[str, int]] = set()
        records = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while len(at_end) < len(topics) * partitions:
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                error = message.error()
                if error is None:
                    orjson.loads(message.value())
                    records += 1
                    at_end.discard((message.topic(), message.partition()))
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add((message.topic(), message.partition()))
                else:
                    raise RuntimeError(f"confluent-kafka: {error}")
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        consumer.close()
    return {"records": records, "wall": wall, "cpu": cpu}


async def _at_end(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> bool:
    for tp in tps:
        high = consumer.highwater(tp)
        if high is None or await consumer.position(tp) < high:
            return False
    return True


class DictSides:
    """The bare join's state in memory: per side, join key -> decoded value."""

    def __init__(self) -> None:
        self.sides: list[dict[bytes, Any]] = [{}, {}]

    def get(self, side: int, key: bytes) -> Any:
        return self.sides[side].get(key)

    def put_all(self, side: int, records: list[tuple[bytes, bytes, Any]]) -> None:
        self.sides[side].update((key, value) for key, _, value in records)


class RocksSides:
    """The bare join's state in one RocksDB (rocksdict) database: a get per lookup, one
    write batch of the raw values per fetch and side; no window, no index, no checkpoint."""

    def __init__(self, path: str) -> None:
        self.db = Rdict(path, options=Options(raw_mode=True))
        self.cached: list[dict[bytes, Any]] = [{}, {}]  # written in this fetch, not yet in the db

    def get(self, side: int, key: bytes) -> Any:
        found = self.cached[side].get(key)
        if found is not None:
            return found
        raw = self.db.get(b"%d" % side + key)
        return None if raw is None else orjson.loads(raw)

    def put_all(self, side: int, records: list[tuple[bytes, bytes, Any]]) -> None:
        batch = WriteBatch(raw_mode=True)
        prefix = b"%d" % side
        for key, raw, _ in records:
            batch.put(prefix + key, raw)
        self.db.write(batch)


async def join_bare(
    bootstrap: str, topics: list[str], output: str, changelog: str | None, state_dir: str | None
) -> dict[str, Any]:
    """The least any join of these topics does, in Python, with no framework: read both
    topics, decode, pair each click with its impression (no window, no expiry, no
    validation, no order; in two dicts, or with `state_dir` in RocksDB), produce each pair
    to `output` and, with `changelog`, every input record to a changelog, as whole record
    batches acknowledged after each fetch (a join that commits must wait for them)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=FAST_GROUP_SETTINGS["fetch_max_wait_ms"],
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1)
    await consumer.start()
    await producer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        state: DictSides | RocksSides = DictSides() if state_dir is None else RocksSides(state_dir)
        records = results = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while True:
            fetched = await consumer.getmany(timeout_ms=200)
            acks: list[tuple[object, int]] = []
            for tp, found in fetched.items():
                side = topics.index(tp.topic)
                pairs: list[tuple[bytes | None, bytes | None]] = []
                decoded: list[tuple[bytes, bytes, Any]] = []
                for record in found:
                    value = orjson.loads(record.value)
                    decoded.append((record.key, record.value, value))
                    other = state.get(1 - side, record.key)
                    if other is not None:
                        left, right = (value, other) if side == 0 else (other, value)
                        pairs.append((record.key, orjson.dumps({"left": left, "right": right})))
                state.put_all(side, decoded)
                records += len(found)
                results += len(pairs)
                acks += await start_sending(producer, output, tp.partition, pairs)
                if changelog is not None:
                    logged = [(r.key, r.value) for r in found]
                    acks += await start_sending(producer, changelog, tp.partition, logged)
            for future, _ in acks:
                await future  # type: ignore[misc]
            if not fetched and await _at_end(consumer, tps):
                break
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        await consumer.stop()
        await producer.stop()
    return {"records": records, "wall": wall, "cpu": cpu, "results": results}


def run_bare(name: str, bootstrap: str, settings: Settings, total: int, timeout: float) -> dict[str, Any]:
    """The bare consumer or a bare join, in a process of its own (its CPU apart from the
    benchmark's)."""
    mode = BARE_PIPELINES[name]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_worker", "--bare", mode, bootstrap,
         settings.impressions, settings.clicks, settings.joins, floor_changelog(settings)],  # fmt: skip
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=True,
    )  # fmt: skip
    run: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if run["records"] != total:
        raise RuntimeError(f"{name}: read {run['records']} records, not {total}")
    return {"results": 0, **run, "late": 0, "forced": 0}


def floor_changelog(settings: Settings) -> str:
    return f"{settings.topic_prefix}floor-changelog"


def quix_output(settings: Settings) -> str:
    return f"{settings.topic_prefix}quix-joins"


def bytewax_output(settings: Settings) -> str:
    return f"{settings.topic_prefix}bytewax-joins"


def run_quix_join(
    settings: Settings, total: int, joins: int, run_dir: Path, timeout: float
) -> dict[str, Any]:
    """Quix Streams' interval join of the two topics, the reference app's window: a click
    from 0 to 10 minutes after its impression (`join_interval` looks `forward_ms` back from a
    right record), each record kept for the window plus the minute of grace."""
    run_dir.mkdir(parents=True, exist_ok=True)
    uid = uuid.uuid4().hex[:6]
    config = {
        "mode": "interval", "bootstrap": settings.broker.removeprefix("kafka://"),
        "group": f"wb-quix-{uid}", "state_dir": str(run_dir / f"quix-{uid}"),
        "left": settings.impressions, "right": settings.clicks, "output": quix_output(settings),
        "total": total, "expected": joins, "backward_ms": 0, "forward_ms": 600_000, "grace_ms": 660_000,
    }  # fmt: skip
    run = run_quix(config, timeout)
    if run["records"] != total:
        raise RuntimeError(f"{QUIX}: read {run['records']} records, not {total}")
    return {**run, "late": 0, "forced": 0}


def run_bytewax_join(settings: Settings, total: int, joins: int, timeout: float) -> dict[str, Any]:
    """Bytewax's window join of the two topics on a session window of the reference app's
    10 minutes, records waited for the window plus the minute of grace; each result checked
    against the interval join's condition (a click from 0 to 10 minutes after its impression)."""
    config = {
        "bootstrap": settings.broker.removeprefix("kafka://"), "left": settings.impressions,
        "right": settings.clicks, "output": bytewax_output(settings), "total": total, "expected": joins,
        "after_ms": settings.join_after_ms, "grace_ms": settings.join_grace_ms,
    }  # fmt: skip
    run = run_bytewax(config, timeout)
    if run["records"] != total or run["outside"]:
        outside = f"{run['outside']} results outside the window"
        raise RuntimeError(f"{BYTEWAX}: read {run['records']} of {total} records, {outside}")
    return {**run, "late": 0, "forced": 0}


def bare_main(
    mode: str, bootstrap: str, left: str, right: str, output: str, changelog: str
) -> dict[str, Any]:
    """One bare pipeline's run: `read` (the bare consumer), `confluent` (the same with
    confluent-kafka), `join`, `durable` or `rocksdb` (join_bare); with its peak RSS."""
    return {**_bare_run(mode, bootstrap, left, right, output, changelog), "peak_rss_kb": own_peak_rss_kb()}


def _bare_run(
    mode: str, bootstrap: str, left: str, right: str, output: str, changelog: str
) -> dict[str, Any]:
    if mode == "read":
        return asyncio.run(read_bare(bootstrap, [left, right], PARTITIONS))
    if mode == "confluent":
        return read_confluent(bootstrap, [left, right], PARTITIONS)
    logged = changelog if mode in ("durable", "rocksdb") else None
    if mode != "rocksdb":
        return asyncio.run(join_bare(bootstrap, [left, right], output, logged, None))
    with tempfile.TemporaryDirectory(prefix="bare-join-") as state_dir:
        return asyncio.run(join_bare(bootstrap, [left, right], output, logged, state_dir))


async def run_pipeline(
    name: str, base: Settings, total: int, joins: int, run_dir: Path, timeout: float
) -> dict[str, Any]:
    """One pipeline's run, timed until every record is read and, for a join, every
    result is out (`joins` pairs): records read but still held, or joined but not yet
    handled, are work not done."""
    if name in BARE_PIPELINES or name in PEERS:
        if name == QUIX:
            run = await asyncio.to_thread(run_quix_join, base, total, joins, run_dir, timeout)
        elif name == BYTEWAX:
            run = await asyncio.to_thread(run_bytewax_join, base, total, joins, timeout)
        else:
            bootstrap = base.broker.removeprefix("kafka://")
            run = await asyncio.to_thread(run_bare, name, bootstrap, base, total, timeout)
        if name in JOINING and run["results"] != joins:
            raise RuntimeError(f"{name}: {run['results']:,} results, expected {joins:,}")
        return run
    uid = uuid.uuid4().hex[:6]
    slug = "".join(c if c.isalnum() else "-" for c in name)  # topic names and paths
    settings = dataclasses.replace(base, app_id=f"wb-{slug}-{uid}")
    await create_topics(settings.broker.removeprefix("kafka://"), settings)
    workers = [
        WorkerProcess(
            f"{slug}-{uid}-{n}",
            f"host-{n}",
            "rack-1",
            settings.broker.removeprefix("kafka://"),
            settings.app_id,
            run_dir,
            standby_replicas=0,
            partitions=PARTITIONS,
            topic_prefix=settings.topic_prefix,
            app_module=PIPELINES[name],
            extra_env=dict(PIPELINE_ENV.get(name, {})),
        ).start()
        for n in range(WORKERS.get(name, 1))
    ]
    first: tuple[float, int, float] | None = None
    last: tuple[float, int, float] | None = None
    first_read_at: float | None = None  # wall clock of the first poll that saw a record read
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for worker in workers:
                worker.check()
            view = combined([worker.view() for worker in workers])
            now, read = time.perf_counter(), consumed(view, total)
            cpu = sum(cpu_seconds(worker.process.pid) for worker in workers if worker.process is not None)
            if first_read_at is None and owns_all(view):
                # From the last poll that saw it own every partition with nothing read yet (still
                # restoring, at most a poll before its first fetch): the view may answer its
                # next poll only after tens of thousands of records are read (the first batches
                # hold the loop), and a window started there times their join, not their reading.
                first = (now, 0, cpu)
            if read is not None:
                first = first or (now, read, cpu)
                last = (now, read, cpu)
                if read > 0 and first_read_at is None:
                    first_read_at = time.time()
                if read >= total and (name not in JOINING or results_out(view) >= joins):
                    break
            await asyncio.sleep(POLL_S)
        else:
            raise RuntimeError(f"{name}: not done in {timeout} s (last: {last})")
        join = join_part(view) or {}
        results, late, forced = join.get("results", 0), join.get("late", 0), join.get("forced", 0)
        peak = max(peak_rss_kb(worker.process.pid) for worker in workers if worker.process is not None)
    finally:
        for worker in workers:
            worker.stop(10)
    if name in JOINING and results != joins:
        raise RuntimeError(f"{name}: {results:,} results, expected {joins:,}")
    assert first is not None and last is not None
    records, wall, cpu = last[1] - first[1], last[0] - first[0], last[2] - first[2]
    if records <= 0 or wall <= 0:
        raise RuntimeError(f"{name}: read everything between two polls; give it more --impressions")
    return {
        "records": records, "wall": wall, "cpu": cpu, "results": results, "late": late, "forced": forced,
        "start_s": _assigned_to_first_read(join, first_read_at), "peak_rss_kb": peak,
    }  # fmt: skip


def combined(views: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The ad join's fields over several workers of one group, flat (join_part takes it as is):
    partitions owned and counters summed. None until each worker owns a partition, so a run
    of several is timed only once they share the input (not while one reads it all)."""
    joins = [join_part(view) for view in views]
    if len(joins) == 1:
        return joins[0]
    if any(join is None or not join["actives"] for join in joins):
        return None
    found = [join for join in joins if join is not None]
    return {
        "actives": sorted(p for join in found for p in join["actives"]),
        "restoring": {p: r for join in found for p, r in join["restoring"].items()},
        "read": {side: sum(join["read"][side] for join in found) for side in ("left", "right")},
        **{name: sum(join[name] for join in found) for name in ("results", "late", "forced")},
        "rebalance_history": max((join["rebalance_history"] for join in found), key=lambda h: h[-1]["at"]),
    }


def _start_note(run: dict[str, Any]) -> str:
    start = run.get("start_s")
    return f", first record read {start:.2f} s after the assignment" if start is not None else ""


def _assigned_to_first_read(join: dict[str, Any], first_read_at: float | None) -> float | None:
    """Seconds from the worker's last assignment (its view's rebalance history) to the
    first poll that saw a record read (within the 0.1 s poll); None if either is unknown."""
    history = join.get("rebalance_history") or []
    if not history or first_read_at is None:
        return None
    return first_read_at - float(history[-1]["at"])


@dataclasses.dataclass
class Tally:
    """A pipeline's figures over the rounds: best rate and CPU, largest peak RSS, results."""

    wall_rate: float = 0.0
    cpu_us: float = float("inf")
    peak_rss_kb: int = 0
    results: list[int] = dataclasses.field(default_factory=list)

    def add(self, run: dict[str, Any]) -> tuple[float, float]:
        wall_rate, cpu_us = run["records"] / run["wall"], run["cpu"] / run["records"] * 1e6
        self.wall_rate, self.cpu_us = max(self.wall_rate, wall_rate), min(self.cpu_us, cpu_us)
        self.peak_rss_kb = max(self.peak_rss_kb, int(run.get("peak_rss_kb") or 0))
        self.results.append(int(run["results"]))
        return wall_rate, cpu_us


async def bench(impressions: int, rounds: int, timeout: float, pipelines: list[str]) -> list[str]:
    best: dict[str, Tally] = {}
    runs: list[str] = []
    per_round: list[dict[str, float]] = []  # wall rate of each pipeline, per round
    with (
        tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp,
        EmbeddedBroker(log_dir=Path(tmp) / "broker") as broker,
    ):
        base = dataclasses.replace(
            from_env(), broker=f"kafka://{broker.bootstrap}", topic_prefix="wb-", partitions=PARTITIONS
        )
        outputs = [quix_output(base), bytewax_output(base)]
        await create_inputs(broker.bootstrap, [*base.topics(), *outputs], PARTITIONS)
        logged = floor_changelog(base)
        await create_join_topics(broker.bootstrap, {logged: PARTITIONS}, {logged: changelog_configs(None)})
        total = await load_inputs(base, impressions)
        joins = total - impressions  # every click has its impression: one inner result each
        for n in range(rounds):
            per_round.append({})
            for name in pipelines:
                run = await run_pipeline(name, base, total, joins, Path(tmp) / f"r{n}", timeout)
                wall_rate, cpu_us = best.setdefault(name, Tally()).add(run)
                runs.append(
                    f"{name} round {n + 1}: {wall_rate:,.0f}/s wall, {cpu_us:.1f} µs CPU per record "
                    f"({run['records']:,} records timed), {run['results']:,} results, {run['late']:,} "
                    f"late, {run['forced']:,} released before their turn, peak RSS "
                    f"{run.get('peak_rss_kb', 0) / 1024:,.0f} MB" + _start_note(run)
                )
                per_round[-1][name] = wall_rate
                print(runs[-1], file=sys.stderr, flush=True)  # as it goes: a later run may fail
    return report(best, per_round, runs, total, joins, impressions, rounds)


def report(
    best: dict[str, Tally],
    per_round: list[dict[str, float]],
    runs: list[str],
    total: int,
    joins: int,
    impressions: int,
    rounds: int,
) -> list[str]:
    """The table: rates and CPU per record, each as a ratio against every alternative; peak
    RSS; results against those expected (a join's; a consumer makes none)."""
    others = [o for o in (BARE, "consume-only", "faust-table") if o in best]
    head = " | ".join(f"vs {o}" for o in others)
    rows = []
    for name, tally in best.items():
        walls = " | ".join(f"{tally.wall_rate / best[o].wall_rate:.2f}" for o in others)
        cpus = " | ".join(f"{tally.cpu_us / best[o].cpu_us:.2f}" for o in others)
        got = "/".join(f"{r:,}" for r in sorted(set(tally.results)))
        results = f"{got} of {joins:,}" if name in JOINING else "-"
        rows.append(
            f"| {name} | {tally.wall_rate:,.0f} | {walls} | {tally.cpu_us:.1f} | {cpus} | "
            f"{tally.peak_rss_kb / 1024:,.0f} | {results} |"
        )

    def ratios(a: str, b: str) -> str:
        if a not in best or b not in best:
            return "not run"
        return ", ".join(f"{r[a] / r[b]:.2f}" for r in per_round)

    return [
        f"Input: {total:,} records ({impressions:,} impressions and their clicks), {PARTITIONS} "
        f"partitions, one process per pipeline, embedded tansu broker; best of {rounds} "
        f"alternating rounds; load average at the end {os.getloadavg()[0]:.2f}.",
        "",
        f"| pipeline | records/s (wall) | {head} | µs CPU per record | {head} | peak RSS MB | results |",
        "| --- |" + " ---: |" * (4 + 2 * len(others)),
        *rows,
        "",
        "Rates: higher is faster (a ratio above 1 beats the alternative); CPU per record: a "
        "ratio above 1 costs more than the alternative.",
        f"Within each round (wall), tandem / {BARE}: {ratios('tandem', BARE)}; "
        f"tandem / consume-only: {ratios('tandem', 'consume-only')}; "
        f"tandem / {QUIX}: {ratios('tandem', QUIX)}; "
        f"tandem / {BYTEWAX}: {ratios('tandem', BYTEWAX)}; "
        f"tandem / faust-table: {ratios('tandem', 'faust-table')}.",
        "",
        *(f"- {line}" for line in runs),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impressions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    parser.add_argument(
        "--pipelines",
        default=",".join(PIPELINES),
        help=f"comma-separated, in the order run each round (default: all of {', '.join(PIPELINES)})",
    )
    parser.add_argument("--bare", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:  # the bare consumer's own process (run_bare)
        print(json.dumps(bare_main(*args.bare)))
        return
    pipelines = [name.strip() for name in args.pipelines.split(",") if name.strip()]
    unknown = [name for name in pipelines if name not in PIPELINES]
    if unknown or not pipelines:
        parser.error(f"unknown pipeline(s) {unknown}; known: {', '.join(PIPELINES)}")
    print("\n".join(asyncio.run(bench(args.impressions, args.rounds, args.timeout, pipelines))))


if __name__ == "__main__":
    main()

"""Testing a join without a broker: `JoinTestDriver`, in the idiom of Faust's
`agent.test_context()` and Kafka Streams' `TopologyTestDriver`.

    from tables.testing import JoinTestDriver

    async with JoinTestDriver(paid) as t:               # paid: what @join returned
        await t.send(orders, key=7, value=Order(...), timestamp=1_000)
        await t.send(payments, key=7, value=Payment(...), timestamp=2_000)
        await t.advance(stream_time=10_000)               # or: await t.close_inputs()
        assert [s.value for s in t.sent(paid_orders)] == [...]
        assert t.dead_letters() == []
        assert t.table("totals")["alice"] == 42
        assert t.counters()["late"] == 0

It runs the worker's own join task (`JoinTask` and its `Intake`: tables/runtime/task.py), with
the broker replaced by the in-memory ports of tables/testing/memory.py: the join's
declaration checks, its inputs' codecs and dead-letter rules (the partitioner check
included), event-time alignment, pausing and re-read skipping, its operator (compiled where
built, else pure Python) over its real state in RocksDB files (a temporary directory),
restored from the changelog by the worker's restore code, the app's handler as its own
supervised task (a result that makes it raise is dead-lettered), the handler's `send_soon`,
its Faust `topic.send()`s and the Faust tables it updates (each driver gives them a new store
in memory), the output path that builds record batches, and the changelog written before
the state. Each `send` is fetched and joined at once, as one batch, every input then read to
its end: records are joined in the order sent (`batched()`: several sends as one fetch,
joined in event-time order across the inputs). Deterministic: the same sends in the same
order give the same results.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from aiokafka import TopicPartition
from faust.tables.base import Collection
from faust.types import TP, AppT, TopicT

from assignor import internals
from tables.api import runtime_of
from tables.kafka.handler_sends import collect_handler_sends
from tables.operators.base import Match, Side
from tables.records.codecs import MAX_TS_MS, timestamp_ms
from tables.records.partitioners import partition_for
from tables.runtime.global_table import VALUE, GlobalTable
from tables.runtime.rekeyer import Rekeyer
from tables.runtime.results import JoinResult, Serializers
from tables.runtime.stats import JoinStats
from tables.runtime.task import JoinTask
from tables.settings import RuntimeSettings
from tables.spec import JoinSpec
from tables.state.manager import JoinState
from tables.state.store import local_checkpoints
from tables.testing.memory import (
    MemoryInputs,
    MemoryKafkaProducer,
    MemoryLog,
    MemoryProducer,
    MemoryRecord,
    MemoryRecovery,
)

END_OF_TIME = MAX_TS_MS  # close_inputs(): stream time moves past every window and grace


class Sent(NamedTuple):
    """One record the join produced to a topic, decoded with the topic's types (raw bytes
    for a topic known only by name)."""

    key: Any
    value: Any
    partition: int
    headers: list[tuple[str, bytes]]


class _TrackingSerializers(Serializers):
    """The runtime's serializers, remembering each topic a name stands for (to decode)."""

    def __init__(self, app: AppT, topics: dict[str, TopicT]) -> None:
        super().__init__(app)
        self._topics = topics

    def for_topic(self, topic: TopicT | str) -> Any:
        if not isinstance(topic, str):
            self._topics.setdefault(topic.get_topic_name(), topic)
        return super().for_topic(topic)


class _MemoryWorker:
    """The worker a driver's task runs in (`Worker`, tables/runtime/task.py), on the in-memory
    ports (tables/testing/memory.py): its state in a temporary directory, restored from the
    memory log; its seeks set the memory inputs back."""

    quiesce_timeout_s = 10.0

    def __init__(
        self, serializers: Serializers, log: MemoryLog, inputs: MemoryInputs, producer: MemoryProducer
    ) -> None:
        self.serializers = serializers
        self.log = log
        self.offsets = self.inputs = inputs
        self._producer = producer
        self.data_dir = Path(tempfile.mkdtemp(prefix="tandem-test-"))
        self.settings = RuntimeSettings(data_dir=self.data_dir)
        self.failure: Exception | None = None

    def producer(self) -> MemoryKafkaProducer:
        return self._producer.kafka

    def open_state(self, spec: JoinSpec) -> JoinState:
        return JoinState(
            "memory", spec.changelog_topic, self.data_dir, kind=spec.kind, ids=spec.ids, table=spec.name,
            recovery=partial(MemoryRecovery, self.log),
        )  # fmt: skip

    def offsets_on_disk(self, spec: JoinSpec) -> dict[int, int]:
        return local_checkpoints(self.data_dir, spec.name)

    async def rewind(self, restart: dict[TP, int]) -> None:
        for tp, offset in restart.items():
            self.inputs.seek(tp, offset)

    async def crash(self, exc: Exception) -> None:
        self.failure = exc  # raised by the driver's next call

    def remove_files(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)


class JoinTestDriver:
    """Drive one declared join with records, with no broker (see the module's doc).

    `join`: the `JoinSpec` that `@join(...)` returned (or its name, with `app`).
    `partitions`: the inputs' partition count (default: the topics' declared count, else
    the app's `topic_partitions`); records go to their key's partition under the join's
    partitioner, unless `send(..., partition=p)` says otherwise."""

    def __init__(
        self, join: JoinSpec | str, app: AppT | None = None, *, partitions: int | None = None
    ) -> None:
        spec = join if isinstance(join, JoinSpec) else _find(app, join)
        self.spec = spec
        self.app: AppT = spec.app
        # A global table keeps its own partition count: the join's is its stream's.
        sides = (spec.left,) if spec.is_global else (spec.left, spec.right)
        declared = [s.topic.partitions for s in sides if s.topic.partitions]
        self.partitions = int(partitions or (declared[0] if declared else self.app.conf.topic_partitions))
        self.log = MemoryLog(self.partitions)
        self.inputs = MemoryInputs()
        self._producer = MemoryProducer(self.log)
        self._topics: dict[str, TopicT] = {spec.left.name: spec.left.topic, spec.right.name: spec.right.topic}
        self._sides: dict[str, Side] = {spec.right.name: "right", spec.left.name: "left"}  # self-join: "left"
        # A rekeyed input is sent to its source topic: the worker's rekeyer repartitions it.
        for repartition in spec.repartitions:
            self._topics[repartition.source.name] = repartition.source.topic
        self._rekeyers: dict[str, Rekeyer] = {}
        self.stats = JoinStats()
        self._codecs = spec.codecs()
        self._offsets: dict[tuple[str, int], int] = {}
        self._handed: list[tuple[int, Match]] = []
        self._saved_producer: Any = None
        self._saved_tables: list[tuple[Collection, Any]] = []
        self._serializers = _TrackingSerializers(self.app, self._topics)
        self._worker: _MemoryWorker | None = None
        self._task: JoinTask | None = None
        self._batching = False
        self._clock_s = 0.0  # the wall clock the join's `idle` option reads (`idle()` moves it)
        self._global: GlobalTable | None = None  # a global-table join's table (the worker's store)
        self._global_records: list[tuple[int, MemoryRecord]] = []  # what the table topic holds

    # -- the context -----------------------------------------------------------------------

    async def __aenter__(self) -> JoinTestDriver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        internals.check()
        self._saved_producer = self.app.producer
        self.app.producer = self._producer  # type: ignore[misc, assignment]  # read-only in AppT
        collect_handler_sends(self.app)
        self._use_memory_tables()
        for name in (self.spec.changelog_topic, self.spec.dead_letter_topic):
            self.log.counts[name] = self.partitions
        self._worker = _MemoryWorker(self._serializers, self.log, self.inputs, self._producer)
        self._open_global_table()
        await self._start_task()
        for repartition in self.spec.repartitions:
            self.log.counts[repartition.name] = self.partitions
            rekeyer = Rekeyer(self.spec, repartition, self._worker, self.stats)
            rekeyer.partitions = self.partitions
            self._rekeyers[repartition.source.name] = rekeyer

    async def stop(self) -> None:
        if self._task is not None:
            await self._task.stop()
            self._task = None
        if self._saved_producer is not None:
            self.app.producer = self._saved_producer  # type: ignore[misc]
            self._saved_producer = None
        for table, data in self._saved_tables:
            table._data = data
        self._saved_tables = []
        if self._global is not None:
            await self._global.stop()
            self._global = None
        if self._worker is not None:
            self._worker.remove_files()
            self._worker = None

    def _open_global_table(self) -> None:
        """A global-table join's table: the worker's own store in the driver's directory, read
        from what the table topic holds (every record sent to it so far), as a worker starting
        on these files does before it joins its group."""
        if not self.spec.is_global:
            return
        assert self._worker is not None
        table = self._global = GlobalTable(self.spec.right.name, self._worker.data_dir, {})
        table.open()
        for partition, record in self._global_records:
            if record.offset >= table.next_offsets.get(partition, 0):
                table.apply({TopicPartition(table.topic, partition): [record]})
        table.restored = True
        self.spec.kind.table = table  # type: ignore[attr-defined]

    def _use_memory_tables(self) -> None:
        """Each Faust table the join updates gets a new, empty store in memory for this driver,
        whatever the app's store (the app's own is put back at stop). Setting the table's store
        URL is not enough: yarl's URL("memory://") is falsy, and Faust then falls back to the
        app's store (RocksDB files in the current directory); and a store made once is kept by
        the table, from one driver to the next, when the app lives at module level."""
        for table in self.spec.tables:
            self._saved_tables.append((table, table._data))  # type: ignore[attr-defined, arg-type]
            table._data = table._new_store_by_url("memory://")  # type: ignore[attr-defined]

    async def _start_task(self) -> None:
        """A worker's task for the join, owning every partition, restored from what its files
        and the changelog hold (the counters go on from the task before)."""
        assert self._worker is not None, "start the driver first (async with JoinTestDriver(...))"
        task = JoinTask(self.spec, self._worker, stats=self.stats, own_loop=False)
        task.partitions = self.partitions
        task.clock = lambda: self._clock_s
        handle = task.handler.handle

        async def handle_and_keep(feed: list[tuple[int, Match]], *args: Any) -> None:
            self._handed += feed  # for results()
            await handle(feed, *args)

        task.handler.handle = handle_and_keep  # type: ignore[method-assign, assignment]
        await task.assign(set(range(self.partitions)), set(), epoch=0)
        await task.restored()
        self._task = task
        self._raise_failure()

    # -- input -----------------------------------------------------------------------------

    async def send(
        self,
        topic: TopicT | str,
        key: Any = None,
        value: Any = None,
        *,
        timestamp: int | datetime | None = None,
        partition: int | None = None,
        offset: int | None = None,
        raw: bool = False,
    ) -> None:
        """One record on one of the join's inputs, joined at once (one batch): its results
        are handed to the handler and everything it sends is produced before this returns
        (inside `batched()`: at its end, with the other records sent in it).

        `key`, `value`: objects, serialized with the topic's types (`raw=True`: bytes as they
        would be on Kafka, for records the join must reject). `timestamp`: the Kafka record's
        (ms, or a datetime; default 0). `partition`: default, the key's under the join's
        partitioner. `offset`: default, the next one (give an earlier one to read a record
        again, as after a crash)."""
        name = topic if isinstance(topic, str) else topic.get_topic_name()
        if name not in self._sides and name not in self._rekeyers:
            readable = [*self._rekeyers, *(s for s in self._sides if s not in self._repartitioned())]
            raise ValueError(f"join {self.spec.name!r} reads {readable}, not {name!r}")
        raw_key, raw_value = (key, value) if raw else self._serialize(name, key, value)
        if self.spec.is_global and name == self.spec.right.name:
            self._send_to_global_table(raw_key, raw_value, _millis(timestamp), partition or 0, offset)
            return
        if partition is None:
            partition = self._partition(raw_key, name)
        if offset is None:
            offset = self._offsets.get((name, partition), 0)
        self._offsets[(name, partition)] = max(self._offsets.get((name, partition), 0), offset + 1)
        record = MemoryRecord(raw_key, raw_value, _millis(timestamp), [], offset)
        rekeyer = self._rekeyers.get(name)
        if rekeyer is not None:
            await self._repartition(rekeyer, TP(name, partition), record)
        else:
            self.inputs.append(TP(name, partition), record)
        if not self._batching:
            await self._fetch_and_join()

    def _repartitioned(self) -> set[str]:
        return {r.name for r in self.spec.repartitions}

    async def _repartition(self, rekeyer: Rekeyer, tp: TP, record: MemoryRecord) -> None:
        """A source record through the worker's rekeyer: its copy in the repartition topic (in
        the memory log) becomes the join's input, or its dead letter is written."""
        log = self.log.records
        before = {p: len(log.get((rekeyer.target, p), [])) for p in range(self.partitions)}
        await rekeyer.take({tp: [record]})
        self._raise_failure()
        for p, start in before.items():
            for copied in log.get((rekeyer.target, p), [])[start:]:
                self.inputs.append(TP(rekeyer.target, p), copied)

    def _send_to_global_table(
        self, key: bytes | None, value: bytes | None, timestamp: int, partition: int, offset: int | None
    ) -> None:
        """A record of a global-table join's table: in every worker's copy at once (the reader
        of a worker that has caught up), before any stream record sent after it is joined."""
        if offset is None:
            offset = self._offsets.get((self.spec.right.name, partition), 0)
        self._offsets[(self.spec.right.name, partition)] = max(
            self._offsets.get((self.spec.right.name, partition), 0), offset + 1
        )
        record = MemoryRecord(key, value, timestamp, [], offset)
        self._global_records.append((partition, record))
        table = self._global
        assert table is not None, "start the driver first (async with JoinTestDriver(...))"
        table.apply({TopicPartition(table.topic, partition): [record]})

    def global_table(self) -> dict[Any, Any]:
        """A global-table join's table as this worker holds it now, decoded (key -> value)."""
        table = self._global
        if table is None or table.store is None:
            raise ValueError(f"join {self.spec.name!r} has no global table")
        right = self._codecs["right"]
        return {
            right.key(key[len(VALUE) :]): right.value(value)
            for key, value in table.store.scan(VALUE, VALUE + b"\xff")
        }

    @contextlib.asynccontextmanager
    async def batched(self) -> AsyncIterator[None]:
        """The records sent inside are fetched together and joined as one batch at its end, as a
        worker takes a fetch: each partition's records in event-time order across the two
        inputs (tables/records/alignment.py), not in the order sent."""
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
        await self._fetch_and_join()

    async def _fetch_and_join(self) -> None:
        """What a worker does with what its consumer fetches: each fetch a batch of the task,
        until every input not paused has been read; then the group commits."""
        task = self._running()
        while self.inputs.pending(task.paused()):
            await task.batch([self.inputs.fetch(task.paused())])
        self.inputs.commit({tp: task.commit_offset(tp) for tp in task.committing()})
        self._raise_failure()

    async def advance(self, stream_time: int | datetime) -> None:
        """Stream time moves to `stream_time` on every partition with no record: what falls
        due by then (e.g. unmatched records past their window) is joined and handed over."""
        await self._running().advance(_millis(stream_time))
        self._raise_failure()

    async def idle(self, seconds: float) -> None:
        """`seconds` of wall clock pass with no record (for the join's `idle` option): the
        worker's own check runs then, as its loop runs it. Each partition whose inputs are read
        to their end and that has been quiet for `idle` has its stream time moved on by the
        time it has been quiet; what falls due is handed over (marked idle in the audit)."""
        if seconds < 0:
            raise ValueError(f"the clock does not go back: idle({seconds})")
        self._clock_s += seconds
        await self._running().advance_idle()
        self._raise_failure()

    async def close_inputs(self) -> None:
        """The end of a bounded input: stream time moves past every window and grace, so
        everything the join still holds falls due."""
        await self.advance(END_OF_TIME)

    async def restart(self) -> None:
        """As a worker restarting on its own files: the task stopped (every partition's store
        closed) and a new one started, its operators made anew over what the files hold."""
        await self._running().stop()
        self._task = None
        await self._start_task()

    async def restore(self) -> None:
        """As a worker taking the partitions over with no files: the task stopped, its files
        removed, and a new one started, every partition's state rebuilt from the join's
        changelog alone."""
        await self._running().stop()
        self._task = None
        assert self._worker is not None
        if self._global is not None:  # its files go too: read again from the table topic
            await self._global.stop()
        self._worker.remove_files()
        self._open_global_table()
        await self._start_task()

    # -- what came out ---------------------------------------------------------------------------

    def results(self) -> list[JoinResult[Any, Any, Any]]:
        """Every result handed to the handler, in order, decoded as the handler got it."""
        left, right = self._codecs["left"], self._codecs["right"]
        return [
            JoinResult(
                None if m.key is None else left.key(m.key),
                None if m.left is None else left.value(m.left),
                None if m.right is None else right.value(m.right),
                m.timestamp,
            )
            for _, m in self._handed
        ]

    def sent(self, topic: TopicT | str) -> list[Sent]:
        """What the join sent to `topic` (its handler's sends), decoded with the topic's types."""
        name = topic if isinstance(topic, str) else topic.get_topic_name()
        known = topic if not isinstance(topic, str) else self._topics.get(name)
        return [
            Sent(self._decode_key(known, row.key), self._decode_value(known, row.value), partition,
                 [(k, v) for k, v in row.headers if v is not None])
            for partition, row in self.log.topic(name)
        ]  # fmt: skip

    def dead_letters(self) -> list[dict[str, Any]]:
        """The join's dead letters, as JSON dicts (docs/join-semantics.md, "Bad records")."""
        return [orjson.loads(row.value or b"{}") for _, row in self.log.topic(self.spec.dead_letter_topic)]

    def changelog(self, partition: int = 0) -> list[tuple[bytes, bytes | None]]:
        """The join state's changelog records of one partition, in order."""
        rows = self.log.records.get((self.spec.changelog_topic, partition), [])
        return [(row.key or b"", row.value) for row in rows]

    def table(self, table: Any) -> dict[Any, Any]:
        """A Faust table the handler updates (the table, or its name), as a dict."""
        found = self.app.tables[table] if isinstance(table, str) else table
        return dict(found.data.items())  # type: ignore[union-attr]

    def counters(self) -> dict[str, Any]:
        """The join's counters, as a worker's view shows them: records read, results,
        unmatched results, null values, a rekeyed input's records produced to its repartition
        topic (`rekeyed`, per side), dead letters by category, records sent again with
        an offset the state had taken (`rereads`: skipped, as a worker reading them again
        after a crash does), and the operator's (late, duplicates: a declared id already
        held, ...)."""
        return {
            "read": dict(self.stats.read),
            "results": self.stats.results,
            "unmatched": self.stats.unmatched,
            "idle_results": self.stats.idle_results,
            "null_values": dict(self.stats.null_values),
            "rekeyed": dict(self.stats.rekeyed),
            "dead_letters": {c: n for c, n in self.stats.dead_letters.items() if n},
            "handler_restarts": self.stats.handler_restarts,
            "rereads": sum(self.stats.rereads.values()),
            **self._running().counters(),
        }

    # -- inside ------------------------------------------------------------------------------------

    def _running(self) -> JoinTask:
        assert self._task is not None, "start the driver first (async with JoinTestDriver(...))"
        return self._task

    def _raise_failure(self) -> None:
        failure = self._worker.failure if self._worker is not None else None
        if failure is not None:
            raise failure

    def _serialize(self, topic: str, key: Any, value: Any) -> tuple[bytes | None, bytes | None]:
        _, dumps_key, dumps_value = self._serializers.for_topic(self._topics[topic])
        return dumps_key(key), dumps_value(value)

    def _partition(self, key: bytes | None, topic: str | None = None) -> int:
        if key is None:
            return 0  # a null key goes anywhere (dead-lettered, or a lone result: KIP-962)
        if topic in self._rekeyers:  # a source topic: Kafka's default partitioner, its own count
            count = self._topics[topic].partitions or self.partitions
            return partition_for(key, count, "murmur2")
        partitioner = self.spec.partitioner if self.spec.partitioner != "none" else "murmur2"
        return partition_for(key, self.partitions, partitioner)

    def _decode_key(self, topic: TopicT | None, raw: bytes | None) -> Any:
        if raw is None or topic is None:
            return raw
        serializer = topic.key_serializer or self.app.conf.key_serializer  # type: ignore[attr-defined]
        return self.app.serializers.loads_key(topic.key_type, raw, serializer=serializer)

    def _decode_value(self, topic: TopicT | None, raw: bytes | None) -> Any:
        if raw is None or topic is None:
            return raw
        serializer = topic.value_serializer or self.app.conf.value_serializer  # type: ignore[attr-defined]
        return self.app.serializers.loads_value(topic.value_type, raw, serializer=serializer)


def _find(app: AppT | None, name: str) -> JoinSpec:
    if app is None:
        raise ValueError("give the app with a join's name: JoinTestDriver('paid', app)")
    for spec in runtime_of(app).specs():
        if spec.name == name:
            return spec
    raise ValueError(f"app {app.conf.id!r} declares no join {name!r}")


def _millis(when: int | datetime | None) -> int:
    if when is None:
        return 0
    if isinstance(when, datetime):
        found = timestamp_ms(when, "timestamp")
        if isinstance(found, str):
            raise ValueError(found)
        return found
    return int(when)


internals.require(__name__, Collection, "_data", instance=True)
internals.require(__name__, Collection, "_new_store_by_url")

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

Everything runs as in a worker but the broker, which is replaced by an in-memory log:
the join's declaration checks, its inputs' codecs and dead-letter rules (the partitioner
check included), its operator (compiled where built, else pure Python) over its real state
in RocksDB files (a temporary directory), the app's handler as its own supervised task
(a result that makes it raise is dead-lettered), the handler's `send_soon`, its Faust
`topic.send()`s and the Faust tables it updates (in memory), the output path that builds
record batches, and the changelog written before the state. Records are joined in the
order they are sent, each `send` as one batch (a worker also orders its inputs by event
time; here the test chooses the order). Deterministic: the same sends in the same order
give the same results.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import RecordMetadata, TopicPartition
from faust.tables.base import Collection
from faust.types import TP, AppT, TopicT
from faust.types.tuples import FutureMessage

from assignor.faust_adapter import internals
from tables.api import runtime_of
from tables.kafka.handler_sends import collect_handler_sends
from tables.operators.base import Event, Match, Side, counters_of
from tables.records.codecs import MAX_TS_MS, Rejected, timestamp_ms
from tables.records.partitioners import find_misplaced, misplaced_reason, partition_for
from tables.records.positions import InputPosition
from tables.runtime.handler import Handler
from tables.runtime.intake import Letter, check_records, side_codec
from tables.runtime.output import Collector
from tables.runtime.results import JoinResult, Serializers
from tables.runtime.stats import JoinStats
from tables.settings import SEND_BATCH_BYTES
from tables.spec import JoinSpec
from tables.state.partition import StatePartition
from tables.state.store import open_store

END_OF_TIME = MAX_TS_MS  # close_inputs(): stream time moves past every window and grace


class Sent(NamedTuple):
    """One record the join produced to a topic, decoded with the topic's types (raw bytes
    for a topic known only by name)."""

    key: Any
    value: Any
    partition: int
    headers: list[tuple[str, bytes]]


@dataclass
class _Record:
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: list[tuple[str, bytes | None]]
    offset: int


@dataclass
class MemoryLog:
    """The broker, replaced: every record produced, per topic and partition, in order."""

    partitions: int
    counts: dict[str, int] = field(default_factory=dict)  # topic -> partition count, where known
    records: dict[tuple[str, int], list[_Record]] = field(default_factory=dict)
    produced: list[tuple[str, int, _Record]] = field(default_factory=list)  # in the order produced

    def append(self, topic: str, partition: int, rows: Sequence[tuple[Any, ...]], timestamp: int) -> int:
        """Append (key, value, headers) rows; the first one's offset."""
        log = self.records.setdefault((topic, partition), [])
        first = len(log)
        for key, value, headers in rows:
            record = _Record(key, value, timestamp, list(headers or ()), len(log))
            log.append(record)
            self.produced.append((topic, partition, record))
        return first

    def topic(self, name: str) -> Iterator[tuple[int, _Record]]:
        """A topic's records in the order they were produced (over its partitions)."""
        for topic, partition, record in self.produced:
            if topic == name:
                yield partition, record


class _KafkaProducer:
    """The aiokafka producer the join's output path writes whole record batches to
    (tables/kafka/batches.py), answering with the offsets of the memory log."""

    _COMPRESSORS = AIOKafkaProducer._COMPRESSORS

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self._txn_manager = None
        self._compression_type = None
        self._key_serializer = None
        self._value_serializer = None

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.log.counts.get(topic, self.log.partitions)))

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[RecordMetadata]:
        records = MemoryRecords(bytes(batch._builder.build()))
        rows, timestamp = [], 0
        while records.has_next():
            for record in records.next_batch():
                rows.append((record.key, record.value, list(record.headers)))
                timestamp = record.timestamp
        first = self.log.append(topic, partition, rows, timestamp)
        done: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        done.set_result(
            RecordMetadata(topic, partition, TopicPartition(topic, partition), first, timestamp, 0, 0)
        )
        return done


class _FaustProducer:
    """Faust's producer, replaced: `topic.send()` and `send_soon` from the handler (and the
    Faust tables it updates) land in the memory log."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.kafka = _KafkaProducer(log)
        self._buffer: list[FutureMessage] = []

    def _ensure_producer(self) -> _KafkaProducer:
        return self.kafka

    async def maybe_start(self) -> None:
        return None

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
        timestamp: float | None, headers: Any, *, transactional_id: str | None = None,
    ) -> asyncio.Future[RecordMetadata]:  # fmt: skip
        if partition is None:
            count = self.log.counts.get(topic, self.log.partitions)
            partition = partition_for(key, count, "murmur2") if key is not None else 0
        headers = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
        ms = int((timestamp or 0) * 1000)
        offset = self.log.append(topic, partition, [(key, value, headers)], ms)
        done: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        done.set_result(RecordMetadata(topic, partition, TopicPartition(topic, partition), offset, ms, 0, 0))
        return done

    async def send_and_wait(self, *args: Any, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(*args, **kwargs))

    def send_soon(self, fut: FutureMessage) -> None:
        self._buffer.append(fut)

    async def flush(self) -> None:
        buffered, self._buffer = self._buffer, []
        for fut in buffered:
            await fut.message.channel.publish_message(fut)  # type: ignore[attr-defined]

    def key_partition(self, topic: str, key: bytes) -> TP:
        return TP(topic, partition_for(key, self.log.counts.get(topic, self.log.partitions), "murmur2"))


class _TrackingSerializers(Serializers):
    """The runtime's serializers, remembering each topic a name stands for (to decode)."""

    def __init__(self, app: AppT, topics: dict[str, TopicT]) -> None:
        super().__init__(app)
        self._topics = topics

    def for_topic(self, topic: TopicT | str) -> Any:
        if not isinstance(topic, str):
            self._topics.setdefault(topic.get_topic_name(), topic)
        return super().for_topic(topic)


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
        declared = [s.topic.partitions for s in (spec.left, spec.right) if s.topic.partitions]
        self.partitions = int(partitions or (declared[0] if declared else self.app.conf.topic_partitions))
        self.log = MemoryLog(self.partitions)
        self._topics: dict[str, TopicT] = {spec.left.name: spec.left.topic, spec.right.name: spec.right.topic}
        self._sides: dict[str, Side] = {spec.left.name: "left", spec.right.name: "right"}
        self.stats = JoinStats()
        self._codecs = {"left": side_codec(spec, spec.left), "right": side_codec(spec, spec.right)}
        self._dir: Path | None = None
        self._states: dict[int, StatePartition] = {}
        self._offsets: dict[tuple[str, int], int] = {}
        self._handed: list[tuple[int, Match]] = []
        self._saved_producer: Any = None
        self._saved_tables: list[tuple[Collection, Any]] = []
        self._serializers = _TrackingSerializers(self.app, self._topics)
        self._collector = Collector(spec, SEND_BATCH_BYTES, self.stats)
        self._collector.partitions = self.partitions
        self._handler = Handler(
            spec, self._codecs["left"], self._codecs["right"], self._collector, self._serializers, self.stats
        )

    # -- the context -----------------------------------------------------------------------

    async def __aenter__(self) -> JoinTestDriver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        internals.check()
        self._dir = Path(tempfile.mkdtemp(prefix=f"tandem-test-{self.spec.name}-"))
        self._saved_producer = self.app.producer
        self.app.producer = _FaustProducer(self.log)  # type: ignore[assignment]
        collect_handler_sends(self.app)
        self._use_memory_tables()
        for name in (self.spec.changelog_topic, self.spec.dead_letter_topic):
            self.log.counts[name] = self.partitions
        self._handler.start()

    async def stop(self) -> None:
        await self._handler.stop()
        for state in self._states.values():
            state.store.close()
        self._states = {}
        if self._saved_producer is not None:
            self.app.producer = self._saved_producer
            self._saved_producer = None
        for table, data in self._saved_tables:
            table._data = data  # type: ignore[attr-defined]
        self._saved_tables = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _use_memory_tables(self) -> None:
        """Each Faust table the join updates gets a new, empty store in memory for this driver,
        whatever the app's store (the app's own is put back at stop). Setting the table's store
        URL is not enough: yarl's URL("memory://") is falsy, and Faust then falls back to the
        app's store (RocksDB files in the current directory); and a store made once is kept by
        the table, from one driver to the next, when the app lives at module level."""
        for table in self.spec.tables:
            self._saved_tables.append((table, table._data))  # type: ignore[attr-defined]
            table._data = table._new_store_by_url("memory://")  # type: ignore[attr-defined]

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
        are handed to the handler and everything it sends is produced before this returns.

        `key`, `value`: objects, serialized with the topic's types (`raw=True`: bytes as they
        would be on Kafka, for records the join must reject). `timestamp`: the Kafka record's
        (ms, or a datetime; default 0). `partition`: default, the key's under the join's
        partitioner. `offset`: default, the next one (give an earlier one to read a record
        again, as after a crash)."""
        name = topic if isinstance(topic, str) else topic.get_topic_name()
        side = self._sides.get(name)
        if side is None:
            raise ValueError(f"join {self.spec.name!r} reads {list(self._sides)}, not {name!r}")
        raw_key, raw_value = (key, value) if raw else self._serialize(name, key, value)
        if partition is None:
            partition = self._partition(raw_key)
        tp = TP(name, partition)
        if offset is None:
            offset = self._offsets.get((name, partition), 0)
        self._offsets[(name, partition)] = max(self._offsets.get((name, partition), 0), offset + 1)
        ms = _millis(timestamp)
        record = _Record(raw_key, raw_value, ms, [], offset)
        if self._done(tp, offset):  # the state holds it already: a worker skips it too
            self.stats.rereads[partition] = self.stats.rereads.get(partition, 0) + 1
            return
        self.stats.read[side] += 1
        letters: list[Letter] = []
        events: list[Event] = []
        built: dict[int, tuple[bytes, Any]] = {}
        if not self._misplaced(tp, record, letters):
            checked = check_records(self._codecs[side], side, tp, [record], letters, built)
            events = checked.events
            self.stats.null_values[side] += checked.nulls
        matches = {partition: self._state(partition).operator.process_many(events)} if events else {}
        await self._batch(matches, letters, built)

    async def advance(self, stream_time: int | datetime) -> None:
        """Stream time moves to `stream_time` on every partition with no record: what falls
        due by then (e.g. unmatched records past their window) is joined and handed over."""
        ms = _millis(stream_time)
        found = {p: state.operator.advance(ms) for p, state in sorted(self._states.items())}
        await self._batch(found, [], {})

    async def close_inputs(self) -> None:
        """The end of a bounded input: stream time moves past every window and grace, so
        everything the join still holds falls due."""
        await self.advance(END_OF_TIME)

    async def restart(self) -> None:
        """As a worker restarting on its own files: every partition's store is closed and
        opened again, its operator made anew over what the files hold."""
        for partition, state in list(self._states.items()):
            state.store.close()
            self._states[partition] = self._open(partition)

    async def restore(self) -> None:
        """As a worker taking the partitions over with no files: every partition's state is
        rebuilt from the join's changelog alone."""
        for partition, state in list(self._states.items()):
            state.store.close()
            shutil.rmtree(self._path(partition), ignore_errors=True)
            fresh = self._open(partition)
            for row in self.log.records.get((self.spec.changelog_topic, partition), []):
                fresh.restore(row.key or b"", row.value)
            fresh.operator.finish_restore()
            last = len(self.log.records.get((self.spec.changelog_topic, partition), [])) - 1
            fresh.write(last if last >= 0 else None)
            self._states[partition] = fresh

    # -- what came out ---------------------------------------------------------------------------

    def results(self) -> list[JoinResult[Any, Any, Any]]:
        """Every result handed to the handler, in order, decoded as the handler got it."""
        left, right = self._codecs["left"], self._codecs["right"]
        return [
            JoinResult(
                left.key(m.key),
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
        return dict(found.data.items())

    def counters(self) -> dict[str, Any]:
        """The join's counters, as a worker's view shows them: records read, results,
        unmatched results, null values, dead letters by category, records sent again with
        an offset the state had taken (`rereads`: skipped, as a worker reading them again
        after a crash does), and the operator's (late, duplicates: a declared id already
        held, ...)."""
        return {
            "read": dict(self.stats.read),
            "results": self.stats.results,
            "unmatched": self.stats.unmatched,
            "null_values": dict(self.stats.null_values),
            "dead_letters": {c: n for c, n in self.stats.dead_letters.items() if n},
            "handler_restarts": self.stats.handler_restarts,
            "rereads": sum(self.stats.rereads.values()),
            **counters_of(state.operator for state in self._states.values()),
        }

    # -- inside ------------------------------------------------------------------------------------

    async def _batch(
        self, matches: dict[int, list[Match]], letters: list[Letter], built: dict[int, tuple[bytes, Any]]
    ) -> None:
        """What a worker's batch does after the operator: the handler, the output with the
        dead letters, then each partition's changelog and state."""
        feed = [(p, m) for p, found in matches.items() for m in found]
        if feed:
            self._handed += feed
            self.stats.results += len(feed)
            self.stats.unmatched += sum(1 for _, m in feed if m.left is None or m.right is None)
            await self._handler.handle(feed, built, letters)
        await self._collector.send(letters)
        kafka = self.app.producer._ensure_producer()  # type: ignore[attr-defined]
        for partition in sorted(matches):
            positions = {
                topic: InputPosition(self._offsets[(topic, partition)]).encode()
                for topic in self.spec.input_topics
                if (topic, partition) in self._offsets
            }  # every record sent is taken at once: nothing is held
            await self._states[partition].commit(
                kafka, self.spec.changelog_topic, partition, SEND_BATCH_BYTES, positions
            )
        self.stats.batches += 1

    def _done(self, tp: TP, offset: int) -> bool:
        """Whether the partition's state has taken the record at `offset` already."""
        if tp.partition not in self._states:
            return False
        position = InputPosition.decode(self._states[tp.partition].positions().get(tp.topic))
        return position is not None and position.done(offset)

    def _misplaced(self, tp: TP, record: _Record, letters: list[Letter]) -> bool:
        partitioner = self.spec.partitioner
        if partitioner == "none":
            return False
        found = find_misplaced([record.key], tp.partition, self.partitions, partitioner)
        for miss in found:
            reason = misplaced_reason(tp.partition, miss.expected, partitioner)
            letters.append(
                (
                    tp.topic,
                    tp.partition,
                    record.offset,
                    record.key,
                    record.value,
                    Rejected(reason, "wrong_partition"),
                )
            )
        return bool(found)

    def _serialize(self, topic: str, key: Any, value: Any) -> tuple[bytes | None, bytes | None]:
        _, dumps_key, dumps_value = self._serializers.for_topic(self._topics[topic])
        return dumps_key(key), dumps_value(value)

    def _partition(self, key: bytes | None) -> int:
        if key is None:
            return 0  # dead-lettered as a null key: any partition will do
        partitioner = self.spec.partitioner if self.spec.partitioner != "none" else "murmur2"
        return partition_for(key, self.partitions, partitioner)

    def _path(self, partition: int) -> Path:
        assert self._dir is not None, "start the driver first (async with JoinTestDriver(...))"
        return self._dir / str(partition)

    def _open(self, partition: int) -> StatePartition:
        return StatePartition(open_store(self._path(partition)), self.spec.kind, "active", self.spec.ids)

    def _state(self, partition: int) -> StatePartition:
        if partition not in self._states:
            self._states[partition] = self._open(partition)
        return self._states[partition]

    def _decode_key(self, topic: TopicT | None, raw: bytes | None) -> Any:
        if raw is None or topic is None:
            return raw
        serializer = topic.key_serializer or self.app.conf.key_serializer
        return self.app.serializers.loads_key(topic.key_type, raw, serializer=serializer)

    def _decode_value(self, topic: TopicT | None, raw: bytes | None) -> Any:
        if raw is None or topic is None:
            return raw
        serializer = topic.value_serializer or self.app.conf.value_serializer
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

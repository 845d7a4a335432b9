"""The in-memory implementations of the ports a join's task runs on (tables/runtime/ports.py),
for `JoinTestDriver` (tables/testing/driver.py): the broker replaced by a log in memory.

- `MemoryLog`: every record produced, per topic and partition, in order (the join's output,
  its dead letters, its changelog, the Faust tables' changelogs).
- `MemoryProducer`: Faust's producer (`topic.send()`, `send_soon`, the handler's tables) and
  the aiokafka producer inside it (whole record batches, acknowledged at once with the
  offsets of the log).
- `MemoryInputs`: the join's input partitions, as a test sends to them: fetched in the order
  sent, leaving out paused inputs; their high watermarks and committed offsets; seek.
- `MemoryRecovery`: a partition's state read back from its changelog in the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import RecordMetadata, TopicPartition
from faust.types import TP
from faust.types.tuples import FutureMessage

from tables.records.partitioners import partition_for
from tables.runtime.intake import Fetch
from tables.state.recovery import Recovery, RestoreProgress


@dataclass
class MemoryRecord:
    """One record in the memory log (as a fetch hands it: `InputRecord`)."""

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
    records: dict[tuple[str, int], list[MemoryRecord]] = field(default_factory=dict)
    produced: list[tuple[str, int, MemoryRecord]] = field(default_factory=list)  # in the order produced

    def append(self, topic: str, partition: int, rows: Sequence[tuple[Any, ...]], timestamp: int) -> int:
        """Append (key, value, headers) rows; the first one's offset."""
        log = self.records.setdefault((topic, partition), [])
        first = len(log)
        for key, value, headers in rows:
            record = MemoryRecord(key, value, timestamp, list(headers or ()), len(log))
            log.append(record)
            self.produced.append((topic, partition, record))
        return first

    def topic(self, name: str) -> Iterator[tuple[int, MemoryRecord]]:
        """A topic's records in the order they were produced (over its partitions)."""
        for topic, partition, record in self.produced:
            if topic == name:
                yield partition, record

    def partition_count(self, topic: str) -> int:
        return self.counts.get(topic, self.partitions)


def _acknowledged(topic: str, partition: int, offset: int, timestamp: int) -> asyncio.Future[RecordMetadata]:
    done: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
    done.set_result(
        RecordMetadata(topic, partition, TopicPartition(topic, partition), offset, timestamp, 0, 0)
    )
    return done


class MemoryKafkaProducer:
    """The aiokafka producer the output path writes whole record batches to
    (tables/kafka/batches.py), answering with the offsets of the memory log."""

    _COMPRESSORS = AIOKafkaProducer._COMPRESSORS

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self._txn_manager = None
        self._compression_type = None
        self._key_serializer = None
        self._value_serializer = None

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.log.partition_count(topic)))

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[RecordMetadata]:
        records = MemoryRecords(bytes(batch._builder.build()))
        first, timestamp = None, 0
        while records.has_next():
            for record in records.next_batch():  # each with its own timestamp (a rekeyed input's)
                timestamp = record.timestamp
                offset = self.log.append(
                    topic, partition, [(record.key, record.value, list(record.headers))], timestamp
                )
                first = offset if first is None else first
        return _acknowledged(topic, partition, first or 0, timestamp)

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[RecordMetadata]:
        """aiokafka's `send` (a rekeyed input's records: tables/runtime/rekeyer.py), each record
        with its own timestamp."""
        if partition is None:
            count = self.log.partition_count(topic)
            partition = partition_for(key, count, "murmur2") if key is not None else 0
        ms = timestamp_ms or 0
        offset = self.log.append(topic, partition, [(key, value, list(headers or ()))], ms)
        return _acknowledged(topic, partition, offset, ms)


class MemoryProducer:
    """Faust's producer, replaced: `topic.send()` and `send_soon` from the handler (and the
    Faust tables it updates) land in the memory log."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.kafka = MemoryKafkaProducer(log)
        self._buffer: list[FutureMessage] = []

    def _ensure_producer(self) -> MemoryKafkaProducer:
        return self.kafka

    async def maybe_start(self) -> None:
        return None

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
        timestamp: float | None, headers: Any, *, transactional_id: str | None = None,
    ) -> asyncio.Future[RecordMetadata]:  # fmt: skip
        if partition is None:
            count = self.log.partition_count(topic)
            partition = partition_for(key, count, "murmur2") if key is not None else 0
        headers = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
        ms = int((timestamp or 0) * 1000)
        offset = self.log.append(topic, partition, [(key, value, headers)], ms)
        return _acknowledged(topic, partition, offset, ms)

    async def send_and_wait(self, *args: Any, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(*args, **kwargs))

    def send_soon(self, fut: FutureMessage) -> None:
        self._buffer.append(fut)

    async def flush(self) -> None:
        buffered, self._buffer = self._buffer, []
        for fut in buffered:
            await fut.message.channel.publish_message(fut)

    def key_partition(self, topic: str, key: bytes) -> TP:
        return TP(topic, partition_for(key, self.log.partition_count(topic), "murmur2"))


class MemoryInputs:
    """The join's input partitions as a test sends to them (`InputOffsets`, with fetch, pause
    and seek): each partition's records in the order sent, and how far they were fetched."""

    def __init__(self) -> None:
        self.sent: dict[TP, list[MemoryRecord]] = {}
        self.fetched: dict[TP, int] = {}  # how many of `sent` were fetched
        self.committed_at: dict[TP, int] = {}  # what the task let the group commit

    def append(self, tp: TP, record: MemoryRecord) -> None:
        self.sent.setdefault(tp, []).append(record)

    def pending(self, paused: AbstractSet[TP] = frozenset()) -> bool:
        """Whether a partition not paused has records not fetched yet."""
        return any(len(s) > self.fetched.get(tp, 0) for tp, s in self.sent.items() if tp not in paused)

    def fetch(self, paused: AbstractSet[TP]) -> Fetch:
        """What was sent and not fetched yet, of every partition not paused."""
        fetch: Fetch = {}
        for tp, sent in self.sent.items():
            start = self.fetched.get(tp, 0)
            if tp not in paused and start < len(sent):
                fetch[tp] = sent[start:]  # type: ignore[assignment]
                self.fetched[tp] = len(sent)
        return fetch

    def seek(self, tp: TP, offset: int) -> None:
        """Fetch again the records fetched last that are at or past `offset`."""
        sent, at = self.sent.get(tp, []), self.fetched.get(tp, 0)
        while at > 0 and sent[at - 1].offset >= offset:
            at -= 1
        self.fetched[tp] = at

    def commit(self, offsets: Mapping[TP, int | None]) -> None:
        self.committed_at.update({tp: o for tp, o in offsets.items() if o is not None})

    # -- InputOffsets --

    def highwater(self, tp: TP) -> int | None:
        """Past the highest offset sent (0: nothing sent, an empty partition)."""
        sent = self.sent.get(tp)
        return max(r.offset for r in sent) + 1 if sent else 0

    def committed(self) -> Mapping[TP, int | None]:
        return self.committed_at


class MemoryRecovery(Recovery):
    """`Recovery` reading the changelog from the memory log: each partition's records after its
    checkpoint applied as a worker's restore applies them."""

    def __init__(self, log: MemoryLog, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    async def restore(self, partitions: list[int], on_ready: Callable[[int], None]) -> None:
        for partition in partitions:
            progress = self.progress[partition] = RestoreProgress(partition)
            rows = self.log.records.get((self.changelog, partition), [])
            checkpoint = self.partitions[partition].checkpoint
            await self._apply(partition, rows[0 if checkpoint is None else checkpoint + 1 :])
            self._flush(partition)
            progress.position = progress.end = len(rows)
            on_ready(partition)

    async def tail(self, partitions: list[int]) -> None:
        raise NotImplementedError("the test driver keeps no standbys")

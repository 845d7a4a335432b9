"""Faust's consumer, as the join runtime runs it: `JoinConsumer` (installed per app by
`take_records`) and its consumer thread, built on the assignor's `TandemConsumer`
(assignor/faust_adapter/group_consumer.py: the group protocols, the fetch wait, start checks).

- It hands the records of join inputs to a `RecordTaker` (the join runtime,
  tables/runtime/worker.py) in whole fetches, instead of building a Faust Event and a Stream
  step per record, leaves them as aiokafka's fetcher reads them (`RawRecords`, no
  `ConsumerRecord` copy), commits their offsets as the taker says (only what was joined and
  acknowledged), and lets the taker finish its in-flight work before a revocation commits.
- It seeks an input partition on the consumer's own thread (`seek`), and tells the runtime
  what Faust committed (`committed_offsets`) and who this member is (`member_id`).

A record's path from fetch to commit stays in tables/. Every private name used here is
declared to `internals.require` below, and checked at start.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import aiokafka
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from faust.exceptions import ImproperlyConfigured
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer
from faust.types import TP, AppT

from assignor import internals
from assignor.faust_adapter import TandemConsumer, TandemConsumerThread
from tables.records.sides import Record

SEEK_TIMEOUT_S = 10.0  # the consumer thread stopping while the call waits: give up (bounded)


async def seek(app: AppT, tp: TP, offset: int) -> None:
    """Set an input partition's next fetch to `offset`, as Faust's `Consumer.seek` does, but
    on the consumer's own thread: Faust calls aiokafka's seek from the app's event loop,
    racing the consumer thread as it drains that partition's fetched records (aiokafka's
    fetcher then fails with a KeyError, and Faust's Fetcher service crashes)."""
    consumer = app.consumer
    thread = consumer._thread  # type: ignore[attr-defined]
    if consumer.should_stop or thread.should_stop:
        # A stopped consumer thread never runs the call: the worker is stopping (a crash
        # included), and what is committed, not where it would have read, is what counts.
        raise RuntimeError(f"no seek of {tp}: the consumer is stopping")
    await asyncio.wait_for(thread.call_thread(thread.seek, tp, offset), SEEK_TIMEOUT_S)
    consumer._read_offset[tp] = offset if offset else None  # type: ignore[attr-defined]


# What the join runtime reads of a record it takes: aiokafka's fetched record as it is
# (`RawRecords`), or a ConsumerRecord; the records layer's checks read the same.
InputRecord = Record


class RecordTaker(Protocol):
    """What the consumer asks of the join runtime (tables/runtime/task.py)."""

    def takes(self, topic: str) -> bool:
        """Whether records of `topic` go to the taker instead of Faust's streams (asked in
        the consumer's thread too)."""
        ...

    async def take(self, records: dict[TP, list[InputRecord]]) -> None:
        """Take a fetch's records of the taker's topics."""
        ...

    def held_back(self) -> set[TP]:
        """Partitions not to fetch now (their state is being restored)."""
        ...

    def commit_offset(self, tp: TP) -> int | None:
        """The offset to commit for a taken partition: everything before it is done."""
        ...

    def progressed(self) -> Iterable[TP]:
        """Taken partitions with something new to commit."""
        ...

    async def quiesce(self) -> None:
        """Finish or drop in-flight work before Faust commits for a revocation or a stop."""
        ...

    async def dropped(self, records: dict[TP, list[Any]]) -> None:
        """Records fetched and not taken (a rebalance began): set their partitions back so
        that nothing is skipped."""
        ...


_takers: weakref.WeakKeyDictionary[Any, RecordTaker] = weakref.WeakKeyDictionary()


class JoinConsumerThread(TandemConsumerThread):
    """The assignor's consumer thread, with the join inputs' records left as fetched."""

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        if consumer._key_deserializer is None:  # handed to the fetcher in start()
            consumer._key_deserializer = RawRecords(self._taken_topic)
        return consumer

    def _taken_topic(self, topic: str) -> bool:
        taker = _takers.get(self.app)
        return taker is not None and taker.takes(topic)


class RawRecords:
    """The Tandem consumer's key deserializer (Faust's has none), which aiokafka's fetcher
    hands to the records of each partition it fetched: those of a topic the join runtime
    takes stay the fetcher's own record objects (key, value, offset, timestamp, headers),
    not copied each into a ConsumerRecord (~1 us per record, in the consumer's thread);
    the others are ConsumerRecords as before, with no key deserializer."""

    def __init__(self, takes: Callable[[str], bool]) -> None:
        self.takes = takes  # asked once per partition and fetch response

    def __call__(self, raw: bytes | None) -> bytes | None:
        return raw  # never called: the fetcher's records get None in its place


_ORIGINAL_PARTITION_RECORDS = PartitionRecords.__init__


def _partition_records(self: Any, tp: TP, records: Any, aborted: Any, at: int, keys: Any, *more: Any) -> None:
    raw = False
    if type(keys) is RawRecords:
        raw, keys = keys.takes(tp.topic), None
    _ORIGINAL_PARTITION_RECORDS(self, tp, records, aborted, at, keys, *more)
    if raw:
        self._consumer_record = _as_fetched  # read per record by the records' generator


def _as_fetched(tp: Any, record: Any) -> Any:
    return record


def install_raw_records() -> None:
    """Idempotent: partitions fetched by a consumer with `RawRecords` keep their records
    as fetched when the join runtime takes their topic (other consumers: unchanged)."""
    PartitionRecords.__init__ = _partition_records


# A probe batch for raw_record_problems: three records, headers and nulls included.
_PROBE: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (b"k", b"v" * 8, [("h", b"1")]),
    (None, b"w" * 8, []),
    (b"k", None, [("h", None)]),
]
_PROBE_MS = 1_700_000_000_000


def raw_record_problems() -> list[str]:
    """What RawRecords needs of aiokafka's fetcher and is missing: a probe record batch
    read through PartitionRecords must give records with the key, value, offset and
    timestamp appended, and a ConsumerRecord for a topic not taken."""
    builder = BatchBuilder(1024, 0)
    for offset, (key, value, own) in enumerate(_PROBE):
        builder.append(key=key, value=value, timestamp=_PROBE_MS + offset, headers=list(own))
    keys = RawRecords(lambda topic: topic == "taken")
    try:
        found = {
            topic: [
                (r.key, r.value, r.offset, r.timestamp, type(r) is aiokafka.ConsumerRecord)
                for r in _read_partition(TP(topic, 0), builder._builder.build(), keys)
            ]
            for topic in ("taken", "other")
        }
    except Exception as error:  # e.g. PartitionRecords changed its arguments
        return [f"PartitionRecords: raw records fail ({error!r})"]
    wanted = [(key, value, offset, _PROBE_MS + offset) for offset, (key, value, _) in enumerate(_PROBE)]
    if [r[:4] for r in found["taken"]] != wanted or any(r[4] for r in found["taken"]):
        return ["PartitionRecords: raw records differ from the records fetched"]
    if [r[:4] for r in found["other"]] != wanted or not all(r[4] for r in found["other"]):
        return ["PartitionRecords: a topic not taken does not get ConsumerRecords"]
    return []


def _read_partition(tp: TP, data: bytes | bytearray, keys: RawRecords) -> list[Any]:
    install_raw_records()
    records = PartitionRecords(tp, MemoryRecords(bytes(data)), [], 0, keys, None, False, 0)
    return list(records)


class JoinConsumer(TandemConsumer):
    """The assignor's consumer with the join runtime's records taken out of its fetches."""

    # While a partition is held back, fetch waits are kept short, so it is fetched soon
    # after it is released (a fetch otherwise waits up to a second for other partitions).
    HELD_BACK_FETCH_S = 0.05
    consumer_thread = JoinConsumerThread

    @property
    def _taker(self) -> RecordTaker | None:
        return _takers.get(self.app)

    async def _wait_next_records(self, timeout: float) -> tuple[Any, Any]:
        taker = self._taker
        if taker is None:
            return await super()._wait_next_records(timeout)
        if taker.held_back():
            timeout = min(timeout, self.HELD_BACK_FETCH_S)
        generation = self.app.consumer_generation_id
        records, active = await super()._wait_next_records(timeout)
        if records:
            taken = {tp: records.pop(tp) for tp in list(records) if taker.takes(tp.topic)}  # type: ignore[attr-defined]
            if not taken:
                pass
            elif self.flow_active and generation == self.app.consumer_generation_id:
                await taker.take(taken)
            else:  # fetched across a rebalance: not taken, and read again (Faust seeks only
                await taker.dropped(taken)  # partitions with a commit above 0)
        return records, active

    async def _getmany(self, active_partitions: set[TP] | None, timeout: float) -> Any:
        # Faust's own set of active partitions is mutated in place by its pause/resume:
        # held-back partitions are left out of a copy, for this fetch only.
        taker = self._taker
        held = taker.held_back() if taker is not None else None
        if held and active_partitions is not None:
            active_partitions = active_partitions - held
            if not active_partitions:
                await asyncio.sleep(min(timeout, self.HELD_BACK_FETCH_S))
                return {}
        return await super()._getmany(active_partitions, timeout)

    def _new_offset(self, tp: TP) -> int | None:
        taker = self._taker
        if taker is not None and taker.takes(tp.topic):
            return taker.commit_offset(tp)
        return super()._new_offset(tp)

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Iterator[TP]:
        yield from super()._filter_tps_with_pending_acks(topics)
        taker = self._taker
        if taker is not None:
            for tp in taker.progressed():
                if topics is None or tp in topics or tp.topic in topics:
                    yield tp

    async def wait_empty(self) -> None:
        taker = self._taker
        if taker is not None:
            await taker.quiesce()
        await super().wait_empty()


def take_records(app: AppT, taker: RecordTaker) -> None:
    """Make `app` build its consumer as a JoinConsumer (this app's transport only), which
    hands the records of `taker`'s topics to it. The assignor's `install` keeps this class
    (a TandemConsumer), whether it comes before or after."""
    transport = app.transport
    if not issubclass(transport.Consumer, Consumer):
        raise ImproperlyConfigured(f"Tandem needs Faust's aiokafka transport, not {type(transport).__name__}")
    if app.conf.producer_threaded:
        raise ImproperlyConfigured("Tandem needs producer_threaded=False (it produces on the app's loop)")
    install_raw_records()
    _takers[app] = taker
    if not issubclass(transport.Consumer, JoinConsumer):
        transport.Consumer = JoinConsumer  # type: ignore[misc]


def committed_offsets(app: AppT) -> Mapping[TP, int | None]:
    """Faust's record of the offsets this consumer committed (or started from)."""
    return getattr(app.consumer, "_committed_offset", {})


def kafka_consumer(app: AppT) -> aiokafka.AIOKafkaConsumer | None:
    """The aiokafka consumer inside Faust's consumer thread (None before it started)."""
    thread = getattr(app.consumer, "_thread", None)
    try:
        return thread._ensure_consumer() if thread is not None else None
    except Exception:  # not started yet
        return None


def member_id(app: AppT) -> str | None:
    """This worker's member id in its consumer group (None before it joined)."""
    consumer = kafka_consumer(app)
    coordinator = getattr(consumer, "_coordinator", None)
    return getattr(coordinator, "member_id", None)


internals.require(
    __name__, FaustConsumer, "_wait_next_records", "_new_offset", "_filter_tps_with_pending_acks"
)
internals.require(__name__, FaustConsumer, "wait_empty", "should_stop")
internals.require(__name__, FaustConsumer, "_committed_offset", "_read_offset", instance=True)
internals.require(__name__, Consumer, "_thread", instance=True)
internals.require(__name__, Consumer, "_getmany")
internals.require(
    __name__, AIOKafkaConsumerThread, "_create_worker_consumer", "call_thread", "seek", "_ensure_consumer"
)
internals.require(__name__, aiokafka.AIOKafkaConsumer, "_key_deserializer", "_coordinator", instance=True)
internals.require(__name__, PartitionRecords, "_consumer_record")
internals.require_probe(__name__, raw_record_problems)

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
- A join input that a Faust stream reads too (an `@app.agent` on the same topic) is handed
  to both: the join gets the fetch's records, Faust's streams every one of them as usual, and
  the offset committed is the lower of what the joins are done with and what the agent acked
  (`agent_topics`, `subscribe`).

A record's path from fetch to commit stays in tables/. Every private name used here is
declared to `internals.require` below, and checked at start.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, cast

import aiokafka
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from faust.exceptions import ImproperlyConfigured
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer
from faust.types import TP, AppT, TopicT

from assignor import internals
from assignor.faust_adapter import TandemConsumer, TandemConsumerThread
from tables.records.sides import Record

RECOMMIT_S = 5.0  # a join input's unmoved committed offset is committed again this often
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
        """Whether records of `topic` go to the taker (asked in the consumer's thread too):
        instead of Faust's streams, or beside them when one reads the topic too."""
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

    async def quiesce(self, partitions: set[TP] | None = None) -> None:
        """Finish or drop in-flight work before Faust commits for a revocation or a stop
        (`partitions`: a cooperative revoke's, the only ones handed over)."""
        ...

    async def dropped(self, records: dict[TP, list[Any]]) -> None:
        """Records fetched and not taken (a rebalance began): set their partitions back so
        that nothing is skipped."""
        ...


_takers: weakref.WeakKeyDictionary[Any, RecordTaker] = weakref.WeakKeyDictionary()
# The runtime's own subscriptions to join inputs (`subscribe`): channels Faust delivers nothing to.
_subscriptions: weakref.WeakSet[Any] = weakref.WeakSet()
# Per app, the join inputs a Faust stream reads too (kept fresh on the app's loop by the
# consumer, read by its thread: a whole frozenset is swapped in, never changed in place).
_shared: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def subscribe(app: AppT, topic: TopicT) -> None:
    """Have Faust's consumer subscribe to a join input without delivering its records to a
    Faust stream. The conductor subscribes to the topics of every channel it holds, and
    delivers a partition's records to the channels that own it: a clone of the topic that
    owns no partition (Faust's "isolated partitions", with none) gets nothing, while an
    agent's own channel on the topic still gets every record."""
    channel = cast(TopicT, topic.clone(active_partitions=set()))
    _subscriptions.add(channel)
    app.topics.add(channel)


def agent_topics(app: AppT) -> frozenset[str]:
    """The topics a Faust stream reads (an agent's channel, a `stream` of the topic): the
    conductor's channels but the runtime's own subscriptions."""
    return frozenset(
        name for channel in list(app.topics) if channel not in _subscriptions for name in channel.topics or ()
    )


def shared_topics(app: AppT) -> frozenset[str]:
    """Join inputs a Faust stream reads too (as last seen on the app's loop)."""
    return _shared.get(app, frozenset())


class JoinConsumerThread(TandemConsumerThread):
    """The assignor's consumer thread, with the join inputs' records left as fetched."""

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        if consumer._key_deserializer is None:  # handed to the fetcher in start()
            consumer._key_deserializer = RawRecords(self._taken_topic)
        return consumer

    def _taken_topic(self, topic: str) -> bool:
        """Whether the records of `topic` may stay as fetched: the join takes them, and no
        Faust stream reads them (a Faust Event is made of a ConsumerRecord)."""
        taker = _takers.get(self.app)
        return taker is not None and taker.takes(topic) and topic not in shared_topics(self.app)


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
    """The assignor's consumer with the join runtime's records taken out of its fetches (or
    handed to both, for a topic a Faust stream reads too)."""

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
        shared = _shared[self.app] = frozenset(t for t in agent_topics(self.app) if taker.takes(t))
        records, active = await super()._wait_next_records(timeout)
        if records:
            taken = {}
            for tp in list(records):
                if tp.topic in shared:  # the join reads them, and Faust's streams get them too
                    taken[tp] = records[tp] = consumer_records(tp, records[tp])  # type: ignore[index]
                elif taker.takes(tp.topic):
                    taken[tp] = records.pop(tp)  # type: ignore[attr-defined]
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
        if taker is None or not taker.takes(tp.topic):
            return super()._new_offset(tp)
        joined = taker.commit_offset(tp)
        if tp.topic not in shared_topics(self.app):
            return joined
        acked = self._agent_position(tp)  # moved even when the joins are behind
        return None if joined is None or acked is None else min(joined, acked)

    def _agent_position(self, tp: TP) -> int | None:
        """The offset below which Faust's streams acked every record of `tp` (None: not known
        yet). Faust's own `_new_offset` would do for an agent alone, but it measures from the
        committed offset, which the joins may hold back, and lets one record at its head
        go unacked: this one goes on from where the streams were, strictly."""
        done: dict[TP, int | None] = self.__dict__.setdefault("_agent_done", {})
        position = done.get(tp, self._committed_offset.get(tp))
        acked: list[int] = self._acked[tp]
        if acked:
            acked.extend(self._gap_offsets(tp, max(acked)))
            acked.sort()
            if position is not None and acked[0] < position:  # read again, and acked again
                self._acked_index[tp].difference_update(o for o in acked if o < position)
                acked[:] = [offset for offset in acked if offset >= position]
            run = _first_run(acked)
            if run and (position is None or run[0] == position):
                del acked[: len(run)]
                self._acked_index[tp].difference_update(run)
                position = run[-1] + 1
        done[tp] = position
        return position

    def _gap_offsets(self, tp: TP, upto: int) -> list[int]:
        """Offsets below `upto` that Faust saw skipped in the log (compacted away, or
        transaction markers): none of them is a record to ack (as Faust's `_new_offset`)."""
        gaps = self._gap[tp]
        spans = sorted(gaps.overlap(0, upto), key=lambda gap: gap.begin)
        found = [offset for gap in spans for offset in range(gap.begin, gap.end)]
        if found:
            gaps.chop(0, found[-1] + 1)
        return found

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        done: dict[TP, int | None] = self.__dict__.setdefault("_agent_done", {})
        for tp in revoked:
            done.pop(tp, None)  # its next owner goes on from the committed offset
        await super().on_partitions_revoked(revoked)

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Iterator[TP]:
        yield from super()._filter_tps_with_pending_acks(topics)
        taker = self._taker
        if taker is not None:
            progressed = set(taker.progressed())
            for tp in [*progressed, *self._recommits_due(taker, progressed)]:
                if topics is None or tp in topics or tp.topic in topics:
                    yield tp

    async def _commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """Faust's commit, except that offsets the broker did not take are not recorded as
        committed: Faust 0.15 records them whatever the commit's outcome
        (faust/transport/consumer.py, `_commit_offsets`), so an offset refused once (a
        commit held through a cooperative join, an UnknownMemberId after a broker stall) was
        never sent again while it did not move. Chaos runs under the cooperative protocol
        ended with partitions read to the end and their group offsets far behind."""
        before = {tp: self._committed_offset.get(tp) for tp in offsets}
        committed = await super()._commit_offsets(offsets, start_new_transaction)
        if not committed:
            self._committed_offset.update(before)
        return committed

    def _recommits_due(self, taker: RecordTaker, progressed: set[TP]) -> list[TP]:
        """Assigned partitions of the joins whose offset has not moved since Faust last
        committed it, every RECOMMIT_S: committed again, as aiokafka's auto-commit commits
        every position at each interval. Faust commits an offset once, and never again while
        it does not move: if the group's offset on the broker falls behind (the embedded broker
        takes a commit of an old generation while a rebalance completes,
        tests/test_broker_rebalance_commits.py), nothing would move it again, and the records
        after it would all be read again after the next failure."""
        now = time.monotonic()
        due: list[TP] = []
        checked = self.__dict__.setdefault("_recommit_checked", {})
        for tp in self.assignment():
            if tp in progressed or not taker.takes(tp.topic):
                continue
            if now - checked.setdefault(tp, now) >= RECOMMIT_S:
                checked[tp] = now
                due.append(tp)
        self.__dict__["_recommitting"] = set(due)
        return due

    def _should_commit(self, tp: TP, offset: int) -> bool:
        if super()._should_commit(tp, offset):
            return True
        recommitting: set[TP] = self.__dict__.get("_recommitting", set())
        return tp in recommitting and offset == self._committed_offset.get(tp)

    async def wait_empty(self) -> None:
        taker = self._taker
        if taker is not None:
            await taker.quiesce()
        await super().wait_empty()

    async def wait_empty_of(self, partitions: set[TP]) -> None:
        """A cooperative revoke's wait (assignor/faust_adapter/cooperative.py): the joins hand
        over `partitions` only, and go on with the others; then Faust's own wait for its
        streams' events in flight, and its commit."""
        taker = self._taker
        if taker is not None:
            await taker.quiesce(partitions)
        await super().wait_empty()


def _first_run(offsets: list[int]) -> list[int]:
    """The consecutive offsets at the head of a sorted list."""
    run = offsets[:1]
    for offset in offsets[1:]:
        if offset != run[-1] + 1:
            break
        run.append(offset)
    return run


def consumer_records(tp: TP, records: list[Any]) -> list[Any]:
    """A fetch's records of `tp` as ConsumerRecords, what a Faust stream's Event is made of
    (records left as fetched are made into one: the thread decided before a Faust stream
    was seen reading their topic)."""
    if not records or type(records[0]) is aiokafka.ConsumerRecord:
        return records
    return [
        aiokafka.ConsumerRecord(
            tp.topic, tp.partition, r.offset, r.timestamp, getattr(r, "timestamp_type", 0),
            r.key, r.value, None, len(r.key) if r.key is not None else -1,
            len(r.value) if r.value is not None else -1, list(r.headers),
        )
        for r in records
    ]  # fmt: skip


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
internals.require(__name__, FaustConsumer, "_should_commit", "assignment", "_commit_offsets")
internals.require(__name__, FaustConsumer, "_acked", "_acked_index", "_gap", instance=True)
internals.require(__name__, FaustConsumer, "on_partitions_revoked")
internals.require(__name__, Consumer, "_thread", instance=True)
internals.require(__name__, Consumer, "_getmany")
internals.require(
    __name__, AIOKafkaConsumerThread, "_create_worker_consumer", "call_thread", "seek", "_ensure_consumer"
)
internals.require(__name__, aiokafka.AIOKafkaConsumer, "_key_deserializer", "_coordinator", instance=True)
internals.require(__name__, PartitionRecords, "_consumer_record")
internals.require_probe(__name__, raw_record_problems)

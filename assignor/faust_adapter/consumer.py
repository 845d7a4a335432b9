"""Every use of private Faust and aiokafka internals, in one place.

Tandem needs a few things neither library exposes. They are written for the
versions pinned in `PINNED` (and in pyproject.toml); `check()` runs when Tandem is
installed into an app and refuses to start, naming what is missing, if the
installed versions differ or an internal it relies on is gone.

- `TandemConsumer`: Faust's aiokafka consumer, which
  - offers the assignor's protocols in preference order (Faust offers one);
  - sets the fetch wait (Faust hard-codes 1500 ms), and can read end offsets for
    Faust's table recovery from fetch responses (the embedded broker's ListOffsets is short);
  - runs start-up checks (joins' partition counts) before joining the group;
  - hands the records of join inputs to a `RecordTaker` (the join runtime) in whole
    fetches, instead of building a Faust Event and a Stream step per record, and
    commits their offsets as the taker says (only what was joined and acknowledged);
  - leaves those records as aiokafka's fetcher reads them (`RawRecords`), without
    copying each into a `ConsumerRecord`;
  - lets the taker finish its in-flight work before a revocation commits.
- `install_group_join()`: one JoinGroup offering every protocol (aiokafka 0.14 sends
  one JoinGroup per assignor).
- `delay_follower_sync()`: a follower's SyncGroup after the leader's (the embedded
  broker answers an early follower a second late).
- `set_current_partition()`: makes Faust tables, updated outside an agent, write to a
  given partition (Faust reads the partition from the current event).
- `request_rejoin()`: asks the group coordinator for a rebalance (probing rebalances);
  the group join calls the assignor's `prepare_assignment()` (changelog end offsets)
  before the leader assigns, bounded in time.
- `fill_batch()`: appends records to an aiokafka `BatchBuilder` through its record-batch
  builder, without `BatchBuilder.append`'s Python wrapper per record (the same bytes).
- `create_batch()`: an empty `BatchBuilder` as the producer makes them, but larger (the
  join sends thousands of records at once; the producer's are sized for linger).
- `collect_handler_sends()` / `handler_task()`: Faust sends queued from a join handler's
  task with their partition known (a table's changelog) are collected for the runtime to
  produce in whole record batches (`settle_sends()` then completes them as Faust would),
  instead of Faust's producer buffer sending them one by one.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.metadata
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol

import aiokafka
import aiokafka.errors as errors
import faust.streams
from aiokafka.client import AIOKafkaClient
from aiokafka.consumer import group_coordinator as gc
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.protocol.group import JoinGroupRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import RecordMetadata
from faust.events import Event
from faust.exceptions import ImproperlyConfigured
from faust.tables.manager import TableManager
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer, server_list
from faust.transport.producer import Producer as FaustProducer
from faust.types import TP, AppT
from faust.types.tuples import FutureMessage, Message, PendingMessage

log = logging.getLogger(__name__)

PINNED = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0"}


class IncompatibleInternals(ImproperlyConfigured):
    """The installed Faust or aiokafka lacks an internal Tandem relies on."""


# (owner, attribute) pairs Tandem reads, overrides or patches.
_INTERNALS: list[tuple[Any, str]] = [
    (FaustConsumer, "_wait_next_records"),
    (Consumer, "_getmany"),
    (FaustConsumer, "_new_offset"),
    (FaustConsumer, "_filter_tps_with_pending_acks"),
    (FaustConsumer, "wait_empty"),
    (AIOKafkaConsumerThread, "_create_worker_consumer"),
    (PartitionRecords, "_consumer_record"),
    (AIOKafkaConsumerThread, "_highwaters"),
    (AIOKafkaConsumerThread, "call_thread"),
    (AIOKafkaConsumerThread, "seek"),
    (gc.CoordinatorGroupRebalance, "perform_group_join"),
    (gc.CoordinatorGroupRebalance, "_on_join_follower"),
    (gc.CoordinatorGroupRebalance, "_on_join_leader"),
    (gc.GroupCoordinator, "request_rejoin"),
    (TableManager, "_recovery"),
    (aiokafka.AIOKafkaProducer, "_COMPRESSORS"),
    (faust.streams, "_current_event"),
    (FaustProducer, "send_soon"),
]


def check() -> None:
    """Refuse to run on Faust/aiokafka versions whose internals Tandem was not written for."""
    problems = []
    for package, wanted in PINNED.items():
        found = importlib.metadata.version(package)
        if found != wanted:
            problems.append(f"{package} {found} is installed, Tandem's patches are written for {wanted}")
    for owner, name in _INTERNALS:
        if not hasattr(owner, name):
            problems.append(f"{getattr(owner, '__name__', owner)}.{name} is missing")
    problems += batch_problems()
    problems += raw_record_problems()
    problems += send_problems()
    if problems:
        raise IncompatibleInternals(
            "Tandem cannot start: " + "; ".join(problems) + f". Install {PINNED} (see pyproject.toml)."
        )


# -- the consumer ------------------------------------------------------------------


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


class InputRecord(Protocol):
    """What the join runtime reads of a record it takes: aiokafka's fetched record as it
    is (`RawRecords`), or a ConsumerRecord."""

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...


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
_start_checks: weakref.WeakKeyDictionary[Any, list[StartCheck]] = weakref.WeakKeyDictionary()
StartCheck = Callable[[list[str]], Awaitable[None]]


def set_record_taker(app: AppT, taker: RecordTaker) -> None:
    _takers[app] = taker


def add_start_check(app: AppT, check_: StartCheck) -> None:
    """Run `check_(bootstrap_servers)` before the worker joins its group; it raises to stop it."""
    _start_checks.setdefault(app, []).append(check_)


class TandemConsumerThread(AIOKafkaConsumerThread):
    fetch_max_wait_ms: int | None = None
    fetch_high_watermarks = False  # the broker's ListOffsets is short (the embedded one)

    async def on_start(self) -> None:
        servers = server_list(self.transport.url, self.transport.default_port)
        for start_check in _start_checks.get(self.app, []):
            await start_check(servers)
        await super().on_start()

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        protocols = getattr(self.app.assignor, "protocols", None)
        if protocols is not None:
            # aiokafka reads this list when it creates its group coordinator, in start().
            consumer._partition_assignment_strategy = tuple(protocols())
        if self.fetch_max_wait_ms is not None:
            consumer._fetch_max_wait_ms = self.fetch_max_wait_ms  # read by the fetcher in start()
        if consumer._key_deserializer is None:  # handed to the fetcher in start()
            consumer._key_deserializer = RawRecords(self._taken_topic)
        return consumer

    def _taken_topic(self, topic: str) -> bool:
        taker = _takers.get(self.app)
        return taker is not None and taker.takes(topic)

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        """End offsets for Faust's table recovery: from fetch responses, where the broker's
        ListOffsets answers short (Faust then stops with ConsistencyError)."""
        if not self.fetch_high_watermarks:
            return await super()._highwaters(partitions)  # type: ignore[no-any-return]
        servers = server_list(self.transport.url, self.transport.default_port)
        return await fetched_high_watermarks(servers, list(partitions))


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
    PartitionRecords.__init__ = _partition_records  # type: ignore[method-assign]


def raw_record_problems() -> list[str]:
    """What RawRecords needs of aiokafka's fetcher and is missing: a probe record batch
    read through PartitionRecords must give records with the key, value, offset and
    timestamp appended, and a ConsumerRecord for a topic not taken."""
    builder = BatchBuilder(_PROBE_SIZE * 10, 0)
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


async def fetched_high_watermarks(
    bootstrap: list[str], tps: list[TP], timeout_s: float = 30.0
) -> dict[TP, int]:
    """Each partition's high watermark as a fetch response reports it (correct on every broker)."""
    if not tps:
        return {}  # a worker with only standbys: aiokafka's end_offsets([]) never returns
    probe = _probe(bootstrap)
    await probe.start()
    try:
        wanted = [aiokafka.TopicPartition(tp.topic, tp.partition) for tp in tps]
        marks = await _fetched_marks(probe, wanted, timeout_s)
        return {TP(tp.topic, tp.partition): mark for tp, mark in marks.items()}
    finally:
        await probe.stop()


def _probe(bootstrap: list[str]) -> aiokafka.AIOKafkaConsumer:
    return aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap, fetch_max_wait_ms=100, enable_auto_commit=False
    )


async def _fetched_marks(
    probe: aiokafka.AIOKafkaConsumer, wanted: list[aiokafka.TopicPartition], timeout_s: float
) -> dict[aiokafka.TopicPartition, int]:
    probe.assign(wanted)
    ends = await probe.end_offsets(wanted)  # short by up to a batch: read its last batch
    for tp in wanted:
        probe.seek(tp, max(0, int(ends[tp]) - 1))
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        marks = {tp: probe.highwater(tp) for tp in wanted}
        if None not in marks.values():
            return {tp: int(mark) for tp, mark in marks.items()}  # type: ignore[arg-type]
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no high watermark for {[tp for tp, m in marks.items() if m is None]}")
        await probe.getmany(timeout_ms=200, max_records=1)


async def end_offsets(
    bootstrap: list[str], topics: set[str], from_fetch: bool, timeout_s: float
) -> dict[str, dict[int, int]]:
    """topic -> partition -> end offset of every partition of the topics that exist: from fetch
    responses' high watermarks (`from_fetch`, for a broker whose ListOffsets is short) or from
    ListOffsets. Raises TimeoutError after `timeout_s`; the caller decides what that means."""
    probe = _probe(bootstrap)

    async def lookup() -> dict[aiokafka.TopicPartition, int]:
        await probe.start()
        cluster = await probe._client.fetch_all_metadata()
        wanted = [
            aiokafka.TopicPartition(t, p)
            for t in sorted(topics)
            for p in sorted(cluster.partitions_for_topic(t) or ())
        ]
        if not wanted:
            return {}
        if from_fetch:
            return await _fetched_marks(probe, wanted, timeout_s)
        return {tp: int(end) for tp, end in (await probe.end_offsets(wanted)).items()}

    try:
        found = await asyncio.wait_for(lookup(), timeout_s)
    finally:
        await probe.stop()
    result: dict[str, dict[int, int]] = {}
    for tp, end in found.items():
        result.setdefault(tp.topic, {})[tp.partition] = end
    return result


def request_rejoin(app: AppT) -> bool:
    """Ask the group coordinator for a rebalance (from any thread): False if the consumer has
    not started. aiokafka's coordinator then rejoins the group with fresh metadata."""
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None) if thread is not None else None
    if consumer is None or consumer._coordinator is None:
        return False
    thread.thread_loop.call_soon_threadsafe(consumer._coordinator.request_rejoin)  # type: ignore[union-attr]
    return True


class TandemConsumer(Consumer):
    """Faust's consumer with the join runtime's records taken out of its fetches."""

    # While a partition is held back, fetch waits are kept short, so it is fetched soon
    # after it is released (a fetch otherwise waits up to a second for other partitions).
    HELD_BACK_FETCH_S = 0.05
    fetch_max_wait_ms: int | None = None
    fetch_high_watermarks = False

    def _new_consumer_thread(self) -> TandemConsumerThread:
        thread = TandemConsumerThread(self, loop=self.loop, beacon=self.beacon)
        thread.fetch_max_wait_ms = self.fetch_max_wait_ms
        thread.fetch_high_watermarks = self.fetch_high_watermarks
        return thread

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
            taken = {tp: records.pop(tp) for tp in list(records) if taker.takes(tp.topic)}
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
        return super()._new_offset(tp)  # type: ignore[no-any-return]

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Iterable[TP]:
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


async def broker_partition_counts(bootstrap: list[str], topics: set[str]) -> dict[str, int]:
    """Partition counts of the topics that exist on the broker (missing ones are left out)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    try:
        await client.bootstrap()
        cluster = await client.fetch_all_metadata()
    finally:
        await client.close()
    counts = {t: len(cluster.partitions_for_topic(t) or ()) for t in topics}
    return {t: n for t, n in counts.items() if n}


def install_consumer(
    app: AppT, fetch_max_wait_ms: int | None = None, fetch_high_watermarks: bool = False
) -> None:
    """Make `app` build its consumer as a TandemConsumer (this app's transport only)."""
    transport = app.transport
    if not issubclass(transport.Consumer, Consumer):
        raise ImproperlyConfigured(f"Tandem needs Faust's aiokafka transport, not {type(transport).__name__}")
    if app.conf.producer_threaded:
        raise ImproperlyConfigured("Tandem needs producer_threaded=False (it produces on the app's loop)")
    install_raw_records()
    base = transport.Consumer if issubclass(transport.Consumer, TandemConsumer) else TandemConsumer
    settings = {"fetch_max_wait_ms": fetch_max_wait_ms, "fetch_high_watermarks": fetch_high_watermarks}
    transport.Consumer = type("TandemConsumer", (base,), settings)


def producer_of(app: AppT) -> aiokafka.AIOKafkaProducer:
    """The aiokafka producer inside Faust's producer (started with the app)."""
    return app.producer._ensure_producer()  # type: ignore[attr-defined, no-any-return]


def set_current_partition(app: AppT, topic: str, partition: int) -> Event:
    """Make Faust tables updated from here on, in this task, write to `partition`, as if
    an event of `topic` partition `partition` were being processed."""
    message = Message(topic, partition, -1, 0.0, 0, None, None, None, None, tp=TP(topic, partition))
    event = Event(app, None, None, None, message)
    faust.streams._current_event.set(weakref.ref(event))
    return event  # the caller keeps it alive: Faust holds a weak reference


# -- group membership ---------------------------------------------------------------

_ORIGINAL_JOIN = gc.CoordinatorGroupRebalance.perform_group_join
_FATAL = (
    errors.InconsistentGroupProtocolError,
    errors.InvalidSessionTimeoutError,
    errors.InvalidGroupIdError,
)


def install_group_join() -> None:
    """Idempotent: one JoinGroup offering every protocol (only multi-protocol consumers change).

    aiokafka sends its JoinGroup inside the loop over the consumer's assignors, so a
    consumer offering ``[tandem, faust]`` first joins offering only ``tandem``: that can
    settle the group on a protocol a stock Faust worker does not speak (the broker then
    rejects it with InconsistentGroupProtocol), and every rebalance costs two joins."""
    gc.CoordinatorGroupRebalance.perform_group_join = _perform_group_join  # type: ignore[method-assign]


async def _perform_group_join(self: Any) -> tuple[str, bytes] | None:
    for assignor in self._assignors:
        starting = getattr(assignor, "join_starting", None)
        if starting is not None:
            starting()  # e.g. look up end offsets while the broker holds the JoinGroup
    if len(self._assignors) < 2:
        return await _ORIGINAL_JOIN(self)  # type: ignore[no-any-return]
    protocols = [(a.name, _encoded(a.metadata(self._subscription.topics))) for a in self._assignors]
    response = await _join(self, protocols)
    if response is None:
        return None
    error_type = errors.for_code(response.error_code)
    if error_type is errors.NoError:
        return await _on_joined(self, response)
    await _on_join_error(self, error_type)
    return None


def _encoded(metadata: Any) -> bytes:
    return metadata if isinstance(metadata, bytes) else metadata.encode()


async def _join(self: Any, protocols: list[tuple[str, bytes]]) -> Any:
    """JoinGroup once (twice when the broker asks for a member id, KIP-394)."""
    coordinator = self._coordinator
    while True:
        request = JoinGroupRequest(
            self.group_id,
            self._session_timeout_ms,
            self._rebalance_timeout_ms,
            coordinator.member_id,
            coordinator._group_instance_id,
            gc.ConsumerProtocol.PROTOCOL_TYPE,
            protocols,
        )
        try:
            response = await coordinator._send_req(request)
        except errors.KafkaError:
            return None  # connection error: the coordinator lookup backs off
        if not self._subscription.active:
            return None  # subscription changed: restart the join
        if errors.for_code(response.error_code) is not errors.MemberIdRequired:
            return response
        coordinator.member_id = response.member_id


async def _on_joined(self: Any, response: Any) -> tuple[str, bytes] | None:
    coordinator = self._coordinator
    coordinator.member_id = response.member_id
    coordinator.generation = response.generation_id
    log.info(
        "Joined group %r (generation %s) with member_id %s, protocol %s",
        self.group_id,
        response.generation_id,
        response.member_id,
        response.group_protocol,
    )
    if response.leader_id == response.member_id:
        for assignor in self._assignors:
            prepare = getattr(assignor, "prepare_assignment", None)
            if prepare is not None:
                await prepare()  # bounded in time by the assignor; never raises
        assignment = await self._on_join_leader(response)
    else:
        assignment = await self._on_join_follower()
    return None if assignment is None else (response.group_protocol, assignment)


async def _on_join_error(self: Any, error_type: type[Exception]) -> None:
    coordinator = self._coordinator
    if error_type is errors.GroupLoadInProgressError:
        await asyncio.sleep(self._retry_backoff_ms / 1000)
    elif error_type is errors.UnknownMemberIdError:
        coordinator.reset_generation()
    elif error_type in (errors.GroupCoordinatorNotAvailableError, errors.NotCoordinatorForGroupError):
        coordinator.coordinator_dead()
    elif error_type in _FATAL:
        log.error("Attempt to join group failed due to fatal error: %s", error_type())
        raise error_type()
    elif error_type is errors.GroupAuthorizationFailedError:
        raise error_type(self.group_id)
    else:
        raise errors.KafkaError(repr(error_type()))


def delay_follower_sync(seconds: float) -> None:
    """Send a follower's SyncGroup `seconds` after its JoinGroup answer, so that it reaches
    the embedded broker after the leader's (once per process; it has one group consumer)."""
    original = gc.CoordinatorGroupRebalance._on_join_follower
    if getattr(original, "tandem_delay", None) is not None or seconds <= 0:
        return

    async def on_join_follower(self: Any) -> Any:
        await asyncio.sleep(seconds)
        return await original(self)

    on_join_follower.tandem_delay = seconds  # type: ignore[attr-defined]
    gc.CoordinatorGroupRebalance._on_join_follower = on_join_follower  # type: ignore[method-assign]


# -- Faust tables' changelog offsets (warm-ups) ----------------------------------------------


def faust_table_offsets(app: AppT) -> dict[str, dict[int, int]]:
    """Changelog topic -> partition -> offset held by this worker's Faust tables (not global
    ones): what standbys and warm-ups have read (Faust's recovery), and what the open RocksDB
    stores of actives persisted. A partition read to the end of an empty changelog counts as
    offset 0 (warm-ups need an offset to be caught up). Called from the consumer's thread:
    copies before it reads."""
    found: dict[str, dict[int, int]] = {}
    recovery = getattr(app.tables, "_recovery", None)  # None before the worker started
    if recovery is None:
        return found
    for offsets in (dict(recovery.active_offsets), dict(recovery.standby_offsets)):
        for tp, offset in offsets.items():
            table = recovery.tp_to_table.get(tp)
            if table is None or getattr(table, "is_global", False):
                continue
            if offset is None and faust_standby_lag(app, tp) == 0:
                offset = 0
            if offset is not None:
                found.setdefault(tp.topic, {})[tp.partition] = int(offset)
    for table in list(app.tables.values()):  # type: ignore[attr-defined]
        if getattr(table, "is_global", False):
            continue
        topic = table.changelog_topic.get_topic_name()
        for partition in list(getattr(table.data, "_dbs", {})):  # open RocksDB stores only
            persisted = table.persisted_offset(TP(topic, partition))
            if persisted is not None:
                mine = found.setdefault(topic, {})
                mine[partition] = max(int(persisted), mine.get(partition, -1))
    return found


def faust_standby_lag(app: AppT, tp: TP) -> int | None:
    """Records a Faust table's standby (or warm-up) changelog partition is behind its end,
    from the consumer's high watermark (None: not known yet)."""
    try:
        end = app.consumer.highwater(tp)
    except Exception:  # not assigned on the consumer (yet)
        return None
    if end is None:
        return None
    recovery = getattr(app.tables, "_recovery", None)
    offset = recovery.standby_offsets.get(tp) if recovery is not None else None
    return max(0, int(end) - 1 - (-1 if offset is None else int(offset)))


def committed_offsets(app: AppT) -> Mapping[TP, int | None]:
    """Faust's record of the offsets this consumer committed (or started from)."""
    return getattr(app.consumer, "_committed_offset", {})


def wake_wait_empty(app: AppT) -> None:
    """Faust's wait_empty rechecks when an ack wakes it, else after a second: wake it now."""
    from mode.utils.futures import notify

    notify(app.consumer._waiting_for_ack)  # type: ignore[attr-defined]


# -- record batches ---------------------------------------------------------------------------

RecordHeaders = Sequence[tuple[str, bytes | None]]
Pair = tuple[bytes | None, bytes | None]
Triple = tuple[bytes | None, bytes | None, RecordHeaders]

# BatchBuilder's instance attributes fill_batch reads or sets (not on the class: set in __init__).
_BATCH_ATTRIBUTES = ("_builder", "_relative_offset", "_closed", "_key_serializer", "_value_serializer")
# A probe for check(): in a batch of _PROBE_SIZE bytes, the last record does not fit.
_PROBE: list[Triple] = [(b"k", b"v" * 8, [("h", b"1")]), (None, b"w" * 8, ()), (b"k", None, [("h", None)])]
_PROBE_SIZE = 100
_PROBE_MS = 1_700_000_000_000
_NO_HEADERS: list[Any] = []  # for records without headers (the builder only reads it)


def fill_batch(
    batch: BatchBuilder,
    records: Sequence[Pair] | Sequence[Triple],
    headers: RecordHeaders = (),
    start: int = 0,
    timestamp_ms: int | None = None,
) -> int:
    """Append `records[start:]` to `batch` until it is full; return how many went in.

    Records are all (key, value), each with `headers`, or all (key, value, its own
    headers). The batch is byte for byte what `batch.append()` per record builds, and is
    closed, as append closes it, when a record does not fit; `timestamp_ms` None stamps
    each record with the time it is appended (as append does). What this saves is
    append's Python wrapper: ~0.25-0.3 us per record (benchmarks/bench_producing.py)."""
    if batch._closed or start >= len(records):
        return 0
    if batch._key_serializer is not None or batch._value_serializer is not None:
        return _fill_by_append(batch, records, headers, start, timestamp_ms)
    before = batch._relative_offset
    if len(records[start]) == 2:
        fitted = _append_pairs(batch, records, list(headers), start, timestamp_ms)  # type: ignore[arg-type]
    else:
        fitted = _append_triples(batch, records, start, timestamp_ms)  # type: ignore[arg-type]
    if not fitted:
        batch.close()
    return int(batch._relative_offset - before)


def _append_pairs(
    batch: BatchBuilder, records: Sequence[Pair], on_each: list[Any], start: int, timestamp_ms: int | None
) -> bool:
    """Whether all of records[start:] went in; the batch's record count follows every append."""
    append = batch._builder.append
    offset = batch._relative_offset
    try:
        for i in range(start, len(records)):
            key, value = records[i]
            if append(offset, timestamp_ms, key, value, on_each) is None:
                return False
            offset += 1
        return True
    finally:
        batch._relative_offset = offset


def _append_triples(
    batch: BatchBuilder, records: Sequence[Triple], start: int, timestamp_ms: int | None
) -> bool:
    """As _append_pairs, each record with its own headers (the builder takes only a list)."""
    append = batch._builder.append
    offset = batch._relative_offset
    try:
        for i in range(start, len(records)):
            key, value, own = records[i]
            if type(own) is not list:
                own = list(own) if own else _NO_HEADERS
            if append(offset, timestamp_ms, key, value, own) is None:
                return False
            offset += 1
        return True
    finally:
        batch._relative_offset = offset


def _fill_by_append(
    batch: BatchBuilder,
    records: Sequence[Pair] | Sequence[Triple],
    headers: RecordHeaders,
    start: int,
    timestamp_ms: int | None,
) -> int:
    """The public path, for a producer with serializers (Faust's has none)."""
    on_each = list(headers)
    for i in range(start, len(records)):
        record = records[i]
        own = list(record[2] or ()) if len(record) > 2 else on_each  # type: ignore[misc]
        if batch.append(key=record[0], value=record[1], timestamp=timestamp_ms, headers=own) is None:
            return i - start
    return len(records) - start


def batch_problems(builder_type: type[BatchBuilder] = BatchBuilder) -> list[str]:
    """What fill_batch needs of aiokafka's BatchBuilder and is missing, or a probe batch
    it fills differing from the same records appended one by one."""
    name = builder_type.__name__
    filled, appended = builder_type(_PROBE_SIZE, 0), builder_type(_PROBE_SIZE, 0)
    missing = [attribute for attribute in _BATCH_ATTRIBUTES if not hasattr(filled, attribute)]
    if missing:
        return [f"{name}.{attribute} is missing" for attribute in missing]
    for key, value, own in _PROBE:
        appended.append(key=key, value=value, timestamp=_PROBE_MS, headers=list(own))
    try:
        fill_batch(filled, _PROBE, timestamp_ms=_PROBE_MS)
        same = (filled.record_count(), filled.closed(), filled._builder.build()) == (
            appended.record_count(),
            appended.closed(),
            appended._builder.build(),
        )
    except Exception as error:  # e.g. the record-batch builder's append changed its arguments
        return [f"{name}: fill_batch fails ({error!r})"]
    return [] if same else [f"{name}: fill_batch builds other bytes than {name}.append"]


# The producer's instance attributes create_batch reads (set in its __init__).
_PRODUCER_ATTRIBUTES = ("_compression_type", "_txn_manager", "_key_serializer", "_value_serializer")
# Record batches of the join's own sends (changelog, results, dead letters): the producer's
# own are `producer_max_batch_size` (16 KB by default), made for records trickling in under
# linger_ms; the join hands over thousands at once, and 16 KB batches meant ~40 produce
# requests per partition and batch, one after the other (docs/bench/worker.md). Within
# Kafka's default 1 MB per batch (message.max.bytes).
JOIN_BATCH_BYTES = 512 * 1024


def producer_problems(producer: aiokafka.AIOKafkaProducer) -> list[str]:
    """What create_batch needs of an aiokafka producer and is missing."""
    missing = [name for name in _PRODUCER_ATTRIBUTES if not hasattr(producer, name)]
    return [f"AIOKafkaProducer.{name} is missing" for name in missing]


def create_batch(producer: aiokafka.AIOKafkaProducer, size: int = JOIN_BATCH_BYTES) -> BatchBuilder:
    """An empty record batch of up to `size` bytes, with the producer's compression,
    transactions and serializers, as `producer.create_batch()` makes one."""
    txn, codec = producer._txn_manager, producer._compression_type
    return BatchBuilder(
        size,
        producer._COMPRESSORS[codec][1] if codec else 0,  # the codec's attribute bits
        is_transactional=txn is not None and txn.transactional_id is not None,
        key_serializer=producer._key_serializer,
        value_serializer=producer._value_serializer,
    )


# -- Faust sends from a join handler ----------------------------------------------------

# The list a join handler's task collects its Faust sends into (None: any other task).
_HANDLER_SENDS: contextvars.ContextVar[list[FutureMessage] | None] = contextvars.ContextVar(
    "tandem_handler_sends", default=None
)
# What settle_sends and the collector read of a queued message (faust.types.tuples.PendingMessage).
_PENDING_FIELDS = ("channel", "key", "value", "partition", "timestamp", "headers", "callback")


def send_problems() -> list[str]:
    missing = [name for name in _PENDING_FIELDS if name not in PendingMessage._fields]
    return [f"PendingMessage.{name} is missing" for name in missing]


def handler_task(
    coro: Coroutine[Any, Any, None], sends: list[FutureMessage], name: str
) -> asyncio.Task[None]:
    """Run a join handler as a task whose Faust sends are collected into `sends` (once
    `collect_handler_sends` is installed): see there."""
    context = contextvars.copy_context()
    context.run(_HANDLER_SENDS.set, sends)
    return asyncio.create_task(coro, name=name, context=context)


def collect_handler_sends(app: AppT) -> None:
    """Idempotent: a message Faust queues (`send_soon`) from a join handler's own task, with
    its partition known and its key and value serialized to bytes, is appended to that
    handler's list (`handler_task`) instead of Faust's producer buffer. A table updated in
    the handler queues one changelog message per update, which Faust's buffer sends one at a
    time, each its own produce call and future: ~50 us a message (docs/bench/worker.md).
    The runtime produces the collected ones in whole record batches with the batch's other
    output and completes them (`settle_sends`): same records, same order per partition, same
    callbacks (a table's persisted offset). Anything else (another task, no partition yet, a
    timestamp of its own, a transaction) takes Faust's way, unchanged."""
    producer = app.producer
    if getattr(producer, "_tandem_collects", False):
        return
    faust_send_soon = producer.send_soon

    def send_soon(fut: FutureMessage) -> None:
        sends = _HANDLER_SENDS.get()
        message = fut.message
        if (
            sends is None
            or message.partition is None
            or message.timestamp is not None
            or type(message.key) not in (bytes, type(None))
            or type(message.value) not in (bytes, type(None))
            or app.in_transaction
        ):
            faust_send_soon(fut)
        else:
            sends.append(fut)

    producer.send_soon = send_soon  # type: ignore[method-assign]
    producer._tandem_collects = True  # type: ignore[attr-defined]


def collected_records(sends: Sequence[FutureMessage]) -> dict[tuple[str, int], list[FutureMessage]]:
    """Collected messages by topic and partition, in the order they were queued."""
    found: dict[tuple[str, int], list[FutureMessage]] = {}
    for fut in sends:
        message = fut.message
        found.setdefault((message.channel.get_topic_name(), message.partition), []).append(fut)
    return found


def send_record(fut: FutureMessage) -> Triple:
    """(key, value, headers) of a collected message, as Faust's producer would send it."""
    message = fut.message
    headers = message.headers
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    return message.key, message.value, headers or ()


def settle_sends(futs: Sequence[FutureMessage], acks: Sequence[tuple[RecordMetadata, int]]) -> None:
    """Complete collected messages sent as record batches whose acks (a batch's first
    record's metadata, its record count) came in the messages' order: each gets its own
    offset, then its callback runs (a table's `_on_changelog_sent`), as Faust does on an ack."""
    at = 0
    for ack, count in acks:
        tp = ack.topic_partition
        for i in range(count):
            fut = futs[at]
            at += 1
            fut.set_result(
                RecordMetadata(
                    ack.topic, ack.partition, tp, ack.offset + i, ack.timestamp, ack.timestamp_type,
                    ack.log_start_offset,
                )
            )  # fmt: skip
            callback = fut.message.callback
            if callback is not None:
                callback(fut)


def fail_sends(futs: Iterable[FutureMessage], error: BaseException) -> None:
    """Collected messages that could not be sent: their futures say why, as Faust's do."""
    for fut in futs:
        if not fut.done():
            fut.set_exception(error)

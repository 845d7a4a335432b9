"""The join runtime: everything between a fetch of join input and committed offsets.

One `Runtime` per app takes the records of every join's inputs out of Faust's
consumer in whole fetches (assignor/faust_adapter/consumer.py: no Faust Event or Stream per
record) and gives each join's `JoinRunner` its own. A runner, per batch:

1. checks each record (tables/records/codecs.py): bad ones are dead-lettered with the reason,
   null values dropped and counted;
2. holds the good ones and releases each partition's in event-time order across both
   inputs (tables/records/alignment.py);
3. joins them on the partition's RocksDB state (tables/operators/windowed.py, tables/state/manager.py);
4. hands the results to the app's handler (tables/runtime/results.py) and waits until it has
   taken them all;
5. has the handler's sends, the dead letters and Faust's own pending sends
   acknowledged, then writes the changelog and the state with its checkpoint;
6. only then moves the offset Faust may commit for each input partition, never past a
   record still held (at-least-once on every path).

On a rebalance, new active partitions are held back (not fetched) while their state is
restored in the background; the others keep going. Before a revocation or a stop the
in-flight batch finishes, held records are dropped to be read again, and Faust commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson
from faust.types import TP, AppT
from faust.types.tuples import FutureMessage

from assignor.faust_adapter import consumer as faust_internals
from assignor.faust_adapter.consumer import InputRecord
from tables.api import JoinSpec
from tables.kafka.batches import changelog_configs, create_topics, start_sending
from tables.operators import windowed as operator
from tables.operators.keys import Side
from tables.operators.windowed import Match
from tables.records import codecs
from tables.records.alignment import Aligner
from tables.records.codecs import CATEGORIES, DROPPED, Rejected, SideCodec, key_check, value_form
from tables.records.partitioners import find_misplaced, misplaced_reason, partitions_for
from tables.runtime.gcpacing import collection_deferred, raise_gc_threshold
from tables.runtime.probing import Prober
from tables.runtime.results import Feed, JoinResults, Outgoing, Serializers
from tables.settings import RuntimeSettings
from tables.state.datadir import DataDirLock
from tables.state.manager import JoinState, Moves
from tables.state.store import StoreCorruptError, local_checkpoints
from tables.web.metrics import REBALANCE_KINDS, LatencyBuckets

log = logging.getLogger(__name__)

ALIGN_CHECK_S = 0.25  # held records are looked at this often when no input comes
LOOP_TURN_S = 0.01  # a batch lets the event loop run at least this often while checking
OFFSETS_REFRESH_S = 2.0  # local offsets for the assignor
HANDLER_FAILURES_WITHOUT_PROGRESS = 3
MISPLACED_WARN_EVERY_S = 60.0  # a warning per input at most this often
DAY_MS = 24 * 3600 * 1000

Item = tuple[Side, bytes, int, bytes, bytes]  # side, key, ts, record id, value
Letter = tuple[str, int, int, bytes | None, bytes | None, Rejected]  # topic, partition, offset, key, value


@dataclass
class Rebalance:
    """What the last assignment did to one join on this worker."""

    epoch: int = 0
    started: float = field(default_factory=time.time)
    kept: list[int] = field(default_factory=list)
    moved_warm: list[int] = field(default_factory=list)
    moved_cold: list[int] = field(default_factory=list)
    replayed: dict[int, int] = field(default_factory=dict)
    seconds: float | None = None  # until every new active was restored

    def as_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "moved_warm": self.moved_warm,
            "moved_cold": self.moved_cold,
            "replayed": sum(self.replayed.values()),
            "replayed_by_partition": {str(p): n for p, n in sorted(self.replayed.items())},
            "seconds": self.seconds,
        }


@dataclass
class JoinStats:
    """Counters of one join on this worker (since the process started)."""

    read: dict[str, int] = field(default_factory=lambda: {"left": 0, "right": 0})
    null_values: dict[str, int] = field(default_factory=lambda: {"left": 0, "right": 0})
    dead_letters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    results: int = 0
    unmatched: int = 0  # of `results`: a record without a partner (left, right, outer joins)
    results_by_partition: dict[int, int] = field(default_factory=dict)
    batches: int = 0
    faust_sends: int = 0  # Faust messages the handler queued (its tables' changelogs), sent with the output
    handler_restarts: int = 0
    failure: str | None = None  # why the join stopped the worker
    rebalance_partitions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REBALANCE_KINDS, 0))
    latency: LatencyBuckets = field(default_factory=LatencyBuckets)  # event time -> output acknowledged


def split_fetch(records: dict[TP, list[InputRecord]], limit: int) -> list[dict[TP, list[InputRecord]]]:
    """A fetch cut into pieces of at most `limit` records, in order (each partition's
    records stay in offset order across the pieces)."""
    chunks: list[dict[TP, list[InputRecord]]] = [{}]
    room = limit
    for tp, found in records.items():
        if not found:
            chunks[-1][tp] = found
        start = 0
        while start < len(found):
            if room == 0:
                chunks.append({})
                room = limit
            piece = found[start : start + room]
            chunks[-1][tp] = piece
            start += len(piece)
            room -= len(piece)
    return chunks


def merge_fetches(chunks: list[dict[TP, list[InputRecord]]]) -> dict[TP, list[InputRecord]]:
    """Pieces of a fetch joined back into one (the inverse of split_fetch)."""
    merged: dict[TP, list[InputRecord]] = {}
    for chunk in chunks:
        for tp, found in chunk.items():
            merged.setdefault(tp, []).extend(found)
    return merged


class JoinRunner:
    """One declared join on this worker."""

    def __init__(self, spec: JoinSpec, runtime: Runtime) -> None:
        self.spec = spec
        self.runtime = runtime
        self.app = spec.app
        settings = runtime.settings
        self.sides: dict[str, Side] = {spec.left.name: "left", spec.right.name: "right"}
        self.codecs: dict[Side, SideCodec] = {
            "left": _codec(spec, spec.left, settings),
            "right": _codec(spec, spec.right, settings),
        }
        self.aligner: Aligner[Item] = Aligner(
            list(spec.input_topics),
            max_wait_s=settings.align_max_wait_ms / 1000,
            max_held=settings.align_max_held,
        )
        self.stats = JoinStats()
        self.rebalance = Rebalance()
        self.rebalances = 0
        self.rebalance_history: deque[Rebalance] = deque(maxlen=10)  # for the view
        self._unmatched = bool(spec.join_type.unmatched_sides)
        self.state: JoinState | None = None  # opened at the first assignment
        self.partitions: int | None = None  # the inputs' partition count (start check)
        self.held_back: set[TP] = set()  # inputs of partitions being restored
        self.ahead: set[TP] = set()  # inputs read far ahead of their partner (Aligner.ahead)
        # Records of those inputs fetched before the pause took effect, kept out of the
        # aligner (in offset order) until their input is resumed: the pause is exact.
        self.deferred: dict[TP, list[InputRecord]] = {}
        self.read_next: dict[TP, int] = {}  # after the last record taken into a batch
        self.commit_at: dict[TP, int] = {}  # what Faust may commit
        self.feed = Feed()
        # Values built on arrival (checked and validated) in this batch, by the id of their
        # bytes, with the bytes kept alive: a result takes one instead of building it again.
        self.built: dict[int, tuple[bytes, Any]] = {}
        self.outbox: list[Outgoing] = []
        # Faust sends the handler queued with their partition known (its tables' changelogs),
        # produced with the batch's output (faust_internals.collect_handler_sends).
        self.faust_sends: list[FutureMessage] = []
        self._queue: asyncio.Queue[dict[TP, list[InputRecord]]] = asyncio.Queue(maxsize=8)
        self._last_turn = time.monotonic()  # when this runner last let the event loop run
        self._leftover: deque[dict[TP, list[InputRecord]]] = deque()  # the rest of a cut fetch
        self._working = asyncio.Lock()
        self._revoking = False
        self._loop_task: asyncio.Task[None] | None = None
        self._handler_task: asyncio.Task[None] | None = None
        self._restore_task: asyncio.Task[None] | None = None
        self._handler_failures = 0
        self._misplaced_warned: dict[str, float] = {}  # topic -> when its last warning was logged
        self._dropped_from: dict[TP, int] = {}  # first offset dropped since the last assignment

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run(), name=f"tandem-join-{self.spec.name}")
        if self._handler_task is None or self._handler_task.done():
            self._start_handler()

    async def stop(self) -> None:
        await self.quiesce()
        for task in (self._loop_task, self._handler_task, self._restore_task):
            await _cancel(task)
        self._loop_task = self._handler_task = self._restore_task = None
        if self.state is not None:
            await self.state.close()

    def _start_handler(self) -> None:
        results: JoinResults[Any, Any, Any] = JoinResults(
            self.app,
            self.feed,
            self.spec.left.name,
            self.codecs["left"].key,
            self.codecs["left"].value,
            self.codecs["right"].value,
            self.outbox,
            self.runtime.serializers,
        )
        self._handler_task = faust_internals.handler_task(
            self.spec.handler(results), self.faust_sends, f"tandem-handler-{self.spec.name}"
        )

    # -- taking input ---------------------------------------------------------------

    async def take(self, records: dict[TP, list[InputRecord]]) -> None:
        if self._revoking:
            await self.dropped(records)  # read again after the rebalance
            return
        monitor = getattr(self.app, "monitor", None)
        if monitor is not None:  # Faust's livelock detector watches this
            now = time.monotonic()
            for tp in records:
                monitor.stream_inbound_time[tp] = now
        await self._queue.put(records)

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch(self.runtime.settings.batch_max_records)
            async with self._working:
                if self._revoking or self.state is None:
                    await self.dropped(merge_fetches(batch))  # taken after the quiesce drained
                    continue
                try:
                    with collection_deferred(self.runtime.settings.gc_batch_threshold):
                        await self._process(batch)
                    continue
                except Exception as exc:
                    failure = exc
            # Outside the lock: stopping the worker quiesces this runner, which takes it.
            await self._fail(failure)
            return

    async def _next_batch(self, limit: int) -> list[dict[TP, list[InputRecord]]]:
        """Whole fetches up to `limit` records; a larger fetch (a backlog can hold tens of
        thousands) is cut, its rest kept for the next batches, so that no batch holds the
        event loop (web view, metrics, timers) for seconds. Empty after ALIGN_CHECK_S
        without input (held records are looked at then)."""
        if self._leftover:
            fetch = self._leftover.popleft()
        else:
            try:
                fetch = await asyncio.wait_for(self._queue.get(), ALIGN_CHECK_S)
            except TimeoutError:
                return [{}]
        batch: list[dict[TP, list[InputRecord]]] = []
        count = 0
        while True:
            size = sum(map(len, fetch.values()))
            if batch and count + size > limit:
                self._leftover.appendleft(fetch)
                return batch
            if size > limit:
                first, *rest = split_fetch(fetch, limit)
                self._leftover.extendleft(reversed(rest))
                fetch, size = first, limit
            batch.append(fetch)
            count += size
            if count >= limit:
                return batch
            if self._leftover:
                fetch = self._leftover.popleft()
            elif not self._queue.empty():
                fetch = self._queue.get_nowait()
            else:
                return batch

    async def _fail(self, exc: Exception) -> None:
        """A batch could not be written (broker or disk) or its state read: nothing of it was
        committed, so nothing is lost; the worker stops rather than skip it (it is read
        again after the restart). A store found damaged is first moved aside, so the restart
        restores it from the changelog instead of failing on it again."""
        log.critical("tandem: join %r stops the worker: %s", self.spec.name, exc, exc_info=exc)
        state = self.state
        for partition in state.actives() if state else []:
            state.discard(partition)  # type: ignore[union-attr]
            damaged = (
                isinstance(exc, StoreCorruptError) and state.partitions[partition].store.path == exc.path
            )  # type: ignore[union-attr]
            if damaged:
                state.set_aside(partition, exc)  # type: ignore[union-attr, arg-type]
        self.stats.failure = f"{exc.__class__.__name__}: {exc}"
        await self.app.crash(exc)  # type: ignore[attr-defined]

    # -- one batch --------------------------------------------------------------------

    async def _process(self, fetches: list[dict[TP, list[InputRecord]]]) -> None:
        state = self.state
        assert state is not None
        letters: list[Letter] = []
        touched: set[int] = set()
        resumed = self._resume_deferred()
        for fetch in [resumed, *fetches]:
            for tp, records in fetch.items():
                if tp.partition not in state.ready or not records:
                    continue
                if fetch is not resumed and (tp in self.ahead or tp in self.deferred):
                    self.deferred.setdefault(tp, []).extend(records)  # after those deferred before
                    continue
                self._check(tp, records, letters)
                touched.add(tp.partition)
                await self._give_turn()
        processed: list[int] = []
        latest: list[int] = []  # event time of each partition's last result (the latency histogram)
        feed: list[tuple[int, Match]] = []
        for partition in sorted(touched | set(self.aligner.holding())):
            if partition not in state.ready:
                continue
            items = self._release(partition)
            if not items:
                continue
            await asyncio.sleep(0)  # a large batch must not keep the web server and timers waiting
            join = state.active(partition).join
            matches = join.process_many(items)
            processed.append(partition)
            if matches:
                latest.append(matches[-1].timestamp)
            feed.extend(zip(repeat(partition), matches))
            self.stats.results_by_partition[partition] = self.stats.results_by_partition.get(
                partition, 0
            ) + len(matches)
        if feed:
            self.stats.results += len(feed)
            if self._unmatched:
                self.stats.unmatched += sum(1 for _, m in feed if m.left is None or m.right is None)
            self.feed.built = self.built
            await self._handle(feed, letters)
        self.built = self.feed.built = {}
        await self._send_output(letters)
        producer = faust_internals.producer_of(self.app)
        await asyncio.gather(*(state.commit(p, producer) for p in processed))
        self._move_commit_offsets(touched | set(processed))
        self._note_ahead()
        self.stats.batches += 1
        self.stats.latency.observe_since(latest)

    async def _give_turn(self) -> None:
        """Let the event loop run (web view, timers) if this runner has kept it LOOP_TURN_S:
        batches that release nothing (one input read far ahead of the other) await nothing
        else, and the web view needs several turns of the loop to answer."""
        if time.monotonic() - self._last_turn > LOOP_TURN_S:
            await asyncio.sleep(0)
            self._last_turn = time.monotonic()

    def _check(self, tp: TP, records: list[InputRecord], letters: list[Letter]) -> None:
        side = self.sides[tp.topic]
        partition, topic = tp.partition, tp.topic
        self.stats.read[side] += len(records)
        last_read = records[-1].offset
        misplaced = self._misplaced(tp, records)
        if misplaced:
            records = self._letter_misplaced(tp, records, misplaced, letters)
            if not records:  # every record dead-lettered: all of them are done
                self.read_next[tp] = last_read + 1
                return
        accept = self.codecs[side].accept
        offsets: list[int] = []
        stamps: list[int] = []
        items: list[Item] = []
        built = self.built
        nulls = 0
        for record in records:
            key, value, offset = record.key, record.value, record.offset
            checked = accept(key, value, offset, record.timestamp)
            if type(checked) is tuple:
                ts = checked[0]
                offsets.append(offset)
                stamps.append(ts)
                items.append((side, key, ts, checked[1], value))
                if checked[2] is not None:
                    built[id(value)] = (value, checked[2])
            elif checked is DROPPED:
                nulls += 1
            else:
                letters.append((topic, partition, offset, key, value, checked))
        # The others (dead letters, null values) count as read too, up to the last (a fetch of a
        # partition is in offset order), as `skip` had it one by one.
        self.aligner.add_many(partition, topic, offsets, stamps, items, last_read)
        if nulls:
            self.stats.null_values[side] += nulls
        self.read_next[tp] = records[-1].offset + 1

    def _misplaced(self, tp: TP, records: list[InputRecord]) -> dict[int, int]:
        """Index -> the partition its key belongs to, for records on the wrong partition: they
        could never meet their partner (a producer with another partitioner)."""
        partitioner, count = self.spec.partitioner, self.partitions
        if partitioner == "none" or not count:
            return {}
        keys = [r.key for r in records]
        return {m.index: m.expected for m in find_misplaced(keys, tp.partition, count, partitioner)}

    def _letter_misplaced(
        self, tp: TP, records: list[InputRecord], misplaced: dict[int, int], letters: list[Letter]
    ) -> list[InputRecord]:
        """Dead-letter the misplaced records (checked first, as the batch twin does); the rest."""
        partitioner = self.spec.partitioner
        for index, expected in misplaced.items():
            record = records[index]
            reason = misplaced_reason(tp.partition, expected, partitioner)  # type: ignore[arg-type]
            letters.append((tp.topic, tp.partition, record.offset, record.key, record.value,
                            Rejected(reason, "wrong_partition")))  # fmt: skip
            self.aligner.skip(tp.partition, tp.topic, record.offset)
        now = time.monotonic()
        if now - self._misplaced_warned.get(tp.topic, -MISPLACED_WARN_EVERY_S) >= MISPLACED_WARN_EVERY_S:
            self._misplaced_warned[tp.topic] = now
            example = next(iter(misplaced))
            log.warning(
                "tandem: join %r: %s record(s) of %s read from partition %s belong to another partition "
                "under %s (e.g. offset %s belongs to %s): dead-lettered; check the producer's partitioner",
                self.spec.name, len(misplaced), tp.topic, tp.partition, partitioner,
                records[example].offset, misplaced[example],
            )  # fmt: skip
        return [r for i, r in enumerate(records) if i not in misplaced]

    def _release(self, partition: int) -> list[Item]:
        """Held records of the partition now due, given how far each input has been read."""
        consumer = self.app.consumer
        committed = faust_internals.committed_offsets(self.app)
        ends: dict[str, int | None] = {}
        starts: dict[str, int | None] = {}
        for topic in self.spec.input_topics:
            tp = TP(topic, partition)
            try:
                ends[topic] = consumer.highwater(tp)  # None until a fetch has seen it
            except (AssertionError, KeyError, Exception):
                ends[topic] = None
            starts[topic] = committed.get(tp)
        return self.aligner.release(partition, ends, starts)

    def _resume_deferred(self) -> dict[TP, list[InputRecord]]:
        """Deferred records of inputs no longer paused, oldest first, to be taken before anything
        fetched after them: per partition up to what fills half the aligner's cap (at least a
        batch, so that an input holding the release back always moves on); the rest stays
        deferred (hours of backlog can be in flight: all of it at once would hit the cap)."""
        resumed: dict[TP, list[InputRecord]] = {}
        room: dict[int, int] = {}
        half, batch = self.aligner.max_held // 2, self.runtime.settings.batch_max_records
        for tp in [tp for tp in self.deferred if tp not in self.ahead]:
            if tp.partition not in room:
                room[tp.partition] = max(half - self.aligner.held(tp.partition), batch)
            take, records = room[tp.partition], self.deferred[tp]
            if take <= 0:
                continue
            if take >= len(records):
                resumed[tp] = self.deferred.pop(tp)
            else:
                resumed[tp], self.deferred[tp] = records[:take], records[take:]
            room[tp.partition] -= len(resumed[tp])
        return resumed

    def _note_ahead(self) -> None:
        """Stop fetching the inputs the aligner holds too much of, until their partner catches
        up: what the fetcher is not handed stays on the broker, not in memory."""
        ahead = {TP(t, p) for p, topics in self.aligner.ahead().items() for t in topics}
        if ahead != self.ahead:
            log.debug("tandem: join %r: reads of %s paused (event-time order)", self.spec.name, sorted(ahead))
        self.ahead = ahead

    def _move_commit_offsets(self, partitions: Iterable[int]) -> None:
        read_next, commit_at, first_held = self.read_next, self.commit_at, self.aligner.first_held
        for partition in partitions:
            firsts = first_held(partition)
            for topic in self.spec.input_topics:
                tp = TP(topic, partition)
                read = read_next.get(tp)
                if read is None:
                    continue
                held = firsts.get(topic)
                commit_at[tp] = read if held is None or read < held else held

    # -- the handler ----------------------------------------------------------------------

    async def _handle(self, items: list[tuple[int, Match]], letters: list[Letter]) -> None:
        """Hand the batch's results to the handler; wait until it has asked past the last.
        A result that makes the handler raise is dead-lettered, and the handler restarted."""
        done = self.feed.start(items)
        while True:
            handler = self._handler_task
            assert handler is not None
            await asyncio.wait({done, handler}, return_when=asyncio.FIRST_COMPLETED)
            if done.done():
                self._handler_failures = 0
                return
            start = self._handler_failed(handler, items, letters)
            self._start_handler()
            if start >= len(items):
                self.feed.finish()
                return
            done = self.feed.start(items, start)

    def _handler_failed(
        self, handler: asyncio.Task[None], items: list[tuple[int, Match]], letters: list[Letter]
    ) -> int:
        """Dead-letter what the handler was handling when it stopped; where to go on."""
        error = None if handler.cancelled() else handler.exception()
        at = max(self.feed.index - 1, 0)
        self.stats.handler_restarts += 1
        self._handler_failures += 1
        if self._handler_failures > HANDLER_FAILURES_WITHOUT_PROGRESS:
            raise RuntimeError(f"the handler of join {self.spec.name!r} keeps failing") from error
        reason = f"the handler raised {error!r}" if error else "the handler returned instead of iterating"
        log.error("tandem: join %r: %s; result dead-lettered, handler restarted", self.spec.name, reason,
                  exc_info=error)  # fmt: skip
        if error is None:
            return at
        partition, match = items[at]
        value = orjson.dumps(
            {
                "left": _text(match.left),
                "right": _text(match.right),
                "timestamp": match.timestamp,
            }
        )
        letters.append(("", partition, -1, match.key, value, Rejected(reason[:500], "handler_error")))
        return at + 1

    # -- output -------------------------------------------------------------------------------

    async def _send_output(self, letters: list[Letter]) -> None:
        """The handler's sends, its tables' changelogs and the dead letters, in whole
        batches; then Faust's own pending sends (the handler's other `topic.send()`s); all
        acknowledged."""
        producer = faust_internals.producer_of(self.app)
        size = self.runtime.settings.send_batch_bytes
        outbox, self.outbox[:] = list(self.outbox), []
        acks: list[tuple[object, int]] = []
        for (topic, partition), records in (await self._by_partition(outbox)).items():
            acks += await start_sending(producer, topic, partition, records, batch_bytes=size)
        faust_acks = await self._start_faust_sends(producer, size)
        for partition, records in self._letters(letters).items():
            acks += await start_sending(
                producer, self.spec.dead_letter_topic, partition, records, batch_bytes=size
            )
        for letter in letters:
            self.stats.dead_letters[letter[5].category] += 1
        await self.app.producer.flush()
        for future, _ in acks:
            await future  # type: ignore[misc]
        for futs, sent in faust_acks:
            try:
                metadata = [(await future, count) for future, count in sent]  # type: ignore[misc]
            except BaseException as error:
                faust_internals.fail_sends(futs, error)
                raise
            faust_internals.settle_sends(futs, metadata)

    async def _start_faust_sends(
        self, producer: Any, size: int
    ) -> list[tuple[list[FutureMessage], list[tuple[object, int]]]]:
        """Start producing the Faust messages the handler queued (its tables' changelogs), per
        topic and partition in the order queued; what to await and settle."""
        sends, self.faust_sends[:] = list(self.faust_sends), []
        self.stats.faust_sends += len(sends)
        started = []
        for (topic, partition), futs in faust_internals.collected_records(sends).items():
            records = [faust_internals.send_record(fut) for fut in futs]
            started.append((futs, await start_sending(producer, topic, partition, records, batch_bytes=size)))
        return started

    async def _by_partition(
        self, outbox: list[Outgoing]
    ) -> dict[tuple[str, int], list[tuple[bytes | None, bytes | None, Any]]]:
        """Each record's partition: given, or its key's under Kafka's murmur2 (a whole batch at
        once), or the result's own when the key is the join key and the topic has the join's
        partition count (the input's partitioner was checked to be murmur2)."""
        counts: dict[str, int] = {}
        for topic in {o[0] for o in outbox if o[1] is None}:
            counts[topic] = len(await faust_internals.producer_of(self.app).partitions_for(topic))
        same = self.spec.partitioner == "murmur2"
        unplaced = [
            i
            for i, o in enumerate(outbox)
            if o[1] is None and not (same and o[5] is not None and counts[o[0]] == self.partitions)
        ]
        placed: dict[int, int] = {}
        for topic in {outbox[i][0] for i in unplaced}:
            mine = [i for i in unplaced if outbox[i][0] == topic]
            found = partitions_for([outbox[i][2] for i in mine], counts[topic], "murmur2")  # type: ignore[misc]
            placed.update(zip(mine, found.tolist(), strict=True))
        grouped: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, Any]]] = {}
        for i, (topic, partition, key, value, headers, same_key) in enumerate(outbox):
            if partition is None:
                partition = placed.get(i, same_key)
            grouped.setdefault((topic, partition), []).append((key, value, headers))  # type: ignore[arg-type]
        return grouped

    def _letters(self, letters: list[Letter]) -> dict[int, list[tuple[bytes | None, bytes | None, Any]]]:
        out: dict[int, list[tuple[bytes | None, bytes | None, Any]]] = {}
        for topic, partition, offset, key, value, why in letters:
            letter = {
                "join": self.spec.name,
                "topic": topic or None,
                "partition": partition,
                "offset": offset if offset >= 0 else None,
                "reason": why.reason,
                "category": why.category,
                "key": _text(key),
                "value": _text(value),
            }
            out.setdefault(partition, []).append((key, orjson.dumps(letter), ()))
        return out

    # -- rebalances ----------------------------------------------------------------------------

    async def assign(
        self, active: set[int], standby: set[int], epoch: int, warmup: set[int] | None = None
    ) -> None:
        """Open, close and start restoring this join's partitions for a new assignment."""
        await _cancel(self._restore_task)
        self._restore_task = None
        if self.state is None:
            self.state = self.runtime.open_state(self.spec)
        moves = await self.state.assign(active, standby, warmup or ())
        for partition in set(self.aligner.holding()) - active:
            self.aligner.drop_partition(partition)
        self.deferred = {}  # (emptied by the quiesce before) read again from the rewind below
        for tp in [tp for tp in self.read_next if tp.partition not in active]:
            self.read_next.pop(tp, None)
            self.commit_at.pop(tp, None)
        self.held_back = {TP(t, p) for p in moves.to_restore for t in self.spec.input_topics}
        self._note_ahead()
        # Where each active input must be read from: what this worker had not finished, or what
        # it dropped during the rebalance (Faust seeks the rest to their committed offsets).
        restart = {tp: self.commit_at.get(tp, first) for tp, first in self._dropped_from.items()}
        restart |= {tp: offset for tp, offset in self.commit_at.items() if tp not in restart}
        self._dropped_from = {}
        await self._rewind({tp: o for tp, o in restart.items() if tp.partition in active})
        self.rebalances += 1
        self.rebalance = _rebalance(moves, epoch)
        self.rebalance_history.append(self.rebalance)
        for kind in REBALANCE_KINDS:
            self.stats.rebalance_partitions[kind] += len(getattr(self.rebalance, kind))
        log.info(
            "tandem: join %r assigned actives %s standbys %s warm-ups %s: kept %s, warm %s, cold %s; "
            "restoring %s",
            self.spec.name, sorted(active), self.state.standbys(), self.state.warmups(), moves.kept,
            moves.warm, moves.cold, moves.to_restore,
        )  # fmt: skip
        self._revoking = False
        self.start()
        self._restore_task = asyncio.create_task(self._restore(moves.to_restore))

    async def _restore(self, partitions: list[int]) -> None:
        """Restore in the background, retrying after failures; each partition is released
        to the fetcher as soon as it is ready."""
        assert self.state is not None
        rebalance = self.rebalance
        backoff, failing_since = 1.0, None
        while partitions:
            try:
                await self.state.restore(partitions, self._ready)
                break
            except Exception as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.exception(
                        "tandem: join %r: restore of %s failed; retrying", self.spec.name, partitions
                    )
                else:
                    log.error(
                        "tandem: join %r: restore of %s failed again: %r", self.spec.name, partitions, exc
                    )
                if now - failing_since > self.runtime.settings.restore_stall_s:
                    await self._fail(exc)  # bounded: the worker stops, saying why
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                before = len(partitions)
                partitions = [p for p in partitions if p not in self.state.ready]
                if len(partitions) < before:  # progress: the clock starts again
                    failing_since, backoff = None, 1.0
        for partition, progress in self.state.recovery.progress.items():
            if partition in rebalance.moved_warm + rebalance.moved_cold:
                rebalance.replayed[partition] = progress.restored
        rebalance.seconds = round(time.time() - rebalance.started, 3)
        log.info(
            "tandem: join %r restored in %s s: kept %s, moved warm %s, moved cold %s; %s records replayed",
            self.spec.name, rebalance.seconds, rebalance.kept, rebalance.moved_warm, rebalance.moved_cold,
            sum(rebalance.replayed.values()),
        )  # fmt: skip

    def _ready(self, partition: int) -> None:
        self.held_back -= {TP(t, partition) for t in self.spec.input_topics}
        self.rebalance.replayed[partition] = self.state.recovery.progress[partition].restored  # type: ignore[union-attr]

    async def quiesce(self) -> None:
        """Before a revocation or a stop: finish the batch in flight, then drop what is
        held or queued (read again afterwards, from the offsets Faust now commits)."""
        self._revoking = True
        try:
            await asyncio.wait_for(self._working.acquire(), self.runtime.quiesce_timeout_s)
        except TimeoutError:
            log.error("tandem: join %r: batch still in flight; cancelled (read again)", self.spec.name)
            await _cancel(self._loop_task)
            self._loop_task = None
            for partition in self.state.actives() if self.state else []:
                self.state.discard(partition)  # type: ignore[union-attr]
            await self._working.acquire()
        try:
            restart = dict(self.commit_at)
            queued = list(self._leftover)  # cut from fetches taken before those still queued
            self._leftover.clear()
            while not self._queue.empty():
                queued.append(self._queue.get_nowait())
            queued.append(self.deferred)
            self.deferred = {}
            for fetch in queued:
                for tp, records in fetch.items():
                    if records:
                        restart.setdefault(tp, records[0].offset)
            for tp, offset in restart.items():
                if tp not in self.commit_at:
                    # Nothing of it done yet: a fetch dropped after this (taken across the
                    # rebalance) starts later, and must not move the restart past this one.
                    self._dropped_from[tp] = min(self._dropped_from.get(tp, offset), offset)
            held = self.aligner.held()
            self.aligner.forget()
            self._note_ahead()
            if held:
                log.info("tandem: join %r: %s held records left to be read again", self.spec.name, held)
            await self._rewind(restart)
        finally:
            self._working.release()

    async def dropped(self, records: dict[TP, list[InputRecord]]) -> None:
        """Fetched records that will not be joined now: their partitions are set back to the
        first record not done, or to the first dropped, so that they are read again."""
        restart = {}
        for tp, found in records.items():
            if found:
                first = min(self._dropped_from.get(tp, found[0].offset), found[0].offset)
                self._dropped_from[tp] = first
                restart[tp] = self.commit_at.get(tp, first)
        await self._rewind(restart)

    async def _rewind(self, restart: dict[TP, int]) -> None:
        """Set each input partition's position back to its first record not done. Faust only
        seeks a partition that has a committed offset above 0 after a rebalance (aiokafka's
        seek_to_committed): without this, what was dropped before the first commit of a kept
        partition would never be read again."""
        for tp, offset in restart.items():
            self.read_next[tp] = offset
            try:
                await faust_internals.seek(self.app, tp, offset)
            except Exception as exc:  # stopping, or no longer assigned: its next owner reads it
                log.debug("tandem: no seek of %s to %s: %r", tp, offset, exc)

    # -- what the view and the assignor read ------------------------------------------------

    def local_offsets(self) -> dict[int, int]:
        if self.state is None:
            return self.runtime.offsets_on_disk(self.spec)
        return self.state.local_offsets()


def _codec(spec: JoinSpec, side: Any, settings: RuntimeSettings) -> SideCodec:
    app = spec.app
    topic = side.topic
    key_serializer = topic.key_serializer or app.conf.key_serializer
    value_serializer = topic.value_serializer or app.conf.value_serializer

    def loads_key(raw: bytes) -> Any:
        return app.serializers.loads_key(topic.key_type, raw, serializer=key_serializer)

    def loads_value(raw: bytes) -> Any:
        return app.serializers.loads_value(topic.value_type, raw, serializer=value_serializer)

    return SideCodec(
        side.name,
        key_check(topic.key_type, key_serializer, loads_key),
        value_form(topic.value_type, value_serializer, loads_value),
        timestamp=side.timestamp,
        record_id=side.id,
        validate=side.validate,
        max_value_bytes=spec.max_value_bytes,
    )


def _rebalance(moves: Moves, epoch: int) -> Rebalance:
    return Rebalance(
        epoch=epoch,
        started=moves.started,
        kept=moves.kept,
        moved_warm=moves.warm,
        moved_cold=moves.cold,
        seconds=None if moves.to_restore else 0.0,
    )


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


async def _cancel(task: asyncio.Task[Any] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


# -- the runtime of an app --------------------------------------------------------------


class Runtime:
    """Every join of one app: the consumer's record taker, rebalance hooks, state, views."""

    def __init__(self, app: AppT, settings: RuntimeSettings | None = None) -> None:
        self.app = app
        self.settings = settings or RuntimeSettings.from_env()
        self.runners: dict[str, JoinRunner] = {}
        self._by_topic: dict[str, JoinRunner] = {}
        self.serializers = Serializers(app)
        self._offsets: dict[str, dict[int, int]] = {}  # read by the assignor's thread
        self._installed = False
        self._timer: asyncio.Task[None] | None = None
        self._lock: DataDirLock | None = None
        self.prober = Prober(self)
        self._prober: asyncio.Task[None] | None = None

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir or Path(self.app.conf.datadir) / "tandem-joins"

    @property
    def quiesce_timeout_s(self) -> float:
        return max(1.0, min(10.0, float(self.app.conf.broker_session_timeout) * 0.5))

    def specs(self) -> list[JoinSpec]:
        return [r.spec for r in self.runners.values()]

    def add(self, spec: JoinSpec) -> None:
        """Register a declared join (at import time: nothing is read or started here)."""
        if not self._installed:
            self._install()
        runner = JoinRunner(spec, self)
        self.runners[spec.name] = runner
        for topic in spec.input_topics:
            self._by_topic[topic] = runner
        from assignor.faust_adapter.partition_assignor import declare_join

        declare_join(
            self.app, topics=[*spec.input_topics, *spec.table_changelogs()], changelog=spec.changelog_topic
        )
        for topic in (spec.left.topic, spec.right.topic):
            self.app.topics.add(topic)  # Faust subscribes the consumer to what its conductor holds

    def _install(self) -> None:
        from assignor.faust_adapter.partition_assignor import install

        # The join's own check first: it names the join and creates the join's topics.
        faust_internals.add_start_check(self.app, self._before_joining)
        install(self.app, local_offsets=self.local_offsets)
        faust_internals.set_record_taker(self.app, self)
        self.app.on_partitions_assigned.connect(self._on_assigned)
        self.app.on_before_shutdown.connect(self._on_shutdown)
        if self.app.conf.web_enabled:
            from tables.web.view import register_views

            register_views(self.app, self)
        self._installed = True

    # -- RecordTaker (called by the consumer, on the app's loop) --------------------------

    def takes(self, topic: str) -> bool:
        return topic in self._by_topic

    async def take(self, records: dict[TP, list[Any]]) -> None:
        by_runner: dict[str, dict[TP, list[Any]]] = {}
        for tp, found in records.items():
            by_runner.setdefault(self._by_topic[tp.topic].spec.name, {})[tp] = found
        for name, taken in by_runner.items():
            await self.runners[name].take(taken)

    async def dropped(self, records: dict[TP, list[Any]]) -> None:
        by_runner: dict[str, dict[TP, list[Any]]] = {}
        for tp, found in records.items():
            by_runner.setdefault(self._by_topic[tp.topic].spec.name, {})[tp] = found
        for name, dropped in by_runner.items():
            await self.runners[name].dropped(dropped)

    def held_back(self) -> set[TP]:
        held: set[TP] = set()
        for runner in self.runners.values():
            held |= runner.held_back | runner.ahead
        return held

    def commit_offset(self, tp: TP) -> int | None:
        return self._by_topic[tp.topic].commit_at.get(tp)

    def progressed(self) -> Iterable[TP]:
        committed = faust_internals.committed_offsets(self.app)
        for runner in self.runners.values():
            for tp, offset in list(runner.commit_at.items()):
                if offset > (committed.get(tp) or 0):
                    yield tp

    async def quiesce(self) -> None:
        await asyncio.gather(*(r.quiesce() for r in self.runners.values()))

    # -- start-up and rebalances ---------------------------------------------------------------

    async def _before_joining(self, bootstrap: list[str]) -> None:
        """Before the worker joins its group: partition counts, the join's own topics, and
        the local offsets found on disk (reported at the first JoinGroup)."""
        from tables.runtime.startup import prepare_topics
        from tables.state.datadir import check_data_dir, lock_data_dir

        if self._lock is None:  # one worker per data dir, for the life of the process
            check_data_dir(self.data_dir)
            self._lock = lock_data_dir(self.data_dir)
            raise_gc_threshold(self.settings.gc_threshold)
        problems = faust_internals.producer_problems(faust_internals.producer_of(self.app))
        if problems:
            raise faust_internals.IncompatibleInternals("Tandem cannot start: " + "; ".join(problems))
        faust_internals.collect_handler_sends(self.app)
        log.info(
            "tandem: the join's per-record loop is %s",
            "compiled (tables/_fastjoin)"
            if operator.COMPILED
            else "pure Python (tables.operators._fastjoin not built, or TANDEM_PURE_PYTHON=1): about half as fast",
        )
        in_python = [
            f"{runner.spec.name} {side}"
            for runner in self.runners.values()
            for side, codec in runner.codecs.items()
            if not codec.compiled
        ]
        if not in_python:
            check = "compiled (tables/_fastcheck)"
        elif codecs.COMPILED:
            check = f"pure Python for {', '.join(in_python)}: configurations _fastcheck does not cover"
        else:
            check = "pure Python (tables.records._fastcheck not built, or TANDEM_PURE_PYTHON=1)"
        log.info("tandem: the per-record input check is %s", check)
        for runner in self.runners.values():
            runner.partitions = await prepare_topics(runner.spec, ",".join(bootstrap))
        self.refresh_offsets()

    async def _on_assigned(self, sender: AppT, assigned: set[TP], **kwargs: Any) -> None:
        assignor = self.app.assignor
        standby_tps = set(assignor.assigned_standbys())  # warm-ups included (Kafka-wise standbys)
        warmups = assignor.warmups() if hasattr(assignor, "warmups") else {}
        epoch = int(getattr(assignor, "epoch", 0) or 0)
        for runner in self.runners.values():
            topics = {*runner.spec.input_topics, runner.spec.changelog_topic}
            active = {tp.partition for tp in assigned if tp.topic == runner.spec.left.name}
            standby = {tp.partition for tp in standby_tps if tp.topic in topics}
            warmup = set(warmups.get(runner.spec.changelog_topic, ()))
            await runner.assign(active, standby - warmup, epoch, warmup)
        self.refresh_offsets()
        if self._timer is None:
            self._timer = asyncio.create_task(self._refresh_offsets_every())
        if self._prober is None:
            self._prober = asyncio.create_task(self.prober.run())

    async def _on_shutdown(self, sender: AppT, **kwargs: Any) -> None:
        await _cancel(self._timer)
        await _cancel(self._prober)
        for runner in self.runners.values():
            await runner.stop()

    # -- local state --------------------------------------------------------------------------

    def open_state(self, spec: JoinSpec) -> JoinState:
        return JoinState(
            ",".join(faust_internals.server_list(self.app.conf.broker, 9092)),
            spec.changelog_topic,
            self.data_dir,
            window=spec.window,
            join_type=spec.join_type,
            ids=spec.left.id is not None or spec.right.id is not None,
            table=spec.name,
            sync_writes=self.settings.sync_writes,
            stall_timeout_s=self.settings.restore_stall_s,
            send_batch_bytes=self.settings.send_batch_bytes,
        )

    def offsets_on_disk(self, spec: JoinSpec) -> dict[int, int]:
        return local_checkpoints(self.data_dir, spec.name)

    def local_offsets(self) -> dict[str, dict[int, int]]:
        """Changelog offsets of the state on this disk, per join changelog (the assignor
        reads this at every JoinGroup, on the consumer's thread: a cached value)."""
        return self._offsets

    def refresh_offsets(self) -> None:
        self._offsets = {r.spec.changelog_topic: r.local_offsets() for r in self.runners.values()}

    async def _refresh_offsets_every(self) -> None:
        while True:
            await asyncio.sleep(OFFSETS_REFRESH_S)
            self.refresh_offsets()


_runtimes: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()


def runtime_of(app: AppT) -> Runtime:
    """The app's join runtime (made at its first join)."""
    runtime = _runtimes.get(app)
    if runtime is None:
        faust_internals.check()
        runtime = _runtimes[app] = Runtime(app)
    return runtime


async def create_join_topics(spec: JoinSpec, bootstrap: str, partitions: int, replication: int = 1) -> None:
    """The join's changelog and dead-letter topic, with the inputs' partition count."""
    w = spec.window
    retention = w.before + w.after + w.grace + DAY_MS  # Kafka Streams' window store default
    await create_topics(
        bootstrap,
        {spec.changelog_topic: partitions, spec.dead_letter_topic: partitions},
        {spec.changelog_topic: changelog_configs(retention)},
        replication,
    )

"""One declared join on this worker, from a fetch of its input to committed offsets
(Kafka Streams' StreamTask, for every partition of the join this worker owns).

A `JoinTask`, per batch:

1. checks each record (`Intake`: tables/runtime/intake.py): bad ones are dead-lettered with
   the reason, null values dropped and counted; holds the good ones and releases each
   partition's in event-time order across the join's inputs;
2. hands each partition's released records to its operator (tables/operators/), over the
   partition's RocksDB state (tables/state/): the task knows the operator only by its
   interface (`Operator`), never by its kind;
3. hands the results to the app's handler (`Handler`: tables/runtime/handler.py) and waits
   until it has taken them all;
4. has the handler's sends, the dead letters and Faust's own pending sends acknowledged
   (`Collector`: tables/runtime/output.py), then writes each partition's changelog and,
   only after its acknowledgement, the state with its checkpoint;
5. only then moves the offset Faust may commit for each input partition, never past a
   record still held (at-least-once on every path).

On a rebalance, new active partitions are held back (not fetched) while their state is
restored in the background (tables/runtime/restore.py); the others keep going. Before a
revocation or a stop the in-flight batch finishes, held records are dropped to be read
again, and Faust commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any, Protocol

from faust.types import TP, AppT

from tables.kafka.consumer import InputRecord
from tables.operators.base import InputEvent, Match, Operator, counters_of, join_events
from tables.records.sides import Letter
from tables.runtime.gcpacing import collection_deferred
from tables.runtime.handler import Handler
from tables.runtime.intake import Fetch, Intake
from tables.runtime.output import PROCESS, Collector
from tables.runtime.ports import InputOffsets, Producer
from tables.runtime.restore import Restore, rebalance_of
from tables.runtime.results import Serializers
from tables.runtime.stats import REBALANCE_KINDS, InputSnapshot, JoinStats, Rebalance
from tables.settings import RuntimeSettings
from tables.spec import JoinSpec
from tables.state.manager import JoinState
from tables.state.store import StoreCorruptError

log = logging.getLogger(__name__)

ALIGN_CHECK_S = 0.25  # held records are looked at this often when no input comes
IDLE_CHECK_S = 1.0  # with `idle`, quiet partitions' clocks are looked at (and committed) this often
LOOP_TURN_S = 0.01  # a batch lets the event loop run at least this often while checking
# A partition's records are checked and joined this many at a time, the event loop given a turn
# in between: on a loaded machine a whole fetch (thousands of records) stalled it for a second.
CHUNK_RECORDS = 1000


class Worker(Protocol):
    """What a task needs of the worker that runs it (tables/runtime/worker.py)."""

    settings: RuntimeSettings
    serializers: Serializers

    @property
    def quiesce_timeout_s(self) -> float: ...

    @property
    def offsets(self) -> InputOffsets:
        """The inputs' high watermarks and committed offsets."""
        ...

    def producer(self) -> Producer:
        """Where the changelog's record batches go, each acknowledged."""
        ...

    def open_state(self, spec: JoinSpec) -> JoinState: ...

    def offsets_on_disk(self, spec: JoinSpec) -> dict[int, int]: ...

    async def rewind(self, restart: dict[TP, int]) -> None:
        """Seek: input partitions set back to their first record not done."""
        ...

    async def crash(self, exc: Exception) -> None:
        """A batch could not be committed: stop (its input is read again after the restart)."""
        ...


def split_fetch(records: Fetch, limit: int) -> list[Fetch]:
    """A fetch cut into pieces of at most `limit` records, in order (each partition's
    records stay in offset order across the pieces)."""
    chunks: list[Fetch] = [{}]
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


def merge_fetches(chunks: list[Fetch]) -> Fetch:
    """Pieces of a fetch joined back into one (the inverse of split_fetch)."""
    merged: Fetch = {}
    for chunk in chunks:
        for tp, found in chunk.items():
            merged.setdefault(tp, []).extend(found)
    return merged


class JoinTask:
    """One declared join on this worker."""

    def __init__(
        self, spec: JoinSpec, worker: Worker, *, stats: JoinStats | None = None, own_loop: bool = True
    ) -> None:
        """`stats`: counters to go on with (a test driver's restart); `own_loop`: False when the
        caller hands each batch to `batch()` itself (the test driver) instead of `take()`."""
        self.spec = spec
        self.worker = worker
        self.app: AppT = spec.app
        self.settings = worker.settings
        self.stats = stats or JoinStats()
        self.own_loop = own_loop
        self.intake = Intake(spec, self.settings, self.stats, worker.offsets)
        self.collector = Collector(spec, self.settings.send_batch_bytes, self.stats)
        self.handler = Handler(
            spec, self.intake.codecs["left"], self.intake.codecs["right"], self.collector, worker.serializers,
            self.stats,
        )  # fmt: skip
        self.rebalance = Rebalance()
        self.rebalances = 0
        self.rebalance_history: deque[Rebalance] = deque(maxlen=10)  # for the view
        self._unmatched = spec.kind.emits_unmatched()
        self.state: JoinState | None = None  # opened at the first assignment
        self.held_back: set[TP] = set()  # inputs of partitions being restored
        self._queue: asyncio.Queue[Fetch] = asyncio.Queue(maxsize=8)
        self._queued: dict[TP, int] = {}  # fetches in _queue with records of each input partition
        self._last_turn = time.monotonic()  # when this task last let the event loop run
        self._leftover: deque[Fetch] = deque()  # the rest of a cut fetch
        self._working = asyncio.Lock()
        self._revoking = False  # a full quiesce (eager revoke, stop): nothing is taken until assigned
        # Partitions handed over by a cooperative revoke: their records are dropped, not joined,
        # until the next assignment (the others go on as they are).
        self._released: set[int] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._restore: Restore | None = None
        self._dropped_from: dict[TP, int] = {}  # first offset dropped since the last assignment
        # The `idle` option: the clock (seconds; the test driver's is its own), and per partition
        # when a record last arrived and the stream time after it (the clock's base).
        self.clock: Callable[[], float] = time.monotonic
        self._heard: dict[int, tuple[float, int | None]] = {}
        self._idle_checked = 0.0

    @property
    def partitions(self) -> int | None:
        """The inputs' partition count (the start-up check)."""
        return self.intake.partitions

    @partitions.setter
    def partitions(self, count: int) -> None:
        self.intake.partitions = self.collector.partitions = count

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        if self.own_loop and (self._loop_task is None or self._loop_task.done()):
            self._loop_task = asyncio.create_task(self._run(), name=f"tandem-join-{self.spec.name}")
        self.handler.start()

    async def stop(self) -> None:
        await self.quiesce()
        await _cancel(self._loop_task)
        self._loop_task = None
        await self.handler.stop()
        if self._restore is not None:
            await self._restore.cancel()
        if self.state is not None:
            await self.state.close()

    # -- taking input ---------------------------------------------------------------

    async def take(self, records: Fetch) -> None:
        if self._revoking:
            await self.dropped(records)  # read again after the rebalance
            return
        if self._released:
            records = self._without_released(records)
        monitor = getattr(self.app, "monitor", None)
        if monitor is not None:  # Faust's livelock detector watches this
            now = time.monotonic()
            for tp in records:
                monitor.stream_inbound_time[tp] = now
        queued = self._queued
        for tp, found in records.items():
            if found:
                queued[tp] = queued.get(tp, 0) + 1
        await self._queue.put(records)

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch(self.settings.batch_max_records)
            try:
                await self.batch(batch)
                if self.spec.idle_ms is not None and self.clock() - self._idle_checked >= IDLE_CHECK_S:
                    await self.advance_idle()
                continue
            except Exception as exc:
                failure = exc
            # Outside the lock: stopping the worker quiesces this task, which takes it.
            await self.fail(failure)
            return

    async def batch(self, fetches: list[Fetch]) -> None:
        """One batch of fetched records, from the checks to the committed state (what the
        task's loop runs for each batch; the test driver calls it for each of its batches).
        Raises if the batch could not be committed (nothing of it is then)."""
        async with self._working:
            if self._revoking or self.state is None:
                await self.dropped(merge_fetches(fetches))  # taken after the quiesce drained
                return
            if self._released:
                fetches = [self._without_released(fetch) for fetch in fetches]
            with collection_deferred(self.settings.gc_batch_threshold):
                await self._process(fetches)

    def _without_released(self, fetch: Fetch) -> Fetch:
        """A fetch without the records of partitions handed over: their next owner reads them
        from the offset committed at the handover."""
        return {tp: records for tp, records in fetch.items() if tp.partition not in self._released}

    async def advance(self, stream_time: int) -> None:
        """Stream time moves to `stream_time` (ms) without a record on every ready partition that
        has seen one (a punctuation): what falls due by then is handed over and committed as a
        batch."""
        async with self._working:
            state = self.state
            if state is None:
                return
            running = [p for p in state.actives() if p in state.ready and p not in self._released]
            operators = {p: state.active(p).operator for p in running}
            # A partition that has seen no record holds nothing that could fall due.
            matches = {
                p: op.advance(stream_time) for p, op in operators.items() if op.stream_time is not None
            }
            await self._hand_over(matches, [], set(matches))

    async def advance_idle(self) -> None:
        """The `idle` option: each ready partition whose inputs are read to their end, with
        nothing held for event-time order, on which no record has arrived for `idle_ms` of the
        clock, has its stream time moved to what it was after its last record plus the time
        since (event time taken to pass as the wall clock does). What falls due is handed over,
        marked idle in the audit, and committed as a batch with the other partitions moved."""
        idle_ms = self.spec.idle_ms
        async with self._working:
            state = self.state
            if idle_ms is None or state is None or self._revoking:
                return
            now = self._idle_checked = self.clock()
            matches: dict[int, list[Match]] = {}
            for partition in state.actives():
                if partition not in state.ready or partition in self._released:
                    continue
                operator = state.active(partition).operator
                heard_at, base = self._heard.setdefault(partition, (now, operator.stream_time))
                quiet_ms = int((now - heard_at) * 1000)
                if base is None or quiet_ms < idle_ms or not self._read_to_end(partition):
                    continue  # (a partition that has seen no record holds nothing that could fall due)
                target = base + quiet_ms
                if operator.stream_time is not None and target > operator.stream_time:
                    matches[partition] = operator.advance(target)
            # Committed only when something came out: a quiet partition's clock moves every
            # second, and writing its stream time each time would fill the changelog for
            # nothing (uncommitted, it goes with the partition's next batch; lost in a crash,
            # the clock starts again from the stream time the state has).
            if any(matches.values()):
                await self._hand_over(matches, [], set(matches), idle=True)

    def _read_to_end(self, partition: int) -> bool:
        """Both inputs of the partition taken to their high watermarks, nothing held or waiting."""
        intake = self.intake
        if intake.aligner.held(partition) or any(tp.partition == partition for tp in intake.deferred):
            return False
        return intake.input_lag(partition) == 0

    def _heard_from(self, partitions: Iterable[int]) -> None:
        """Records arrived on these partitions now: their idle clocks start again from the
        stream time they have after this batch."""
        state, now = self.state, self.clock()
        if state is None or self.spec.idle_ms is None:
            return
        for partition in partitions:
            if partition in state.ready and partition in state.actives():
                self._heard[partition] = (now, state.active(partition).operator.stream_time)

    async def _next_batch(self, limit: int) -> list[Fetch]:
        """Whole fetches up to `limit` records; a larger fetch (a backlog can hold tens of
        thousands) is cut, its rest kept for the next batches, so that no batch holds the
        event loop (web view, metrics, timers) for seconds. Empty after ALIGN_CHECK_S
        without input (held records are looked at then)."""
        if self._leftover:
            fetch = self._leftover.popleft()
        else:
            try:
                fetch = self._dequeued(await asyncio.wait_for(self._queue.get(), ALIGN_CHECK_S))
            except TimeoutError:
                return [{}]
        batch: list[Fetch] = []
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
                fetch = self._dequeued(self._queue.get_nowait())
            else:
                return batch

    def _dequeued(self, fetch: Fetch) -> Fetch:
        queued = self._queued
        for tp, found in fetch.items():
            if found and tp in queued:
                queued[tp] -= 1
                if not queued[tp]:
                    del queued[tp]
        return fetch

    def _heard_waiting(self) -> None:
        """Tell the aligner which inputs have records fetched and waiting (queued, the rest of
        a cut fetch, kept aside): a batch that held the worker for a minute is not their
        silence (an input let go for it had its partner's later records joined first)."""
        waiting = set(self._queued)
        waiting.update(tp for fetch in self._leftover for tp, found in fetch.items() if found)
        waiting.update(tp for tp, found in self.intake.deferred.items() if found)
        heard = self.intake.aligner.heard
        for tp in waiting:
            heard(tp.partition, tp.topic)

    async def fail(self, exc: Exception) -> None:
        """A batch could not be written (broker or disk) or its state read, or a restore
        stalled: nothing of it was committed, so nothing is lost; the worker stops rather than
        skip it (it is read again after the restart). A store found damaged is first moved
        aside, so the restart restores it from the changelog instead of failing on it again."""
        log.critical("tandem: join %r stops the worker: %s", self.spec.name, exc, exc_info=exc)
        state = self.state
        for partition in state.actives() if state else []:
            assert state is not None  # the loop runs only with a state
            state.discard(partition)
            damaged = (
                isinstance(exc, StoreCorruptError) and state.partitions[partition].store.path == exc.path
            )
            if damaged:
                state.set_aside(partition, exc)  # type: ignore[arg-type]
        self.stats.failure = f"{exc.__class__.__name__}: {exc}"
        await self.worker.crash(exc)

    # -- one batch --------------------------------------------------------------------

    async def _process(self, fetches: list[Fetch]) -> None:
        state = self.state
        assert state is not None
        intake = self.intake
        letters: list[Letter] = []
        touched: set[int] = set()
        taken, not_ready = intake.take(fetches, state.ready)
        if not_ready:
            # Fetched before the partition was held back for its restore (a fetch in flight
            # when the assignment came): its position is past them, so without a rewind they
            # would never be read (a moved partition then stalled for good, seen under the
            # cooperative protocol, where the newly assigned inputs are fetched at once).
            await self.dropped(not_ready)
        for fetch in taken:
            for tp, records in fetch.items():
                for start in range(0, len(records), CHUNK_RECORDS):
                    intake.check(tp, records[start : start + CHUNK_RECORDS], letters)
                    await self._give_turn()
                touched.add(tp.partition)
        self._heard_waiting()
        matches: dict[int, list[Match]] = {}  # of each partition with records released, in order
        for partition in sorted(touched | set(intake.aligner.holding())):
            if partition not in state.ready:
                continue
            events = intake.release(partition)
            if not events:
                continue
            await asyncio.sleep(0)  # a large batch must not keep the web server and timers waiting
            matches[partition] = await self._join(state.active(partition).operator, events)
        await self._hand_over(matches, letters, touched)
        self._heard_from(touched)

    async def _hand_over(
        self, matches: dict[int, list[Match]], letters: list[Letter], touched: set[int], idle: bool = False
    ) -> None:
        """The rest of a batch, after the operators: the results to the handler, its sends and
        the dead letters acknowledged, then each partition's changelog and state (`matches`:
        partition -> its results, for each partition whose operator took or advanced; `idle`:
        released by idle partitions' clocks, so marked in the audit and counted)."""
        state = self.state
        assert state is not None
        intake = self.intake
        latest: list[int] = []  # event time of each partition's last result (the latency histogram)
        feed: list[tuple[int, Match]] = []
        by_partition = self.stats.results_by_partition
        for partition, found in matches.items():
            if found:
                latest.append(found[-1].timestamp)
                feed.extend(zip(repeat(partition), found))
            by_partition[partition] = by_partition.get(partition, 0) + len(found)
        if feed:
            self.stats.results += len(feed)
            if self._unmatched:
                self.stats.unmatched += sum(1 for _, m in feed if m.left is None or m.right is None)
            if idle:
                self.stats.idle_results += len(feed)
            if self.spec.audit:
                self.collector.audit(feed, idle)
            await self.handler.handle(feed, intake.built, letters)
        intake.built = {}
        await self.collector.send(letters)
        producer = self.worker.producer()
        # The changelogs side by side (their round trips overlap), then each partition's state
        # written with the loop given a turn in between: written in the acks' callbacks, a
        # batch's partitions held the loop for all their writes at once.
        checkpoints = await asyncio.gather(
            *(state.send_changes(p, producer, intake.positions(p)) for p in matches)
        )
        for partition, checkpoint in zip(matches, checkpoints, strict=True):
            state.write(partition, checkpoint)
            await self._give_turn()
        intake.batch_done(touched | set(matches))
        self.stats.batches += 1
        self.stats.latency.observe_since(latest)

    async def _join(self, operator: Operator, events: list[InputEvent]) -> list[Match]:
        """The operator's matches for a partition's events, CHUNK_RECORDS at a time (the same
        as all at once: it takes them in order), the event loop given turns in between; a
        null-keyed record (of a side that takes them) is a result with no partner at once."""
        if len(events) <= CHUNK_RECORDS:
            return join_events(operator.process_many, events)
        matches: list[Match] = []
        for start in range(0, len(events), CHUNK_RECORDS):
            matches += join_events(operator.process_many, events[start : start + CHUNK_RECORDS])
            await self._give_turn()
        return matches

    async def _give_turn(self) -> None:
        """Let the event loop run (web view, timers) if this task has kept it LOOP_TURN_S:
        batches that release nothing (one input read far ahead of the other) await nothing
        else, and the web view needs several turns of the loop to answer."""
        if time.monotonic() - self._last_turn > LOOP_TURN_S:
            await asyncio.sleep(0)
            self._last_turn = time.monotonic()

    # -- rebalances ----------------------------------------------------------------------------

    async def assign(
        self, active: set[int], standby: set[int], epoch: int, warmup: set[int] | None = None
    ) -> None:
        """Open, close and start restoring this join's partitions for a new assignment. Never
        under a batch: a cooperative round does not stop the task's loop, so the batch in
        flight finishes first, or is cancelled after the quiesce timeout as at a revoke (the
        restore is stopped before: it may stop the worker, which quiesces the task)."""
        if self._restore is not None:
            await self._restore.cancel()
        if not await self._finish_batch_in_flight():
            self._revoking = True  # every partition's state was discarded: all is read again
            await self._forget_everything()
        try:
            await self._assign(active, standby, epoch, warmup or set())
        finally:
            self._working.release()

    async def _assign(self, active: set[int], standby: set[int], epoch: int, warmup: set[int]) -> None:
        if self.state is None:
            self.state = self.worker.open_state(self.spec)
        # No full quiesce since the last assignment (a cooperative round): what is held and
        # queued of the partitions kept still stands.
        intact = not self._revoking
        moves = await self.state.assign(active, standby, warmup)
        self._heard = {}  # the idle clocks start again (a partition's first look sets them)
        self.intake.keep_only(active)  # (a revoke before dropped what it held of the rest)
        self._released = set()
        self.held_back = {TP(t, p) for p in moves.to_restore for t in self.spec.input_topics}
        # A kept partition goes on as it is after a round with no full quiesce: what it holds
        # stands, and its position is where its last fetch left it. (What was dropped of it
        # meanwhile, while it restored, was set back at once: `dropped`.)
        going_on = {p for p in moves.kept if p in self.state.ready} if intact else set()
        # Where each other active input must be read from: what this worker had not finished, or
        # what it dropped during the rebalance (Faust seeks the rest to their committed offsets).
        commit_at = self.intake.commit_at
        restart = {tp: commit_at.get(tp, first) for tp, first in self._dropped_from.items()}
        restart |= {tp: offset for tp, offset in commit_at.items() if tp not in restart}
        self._dropped_from = {}
        await self._rewind(
            {tp: o for tp, o in restart.items() if tp.partition in active and tp.partition not in going_on}
        )
        for partition in moves.kept:  # read again from the first record held: some after it are done
            if partition in self.state.ready and partition not in going_on:
                self.intake.resume_from(partition, self.state.positions(partition))
        self.rebalances += 1
        self.collector.writer = f"{PROCESS}.{self.rebalances}"  # audit records: a new writer
        self.rebalance = rebalance_of(moves, epoch)
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
        self._restore = Restore(self.spec.name, self.state, self.rebalance, self.settings.restore_stall_s)
        self._restore.start(moves.to_restore, self._ready, self.fail)

    async def restored(self) -> None:
        """Until the partitions of the last assignment are restored (the test driver waits)."""
        if self._restore is not None:
            await self._restore.wait()

    def _ready(self, partition: int) -> None:
        self.held_back -= {TP(t, partition) for t in self.spec.input_topics}
        if self.state is not None:  # read from the group's committed offset: what the state holds is done
            self.intake.resume_from(partition, self.state.positions(partition))

    async def quiesce(self, partitions: set[int] | None = None) -> None:
        """Before a revocation or a stop: finish the batch in flight, then drop what is
        held or queued (read again afterwards, from the offsets Faust now commits).
        `partitions`: a cooperative revoke's, handed over to another worker: only what is held
        of them is dropped, and the other partitions go on as they are."""
        if partitions is None:
            self._revoking = True
        else:
            self._released |= partitions  # from now on: not taken, not joined
        if not await self._finish_batch_in_flight():
            self._revoking, partitions = True, None  # every partition's state was discarded
        try:
            if partitions is None:
                await self._forget_everything()
            else:
                held = self.intake.hand_over(partitions)
                if held:
                    log.info(
                        "tandem: join %r: %s held records left to be read again (by the next owner of %s)",
                        self.spec.name, held, sorted(partitions),
                    )  # fmt: skip
        finally:
            self._working.release()

    async def _finish_batch_in_flight(self) -> bool:
        """Take the task's lock once the batch in flight is done; one still running after the
        worker's quiesce timeout is cancelled, and the state it applied discarded (False)."""
        try:
            await asyncio.wait_for(self._working.acquire(), self.worker.quiesce_timeout_s)
            return True
        except TimeoutError:
            log.error("tandem: join %r: batch still in flight; cancelled (read again)", self.spec.name)
            await _cancel(self._loop_task)
            self._loop_task = None
            for partition in self.state.actives() if self.state else []:
                self.state.discard(partition)  # type: ignore[union-attr]
            await self._working.acquire()
            return False

    async def _forget_everything(self) -> None:
        """Drop what is held and queued, and set every input back to its first record not done."""
        commit_at = self.intake.commit_at
        restart = dict(commit_at)
        queued = list(self._leftover)  # cut from fetches taken before those still queued
        self._leftover.clear()
        while not self._queue.empty():
            queued.append(self._dequeued(self._queue.get_nowait()))
        queued.append(self.intake.deferred)
        for fetch in queued:
            for tp, records in fetch.items():
                if records:
                    restart.setdefault(tp, records[0].offset)
        for tp, offset in restart.items():
            if tp not in commit_at:
                # Nothing of it done yet: a fetch dropped after this (taken across the
                # rebalance) starts later, and must not move the restart past this one.
                self._dropped_from[tp] = min(self._dropped_from.get(tp, offset), offset)
        held = self.intake.forget()
        if held:
            log.info("tandem: join %r: %s held records left to be read again", self.spec.name, held)
        await self._rewind(restart)

    async def dropped(self, records: dict[TP, list[InputRecord]]) -> None:
        """Fetched records that will not be joined now: their partitions are set back to the
        first record not done, or to the first dropped, so that they are read again. A ready
        partition whose intake stands (a fetch that spanned a cooperative round) is only read
        again from the first dropped: what it holds stays, and what comes again below what
        it has taken is skipped (`Intake.take`)."""
        restart: dict[TP, int] = {}
        again: dict[TP, int] = {}
        standing = set() if self.state is None or self._revoking else self.state.ready - self._released
        for tp, found in records.items():
            if not found:
                continue
            if tp.partition in standing:
                again[tp] = found[0].offset
                continue
            first = min(self._dropped_from.get(tp, found[0].offset), found[0].offset)
            self._dropped_from[tp] = first
            restart[tp] = self.intake.commit_at.get(tp, first)
        await self._rewind(restart)
        if again:
            await self.worker.rewind(again)

    async def _rewind(self, restart: dict[TP, int]) -> None:
        """Set each input partition's position back to its first record not done. Faust only
        seeks a partition that has a committed offset above 0 after a rebalance (aiokafka's
        seek_to_committed): without this, what was dropped before the first commit of a kept
        partition would never be read again."""
        for tp, offset in restart.items():
            self.intake.read_next[tp] = offset
        await self.worker.rewind(restart)

    # -- what the view and the assignor read ------------------------------------------------

    def local_offsets(self) -> dict[int, int]:
        if self.state is None:
            return self.worker.offsets_on_disk(self.spec)
        return self.state.local_offsets()

    def counters(self) -> dict[str, int]:
        """The operators' counters (late, duplicates, ...) over the ready active partitions."""
        state = self.state
        if state is None:
            return {}
        return counters_of(state.active(p).operator for p in state.actives() if p in state.ready)

    def live_records(self) -> int | None:
        """Records the operators of the ready active partitions hold in memory (the windowed
        join's index); None for a join kind that holds none."""
        state = self.state
        if state is None:
            return 0
        found = [state.active(p).operator.live_records for p in state.actives() if p in state.ready]
        return None if None in found else sum(n for n in found if n is not None)

    def input_snapshot(self) -> InputSnapshot:
        intake = self.intake
        return InputSnapshot(
            held=intake.aligner.held(),
            forced=intake.aligner.forced,
            let_go={intake.sides[topic]: n for topic, n in intake.aligner.let_go.items()},
            paused=sorted(f"{tp.topic}:{tp.partition}" for tp in intake.ahead),
            deferred=sum(map(len, intake.deferred.values())),
            live_records=self.live_records(),
            window_index=self.index_memory(),
        )

    def index_memory(self) -> dict[str, int] | None:
        """The window index of the ready active partitions, summed: its entries and the bytes it
        holds in memory (the `rocksdb` index: its read-ahead only); None for a join kind
        without one."""
        state = self.state
        if state is None:
            return {"entries": 0, "bytes": 0}
        total = {"entries": 0, "bytes": 0}
        for p in state.actives():
            if p in state.ready:
                measure = state.active(p).operator.index_memory()
                if measure is None:
                    return None
                for name, value in measure.items():
                    total[name] += value
        return total

    def input_lag(self, partition: int) -> int | None:
        return self.intake.input_lag(partition)

    # -- what the runtime reads: pauses, commits, seeks ---------------------------------------

    def paused(self) -> set[TP]:
        """Input partitions not to fetch now: held back while their state is restored, or read
        far ahead of their partner in event time."""
        return self.held_back | self.intake.ahead

    def commit_offset(self, tp: TP) -> int | None:
        """What Faust may commit for an input partition, for this join (None: nothing done)."""
        return self.intake.commit_at.get(tp)

    def committing(self) -> Iterable[TP]:
        """The input partitions this join has a commit offset for."""
        return self.intake.commit_at.keys()

    def taken_upto(self, tp: TP) -> int | None:
        """The next offset of an input partition this join has not taken into a batch."""
        return self.intake.read_next.get(tp)

    def checks_in_python(self) -> dict[str, str]:
        """ "side (topic)" -> why its record check runs as Python (not compiled), for each such input."""
        codecs = self.intake.codecs.items()
        return {f"{side} ({c.topic})": c.python_reason or "" for side, c in codecs if not c.compiled}


async def _cancel(task: asyncio.Task[Any] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

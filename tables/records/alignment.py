"""Event-time alignment of the join's two inputs, per partition (no I/O).

Faust hands each topic partition's records over in fetch order. On a backlog
(a worker starting after downtime, a new deployment on old data) the two topics
do not advance in step: impressions, denser in event time, fall behind clicks,
stream time races ahead on one side, and the join drops records of the other as
late that were not late at all (measured: 9,104 of 30,000 clicks' joins lost,
docs/bench/worker.md). Kafka Streams avoids this by processing a task's records
in timestamp order across its partitions (its PartitionGroup); this is the same
rule for one co-partitioned pair of topics.

A partition's records are held and released in timestamp order up to the lowest
of each topic's bound: the highest timestamp received from that topic while the
broker holds more of it (its high watermark is past the next offset to read), none
once it is caught up, as Kafka Streams waits for a partition it knows has data. An
input whose end is not known yet holds the others back for at most `max_wait_s`
(Kafka Streams' max.task.idle.ms); one with data on the broker that sends nothing,
for at most MAX_WAIT_UNHEARD_S. Each time an input is let go so, its partner's records
go on without it and the order is no longer exact: counted per input in `let_go` (the
view's and /metrics' `let_go`). Live traffic is caught up after
every fetch, so nothing is held there; a backlog is joined as if it had arrived
in time. An input runs ahead of the other on a backlog (sparser in event time, a
fetch of it covers more time), and what is held grows with the backlog: once half of
`max_held` records are held for a partition, the inputs whose bound lies past the one
holding the release back are named by `ahead()`, and the runtime stops fetching them
until the other catches up (Kafka Streams pauses a partition whose buffer is full).
At most `max_held` records are held per partition: beyond that the oldest are
released anyway (counted in `forced`: records of the other input may then be late),
so memory stays bounded.
"""

from __future__ import annotations

import heapq
import itertools
import time
from bisect import bisect_right, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Generic, TypeVar

Item = TypeVar("Item")
_INF = float("inf")
_TS, _ITEM = itemgetter(0), itemgetter(4)  # of a held entry

DEFAULT_MAX_WAIT_S = 2.0
DEFAULT_MAX_HELD = 50_000
# An input with records on the broker that sends none: Faust may hand one partition's
# backlog over long before another's (seen: 9,500 impressions before the first click
# of the same partition, and seconds of silence from an input mid-backlog); past this
# it is taken for done (a fresh group on a partition whose records all expired, or
# transaction markers at the end, which take offsets but are no records).
MAX_WAIT_UNHEARD_S = 60.0
# Offsets released behind one still held (a record held long while those read after it
# come and go) beyond this many, an input's list of held offsets is rebuilt: it stays
# within about twice what is held.
COMPACT_AT = 1024
# A batch of at least 1/SORT_BATCH_AT of what is held is merged in by a sort (the held
# records mostly sorted already, the batch of one topic nearly in time order: about linear);
# a smaller one is pushed onto the heap record by record: sorting every held record for a
# few new ones would cost more. A release from an unsorted heap sorts it if 1/SORT_DUE_AT
# of it or more looks due (judged by timestamps, between the lowest and the highest held),
# else pops the due records one by one. Both tuned with benchmarks/bench_aligner.py
# (--batch 300 to 4000); the results hardly depend on SORT_DUE_AT.
SORT_BATCH_AT = 16
SORT_DUE_AT = 4
# held_runs' bounds: it runs for each partition of every batch, and what it returns is
# written with the state (16 bytes a run).
MAX_RUN_SCAN = 4096
MAX_RUNS = 64


@dataclass
class _Input:
    """What one topic partition has delivered."""

    highest_ts: int | None = None
    last_offset: int | None = None  # of any record read, joined or dead-lettered
    last_read_at: float | None = None  # clock time of that record
    waiting_since: float | None = None  # first release it held back with nothing read
    let_go: bool = False  # its wait ran out: its partner goes on without it until it sends
    # Offsets of its records held, ascending from `start` (a topic partition is read in
    # offset order: appended), some already released (counted in `gone`, dropped from
    # the front lazily): the first held is found without scanning every held record.
    offsets: list[int] = field(default_factory=list)
    start: int = 0
    gone: dict[int, int] = field(default_factory=dict)

    def hold(self, offset: int) -> None:
        offsets = self.offsets
        if not offsets or offset >= offsets[-1]:
            offsets.append(offset)
        else:  # read again out of order (not seen from Faust, but cheap to get right)
            insort(offsets, offset, self.start)

    def first_held(self) -> int | None:
        offsets, gone, at = self.offsets, self.gone, self.start
        while at < len(offsets):
            offset = offsets[at]
            count = gone.get(offset)
            if count is None:
                break
            if count == 1:
                del gone[offset]
            else:
                gone[offset] = count - 1
            at += 1
        if at == len(offsets):
            self.clear_held()
            return None
        if len(gone) > COMPACT_AT and len(gone) * 2 > len(offsets) - at:
            self._compact(at)
            at = 0
        elif at > COMPACT_AT and at * 2 > len(offsets):
            del offsets[:at]
            at = 0
        self.start = at
        return self.offsets[at]

    def _compact(self, start: int) -> None:
        """The offsets still held, from `start`, without those released (all of `gone`)."""
        gone, kept = self.gone, []
        for offset in itertools.islice(self.offsets, start, None):
            count = gone.get(offset)
            if count is None:
                kept.append(offset)
            elif count == 1:
                del gone[offset]
            else:
                gone[offset] = count - 1
        self.offsets = kept

    def clear_held(self) -> None:
        self.offsets.clear()
        self.gone.clear()
        self.start = 0


@dataclass
class _Partition(Generic[Item]):
    # heap of (ts, arrival, topic, offset, item): of plain values, so that the collector
    # stops tracking an entry (a backlog holds tens of thousands).
    held: list[tuple[int, int, str, int, Item]] = field(default_factory=list)
    # `held` is sorted (a sorted list is a heap too): the due records are a prefix, cut
    # without a sort. Kept by releases and large batches, lost to pushes.
    in_order: bool = True
    inputs: dict[str, _Input] = field(default_factory=dict)
    ahead: frozenset[str] = frozenset()  # inputs not to read for now (see Aligner.ahead)
    # The highest timestamp held (-inf: none; the highest entry leaves the heap only with
    # all the others): when it is due, so is every held record.
    highest: float = -_INF


class Aligner(Generic[Item]):
    """Holds validated records per partition and releases them in event-time order."""

    def __init__(
        self,
        topics: Sequence[str],
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        max_held: int = DEFAULT_MAX_HELD,
        clock: Callable[[], float] = time.monotonic,
        max_wait_unheard_s: float = MAX_WAIT_UNHEARD_S,
    ) -> None:
        self.topics = tuple(topics)
        self.max_wait_s = max_wait_s
        self.max_wait_unheard_s = max(max_wait_s, max_wait_unheard_s)
        self.max_held = max_held
        self.clock = clock
        self.forced = 0  # records released before their turn (past the cap)
        # Input -> times its wait ran out and its partner's records went on without it (the
        # order is then no longer exact): once per silence, counted in `_bound`.
        self.let_go: dict[str, int] = dict.fromkeys(self.topics, 0)
        self._partitions: dict[int, _Partition[Item]] = {}
        self._next_arrival = 0  # (ts, arrival) orders held records totally

    def add(self, partition: int, topic: str, offset: int, ts: int, item: Item) -> None:
        """A record to join, held until its turn."""
        source = self._read(partition, topic, offset)
        source.highest_ts = ts if source.highest_ts is None else max(source.highest_ts, ts)
        source.hold(offset)
        state = self._partitions[partition]
        entry, held = (ts, self._next_arrival, topic, offset, item), state.held
        self._next_arrival += 1
        if state.in_order and held and entry < held[-1]:
            state.in_order = False
        heapq.heappush(held, entry)
        if ts > state.highest:
            state.highest = ts

    def add_many(
        self,
        partition: int,
        topic: str,
        offsets: Sequence[int],
        timestamps: Sequence[int],
        items: Iterable[Item],
        last_offset: int,
    ) -> None:
        """Records of one topic partition read together, in read order: the same as `add`
        for each (offset, timestamp, item) and `skip` for the others read (dead letters),
        of which `last_offset` is the highest offset."""
        highest = self._read_many(partition, topic, offsets, timestamps, last_offset)
        if highest is None:
            return
        state = self._partitions[partition]
        if highest > state.highest:
            state.highest = highest
        held, count, first = state.held, len(offsets), self._next_arrival
        self._next_arrival += count
        entries = list(zip(timestamps, range(first, first + count), repeat(topic, count), offsets, items,
                           strict=True))  # fmt: skip
        # (ts, arrival) orders the entries totally: the heap's layout never changes what is popped.
        if SORT_BATCH_AT * count >= len(held):
            held.extend(entries)
            held.sort()
            state.in_order = True
        else:
            state.in_order = False
            push = heapq.heappush
            for entry in entries:
                push(held, entry)

    def _read_many(
        self, partition: int, topic: str, offsets: Sequence[int], timestamps: Sequence[int], last_offset: int
    ) -> int | None:
        """add_many's part on the input: read up to `last_offset`, its highest timestamp and
        held offsets updated. The highest of `timestamps`, None if there are none."""
        source = self._read(partition, topic, last_offset)
        if not offsets:
            return None
        highest = max(timestamps)
        if source.highest_ts is None or highest > source.highest_ts:
            source.highest_ts = highest
        held_offsets = source.offsets
        if (not held_offsets or offsets[0] >= held_offsets[-1]) and sorted(offsets) == offsets:
            held_offsets.extend(offsets)
        else:
            for offset in offsets:
                source.hold(offset)
        return highest

    def skip(self, partition: int, topic: str, offset: int) -> None:
        """A record read that will not be joined (a dead letter): it still moves the input
        towards its end, or a bad last record would hold the other input back for ever."""
        self._read(partition, topic, offset)

    def release(
        self,
        partition: int,
        ends: Mapping[str, int | None],
        starts: Mapping[str, int | None] | None = None,
    ) -> list[Item]:
        """Held records now due, oldest first.

        `ends[topic]`: the partition's high watermark in that topic (the next offset to be
        written), None if not known yet; `starts[topic]`: where this consumer started
        reading it (the group's committed offset), None if unknown (then 0)."""
        due = self._due(partition, ends, starts)
        if due is None:
            return []
        state, bounds, limit = due
        # All due (live traffic, a caught-up batch), or the oldest only.
        out = self._release_all(state) if state.highest <= limit else self._release_some(state, limit)
        self._note_ahead(state, bounds, limit)
        return out

    @staticmethod
    def _release_all(state: _Partition[Item]) -> list[Item]:
        """Every held record, in (ts, arrival) order (as heappop gives them); nothing held
        any more, so no released offset needs counting."""
        held = state.held
        held.sort()
        out = list(map(_ITEM, held))
        held.clear()
        state.highest, state.in_order = -_INF, True
        for source in state.inputs.values():
            source.clear_held()
        return out

    def _release_some(self, state: _Partition[Item], limit: float) -> list[Item]:
        """The held records with ts <= limit, then the oldest past the cap (forced), in
        (ts, arrival) order; each counted in its input's `gone` (first_held needs them)."""
        held, max_held = state.held, self.max_held
        if not state.in_order and SORT_DUE_AT * (limit - held[0][0]) >= state.highest - held[0][0]:
            held.sort()
            state.in_order = True
        if state.in_order:
            due = bisect_right(held, limit, key=_TS)
            count = max(due, len(held) - max_held)
            self.forced += count - due
            released = held[:count]
            del held[:count]
        else:
            released, pop = [], heapq.heappop
            while held and held[0][0] <= limit:
                released.append(pop(held))
            while len(held) > max_held:
                released.append(pop(held))
                self.forced += 1
        inputs = state.inputs
        for _, _, topic, offset, _ in released:
            gone = inputs[topic].gone
            gone[offset] = gone.get(offset, 0) + 1
        if not held:  # a cap of 0
            state.highest, state.in_order = -_INF, True
            for source in inputs.values():
                source.clear_held()
        return list(map(_ITEM, released))

    def _due(
        self, partition: int, ends: Mapping[str, int | None], starts: Mapping[str, int | None] | None
    ) -> tuple[_Partition[Item], dict[str, float], float] | None:
        """The partition's state, each input's bound and the lowest of them, if a held record
        is to be released now; else None (and what is ahead noted)."""
        state = self._partitions.get(partition)
        if state is None or not state.held:
            if state is not None:
                state.ahead = frozenset()
            return None
        starts = starts or {}
        bounds = {
            t: self._bound(t, state.inputs[t], ends.get(t), starts.get(t), paused=t in state.ahead)
            for t in self.topics
        }
        limit = min(bounds.values())
        if state.held[0][0] > limit and len(state.held) <= self.max_held:
            self._note_ahead(state, bounds, limit)
            return None  # the common case on a backlog: waiting for the other input
        return state, bounds, limit

    def _note_ahead(self, state: _Partition[Item], bounds: Mapping[str, float], limit: float) -> None:
        if 2 * len(state.held) < self.max_held:
            state.ahead = frozenset()
        else:
            state.ahead = frozenset(t for t, bound in bounds.items() if limit < bound < _INF)

    def heard(self, partition: int, topic: str) -> None:
        """Records of this input were fetched and wait, not yet added (queued behind a batch
        that holds the worker): it is not silent. A worker busy for a minute must not let an
        input go for the records it has not got to yet."""
        state = self._partitions.get(partition)
        source = None if state is None else state.inputs.get(topic)
        if source is not None and source.last_read_at is not None:
            source.last_read_at = self.clock()

    def ahead(self) -> dict[int, frozenset[str]]:
        """Partition -> its inputs not to read for now: with half of `max_held` records held
        or more, those ahead of the input that holds the release back (reading more of them
        would only grow what is held). As of each partition's last `release`."""
        return {p: state.ahead for p, state in self._partitions.items() if state.ahead}

    def forget(self) -> list[Item]:
        """Every held record of every partition, and what was read: the records will be
        read again (a revocation: they are neither joined nor acked, so Faust commits each
        input only up to its first held record and seeks back there afterwards)."""
        out = [entry[4] for state in self._partitions.values() for entry in state.held]
        self._partitions.clear()
        return out

    def first_held(self, partition: int) -> dict[str, int]:
        """The lowest offset held of each topic of the partition: nothing from there on may
        be committed yet."""
        state = self._partitions.get(partition)
        firsts: dict[str, int] = {}
        if state is None:
            return firsts
        for topic, source in state.inputs.items():
            first = source.first_held()
            if first is not None:
                firsts[topic] = first
        return firsts

    def held_runs(self, partition: int, topic: str) -> list[tuple[int, int]]:
        """The offsets of `topic` held for the partition, as inclusive (first, last) runs in
        ascending order (what a batch has not joined yet: tables/records/positions.py).
        Cheap for what is usual (nothing held, or one unbroken run: the offsets released
        behind the first held are counted in `gone`); otherwise exact for up to
        MAX_RUN_SCAN held offsets and MAX_RUNS runs, beyond that one run from the first held
        to the last (records in between released already are then joined again, and the
        operator counts them as duplicates)."""
        state = self._partitions.get(partition)
        source = state.inputs.get(topic) if state is not None else None
        if source is None or source.first_held() is None:
            return []
        offsets, start, gone = source.offsets, source.start, source.gone
        first, last = offsets[start], offsets[-1]
        if not gone and last - first + 1 == len(offsets) - start:
            return [(first, last)]
        if len(offsets) - start > MAX_RUN_SCAN:
            return [(first, last)]
        left = dict(gone)
        runs: list[tuple[int, int]] = []
        for offset in itertools.islice(offsets, start, None):
            count = left.get(offset)
            if count:
                left[offset] = count - 1
                continue
            if runs and runs[-1][1] + 1 >= offset:
                runs[-1] = (runs[-1][0], max(runs[-1][1], offset))
            else:
                runs.append((offset, offset))
        if len(runs) > MAX_RUNS:
            return [(runs[0][0], runs[-1][1])]
        return runs

    def drop_partition(self, partition: int) -> None:
        """Forget a partition (revoked): its records are read again by its next owner."""
        self._partitions.pop(partition, None)

    def holding(self) -> list[int]:
        """Partitions with records held."""
        return sorted(p for p, state in self._partitions.items() if state.held)

    def held(self, partition: int | None = None) -> int:
        if partition is not None:
            state = self._partitions.get(partition)
            return len(state.held) if state else 0
        return sum(len(state.held) for state in self._partitions.values())

    def _read(self, partition: int, topic: str, offset: int) -> _Input:
        state = self._partitions.get(partition)
        if state is None:
            state = self._partitions[partition] = _Partition(inputs={t: _Input() for t in self.topics})
        source = state.inputs[topic]
        source.last_offset = offset if source.last_offset is None else max(source.last_offset, offset)
        source.last_read_at = self.clock()
        source.waiting_since = None
        source.let_go = False
        return source

    def _bound(
        self, topic: str, source: _Input, end: int | None, start: int | None, paused: bool = False
    ) -> float:
        """Up to which timestamp this input lets the partition's records through. `paused`:
        it is named ahead (the runtime fetches no more of it), so its silence is ours: it is
        not let go for it, neither while paused (what it holds would be released past the cap
        while its partner is still behind, a partner with minutes of backlog left) nor as soon
        as it is resumed (its partner's records would be released before the rest of it)."""
        now = self.clock()
        if source.last_offset is None:
            next_offset = start or 0
            if end is not None and next_offset >= end:
                return _INF  # nothing to read: an empty or fully committed partition
            # Nothing read from it yet: wait, but not for ever. The clock starts at the
            # first release it holds back (after any restore).
            if source.waiting_since is None:
                source.waiting_since = now
            limit = self.max_wait_s if end is None else self.max_wait_unheard_s
            return self._give_up(topic, source) if now - source.waiting_since >= limit else -_INF
        if end is not None and source.last_offset + 1 >= end:
            return _INF  # caught up: whatever it sends next comes later
        # More on the broker (or no end known): wait for it. An input short of its end
        # with nothing more to send (transaction markers take offsets too) or one that
        # stopped sending is let go after a long silence; the cap bounds memory.
        assert source.last_read_at is not None
        if paused:
            source.last_read_at = now  # its silence starts when it is resumed
        silence = self.max_wait_s if end is None else self.max_wait_unheard_s
        if now - source.last_read_at >= silence:
            return self._give_up(topic, source)
        return -_INF if source.highest_ts is None else float(source.highest_ts)

    def _give_up(self, topic: str, source: _Input) -> float:
        """`topic`'s wait ran out: counted once until it sends again (the bound is taken on
        every release), and no bound from it."""
        if not source.let_go:
            source.let_go = True
            self.let_go[topic] += 1
        return _INF

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
for at most MAX_WAIT_UNHEARD_S. Live traffic is caught up after
every fetch, so nothing is held there; a backlog is joined as if it had arrived
in time. At most `max_held` records are held per partition: beyond that the
oldest are released anyway (counted in `forced`), so memory stays bounded.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
_INF = float("inf")

DEFAULT_MAX_WAIT_S = 2.0
DEFAULT_MAX_HELD = 50_000
# An input with records on the broker that sends none: Faust may hand one partition's
# backlog over long before another's (seen: 9,500 impressions before the first click
# of the same partition, and seconds of silence from an input mid-backlog); past this
# it is taken for done (a fresh group on a partition whose records all expired, or
# transaction markers at the end, which take offsets but are no records).
MAX_WAIT_UNHEARD_S = 60.0


@dataclass
class _Input:
    """What one topic partition has delivered."""

    highest_ts: int | None = None
    last_offset: int | None = None  # of any record read, joined or dead-lettered
    last_read_at: float | None = None  # clock time of that record
    waiting_since: float | None = None  # first release it held back with nothing read


@dataclass
class _Partition(Generic[Item]):
    # heap of (ts, arrival, topic, offset, item)
    held: list[tuple[int, int, str, int, Item]] = field(default_factory=list)
    inputs: dict[str, _Input] = field(default_factory=dict)


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
        self._partitions: dict[int, _Partition[Item]] = {}
        self._arrivals = itertools.count()

    def add(self, partition: int, topic: str, offset: int, ts: int, item: Item) -> None:
        """A record to join, held until its turn."""
        source = self._read(partition, topic, offset)
        source.highest_ts = ts if source.highest_ts is None else max(source.highest_ts, ts)
        heapq.heappush(self._partitions[partition].held, (ts, next(self._arrivals), topic, offset, item))

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
        state = self._partitions.get(partition)
        if state is None or not state.held:
            return []
        starts = starts or {}
        limit = min(self._bound(state.inputs[t], ends.get(t), starts.get(t)) for t in self.topics)
        held, out = state.held, []
        while held and (held[0][0] <= limit or len(held) > self.max_held):
            if held[0][0] > limit:
                self.forced += 1
            out.append(heapq.heappop(held)[4])
        return out

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
        for _, _, topic, offset, _ in state.held if state else ():
            if offset < firsts.get(topic, offset + 1):
                firsts[topic] = offset
        return firsts

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
        return source

    def _bound(self, source: _Input, end: int | None, start: int | None) -> float:
        """Up to which timestamp this input lets the partition's records through."""
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
            return _INF if now - source.waiting_since >= limit else -_INF
        if end is not None and source.last_offset + 1 >= end:
            return _INF  # caught up: whatever it sends next comes later
        # More on the broker (or no end known): wait for it. An input short of its end
        # with nothing more to send (transaction markers take offsets too) or one that
        # stopped sending is let go after a long silence; the cap bounds memory.
        assert source.last_read_at is not None
        silence = self.max_wait_s if end is None else self.max_wait_unheard_s
        if now - source.last_read_at >= silence:
            return _INF
        return -_INF if source.highest_ts is None else float(source.highest_ts)

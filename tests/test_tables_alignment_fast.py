"""The aligner's incremental bookkeeping (tables/records/alignment.py: `add_many`, the first held
offset per topic, the fast path of `release`) against the straightforward aligner it
replaced, kept here as the reference: the same random deliveries must give the same
releases in the same order, the same `forced` count and the same first held offsets."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tables.records import alignment
from tables.records.alignment import Aligner

IMP, CLK = "impressions", "clicks"
TOPICS = (IMP, CLK)
_INF = float("inf")


@dataclass
class _RefInput:
    highest_ts: int | None = None
    last_offset: int | None = None
    last_read_at: float | None = None
    waiting_since: float | None = None


@dataclass
class _RefPartition:
    held: list[tuple[int, int, str, int, Any]] = field(default_factory=list)
    inputs: dict[str, _RefInput] = field(default_factory=dict)


class ReferenceAligner:
    """The aligner as it was before the incremental bookkeeping (one record at a time, a
    scan of every held record for the first held offsets)."""

    def __init__(
        self, topics: Sequence[str], max_wait_s: float, max_held: int, clock: Callable[[], float],
        max_wait_unheard_s: float,
    ) -> None:  # fmt: skip
        self.topics = tuple(topics)
        self.max_wait_s = max_wait_s
        self.max_wait_unheard_s = max(max_wait_s, max_wait_unheard_s)
        self.max_held = max_held
        self.clock = clock
        self.forced = 0
        self._partitions: dict[int, _RefPartition] = {}
        self._arrivals = itertools.count()

    def add(self, partition: int, topic: str, offset: int, ts: int, item: Any) -> None:
        source = self._read(partition, topic, offset)
        source.highest_ts = ts if source.highest_ts is None else max(source.highest_ts, ts)
        heapq.heappush(self._partitions[partition].held, (ts, next(self._arrivals), topic, offset, item))

    def skip(self, partition: int, topic: str, offset: int) -> None:
        self._read(partition, topic, offset)

    def release(
        self, partition: int, ends: Mapping[str, int | None], starts: Mapping[str, int | None]
    ) -> list[Any]:
        state = self._partitions.get(partition)
        if state is None or not state.held:
            return []
        limit = min(self._bound(state.inputs[t], ends.get(t), starts.get(t)) for t in self.topics)
        held, out = state.held, []
        while held and (held[0][0] <= limit or len(held) > self.max_held):
            if held[0][0] > limit:
                self.forced += 1
            out.append(heapq.heappop(held)[4])
        return out

    def forget(self) -> list[Any]:
        out = [entry[4] for state in self._partitions.values() for entry in state.held]
        self._partitions.clear()
        return out

    def first_held(self, partition: int) -> dict[str, int]:
        state = self._partitions.get(partition)
        firsts: dict[str, int] = {}
        for _, _, topic, offset, _ in state.held if state else ():
            if offset < firsts.get(topic, offset + 1):
                firsts[topic] = offset
        return firsts

    def drop_partition(self, partition: int) -> None:
        self._partitions.pop(partition, None)

    def holding(self) -> list[int]:
        return sorted(p for p, state in self._partitions.items() if state.held)

    def held(self) -> int:
        return sum(len(state.held) for state in self._partitions.values())

    def _read(self, partition: int, topic: str, offset: int) -> _RefInput:
        state = self._partitions.get(partition)
        if state is None:
            state = self._partitions[partition] = _RefPartition(inputs={t: _RefInput() for t in self.topics})
        source = state.inputs[topic]
        source.last_offset = offset if source.last_offset is None else max(source.last_offset, offset)
        source.last_read_at = self.clock()
        source.waiting_since = None
        return source

    def _bound(self, source: _RefInput, end: int | None, start: int | None) -> float:
        now = self.clock()
        if source.last_offset is None:
            next_offset = start or 0
            if end is not None and next_offset >= end:
                return _INF
            if source.waiting_since is None:
                source.waiting_since = now
            limit = self.max_wait_s if end is None else self.max_wait_unheard_s
            return _INF if now - source.waiting_since >= limit else -_INF
        if end is not None and source.last_offset + 1 >= end:
            return _INF
        silence = self.max_wait_s if end is None else self.max_wait_unheard_s
        if now - source.last_read_at >= silence:  # type: ignore[operator]
            return _INF
        return -_INF if source.highest_ts is None else float(source.highest_ts)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# One step: read a batch of one topic partition (some records dead-lettered), release a
# partition, let time pass, ask for the first held offsets, drop a partition or forget all.
_read = st.tuples(
    st.just("read"),
    st.integers(0, 1),  # partition
    st.sampled_from(TOPICS),
    st.lists(st.tuples(st.integers(0, 60), st.booleans()), min_size=1, max_size=12),  # ts, skipped
    st.booleans(),  # one at a time (add/skip) instead of add_many
    st.integers(-3, 0),  # read again from a little before the next offset (a seek back)
)
_release = st.tuples(
    st.just("release"),
    st.integers(0, 1),
    st.tuples(st.integers(-1, 3), st.integers(-1, 3)),  # end = next offset + this; -1: unknown
    st.tuples(st.integers(-1, 2), st.integers(-1, 2)),  # start; -1: unknown
)
_step = st.one_of(
    _read,
    _read,
    _release,
    _release,
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.5, 2.0, 61.0])),
    st.tuples(st.just("first_held"), st.integers(0, 1)),
    st.tuples(st.just("drop"), st.integers(0, 1)),
    st.tuples(st.just("forget")),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_step, max_size=60), st.sampled_from([3, 8, 50_000]), st.sampled_from([0, 1, 3, 1024]))
def test_the_incremental_aligner_does_what_the_reference_does(
    steps: list[tuple[Any, ...]], cap: int, compact_at: int
) -> None:
    """`compact_at`: the held offsets are rebuilt that early too."""
    default, alignment.COMPACT_AT = alignment.COMPACT_AT, compact_at
    try:
        run_both(steps, cap)
    finally:
        alignment.COMPACT_AT = default


def run_both(steps: list[tuple[Any, ...]], cap: int) -> None:
    clock = Clock()
    new: Aligner[Any] = Aligner(TOPICS, max_wait_s=2.0, max_held=cap, clock=clock, max_wait_unheard_s=60.0)
    ref = ReferenceAligner(TOPICS, max_wait_s=2.0, max_held=cap, clock=clock, max_wait_unheard_s=60.0)
    next_offset: dict[tuple[int, str], int] = {}
    for step in steps:
        kind = step[0]
        if kind == "read":
            _, partition, topic, records, singly, back = step
            first = max(0, next_offset.get((partition, topic), 0) + back)
            offsets = list(range(first, first + len(records)))
            next_offset[(partition, topic)] = max(next_offset.get((partition, topic), 0), offsets[-1] + 1)
            kept = [(o, ts) for o, (ts, skipped) in zip(offsets, records, strict=True) if not skipped]
            for o, (ts, skipped) in zip(offsets, records, strict=True):
                if skipped:
                    ref.skip(partition, topic, o)
                else:
                    ref.add(partition, topic, o, ts, (topic, o))
            if singly:
                for o, (ts, skipped) in zip(offsets, records, strict=True):
                    if skipped:
                        new.skip(partition, topic, o)
                    else:
                        new.add(partition, topic, o, ts, (topic, o))
            else:
                new.add_many(
                    partition, topic, [o for o, _ in kept], [ts for _, ts in kept],
                    [(topic, o) for o, _ in kept], offsets[-1],
                )  # fmt: skip
        elif kind == "release":
            _, partition, end_deltas, start_values = step
            ends = {
                t: None if d < 0 else next_offset.get((partition, t), 0) + d
                for t, d in zip(TOPICS, end_deltas, strict=True)
            }
            starts = {t: None if s < 0 else s for t, s in zip(TOPICS, start_values, strict=True)}
            assert new.release(partition, ends, starts) == ref.release(partition, ends, starts)
        elif kind == "tick":
            clock.now += step[1]
        elif kind == "first_held":
            assert new.first_held(step[1]) == ref.first_held(step[1])
        elif kind == "drop":
            new.drop_partition(step[1])
            ref.drop_partition(step[1])
        else:
            assert sorted(new.forget()) == sorted(ref.forget())
        assert new.forced == ref.forced
        assert new.held() == ref.held() and new.holding() == ref.holding()
        for partition in (0, 1):
            assert new.first_held(partition) == ref.first_held(partition)


def test_the_held_offsets_stay_bounded_behind_a_record_held_long() -> None:
    """A record far ahead in event time stays held while thousands read after it are
    released: its input's bookkeeping is rebuilt instead of growing with every record."""
    clock = Clock()
    a: Aligner[Any] = Aligner(TOPICS, clock=clock)
    ends = {IMP: 1 << 40, CLK: 1 << 40}  # both have more on the broker
    a.add_many(0, IMP, [0], [10**9], ["far ahead"], 0)
    for batch in range(20):
        offsets = list(range(1 + batch * 500, 1 + (batch + 1) * 500))
        a.add_many(0, IMP, offsets, [o for o in offsets], [("i", o) for o in offsets], offsets[-1])
        a.add_many(0, CLK, [o - 1 for o in offsets], [o + 1 for o in offsets], [("c", o) for o in offsets],
                   offsets[-1] - 1)  # fmt: skip
        released = a.release(0, ends)
        assert released and "far ahead" not in released
        assert a.first_held(0)[IMP] == 0
        source = a._partitions[0].inputs[IMP]
        assert len(source.offsets) - source.start <= 2 * a.held(0) + 2 * alignment.COMPACT_AT
    assert a.held(0) == 1  # the one far ahead

"""A windowed join of a topic with itself (`tables.join(app, t, t, ...)`): each record joined
with the other records of its key within the window, never with itself
(docs/join-semantics.md, "Self-joins").

It is the windowed join of the topic as its left input with the topic as its right input,
less the pairs of a record with itself: each record is processed by the windowed operator
(in memory or with its index in RocksDB, tables/operators/windowed_kind.py) once as a left
record and once as a right record, and the one match of the record with its own left copy
is taken out. A record is in both roles, so a pair of records within the window comes out
in both orders when the window allows both, as in Kafka Streams' self-join (KIP-862): (a, b)
when `a.ts - before <= b.ts <= a.ts + after`. A record is late (dropped, counted once) when
stream time has passed its time plus the larger of `before` and `after` plus `grace`, in
both roles alike; a duplicate is dropped in both roles too. A left self-join emits a record
with no partner but itself as (record, None) once stream time passes its time plus twice the
larger bound plus grace (`held_window`): no record still accepted can meet it then.

Kafka Streams keeps one copy of each record for a self-join (KIP-862); this keeps two (one
per role), so the state is twice the size of the records within the window.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tables.operators import keys
from tables.operators.base import Event, Match
from tables.operators.kv import KV
from tables.operators.windowed import UNMATCHED_FLAG, JoinType, JoinWindow
from tables.operators.windowed_kind import WindowedKind

SELF_JOIN_TYPES = (JoinType.INNER, JoinType.LEFT)


def held_window(window: JoinWindow) -> JoinWindow:
    """The window the windowed operator is made with: the declared one, its grace widened by
    the difference of `before` and `after`, so that it holds each record for twice the
    larger bound plus grace. A record accepted until its time + max(before, after) + grace
    may meet one that much earlier in either role: that one must still be held."""
    return replace(window, grace=window.grace + abs(window.after - window.before))


def _windowed(operator: Any) -> Any:
    """The windowed operator that holds the index: a budgeted join's current one (in memory, or
    in the state once spilled: tables/operators/budgeted_window.py), else the operator itself."""
    return getattr(operator, "inner", operator)


class SelfJoin:
    """The self-join of one partition: a windowed operator fed each record in both roles."""

    def __init__(self, inner: Any, window: JoinWindow) -> None:
        """`inner`: the windowed operator over `held_window(window)`; `window` as declared."""
        if inner.join_type not in SELF_JOIN_TYPES:
            raise ValueError(f"a self-join is inner or left, not {inner.join_type.value}")
        self.inner = inner
        self._left_tracked = inner.join_type is JoinType.LEFT
        # A record is late as a whole, once its window in either role has closed: were one role
        # taken and the other dropped, a copy read again (with ids) could meet its other role.
        closes = max(window.before, window.after) + window.grace
        _windowed(inner)._closes = {"left": closes, "right": closes}  # a budgeted join's spill keeps them

    @property
    def stream_time(self) -> int | None:
        return self.inner.stream_time

    @stream_time.setter
    def stream_time(self, value: int | None) -> None:
        self.inner.stream_time = value

    def process_many(self, events: Iterable[Event]) -> list[Match]:
        """Each record (its side is the topic's only one) in both roles, in turn."""
        results: list[Match] = []
        for _side, key, ts, record_id, value in events:
            assert value is not None  # a stream's null values never reach an operator
            results += self._process(key, ts, record_id, value)
        return results

    def _process(self, key: bytes, ts: int, record_id: bytes, value: bytes) -> list[Match]:
        inner = self.inner
        before = inner.counters()
        as_left = inner.process_many((("left", key, ts, record_id, value),))
        between = inner.counters()
        as_right = inner.process_many((("right", key, ts, record_id, value),))
        after = inner.counters()
        left_kept, right_kept = before == between, between == after
        if left_kept and right_kept:
            # As a right record it met its own left copy (always within its window): not a result.
            as_right.remove(Match(key, value, value, ts))
            if self._left_tracked and not any(m.right is not None for m in as_left):
                self._unmark(keys.record_key("left", key, ts, record_id), value)
        elif not left_kept and not right_kept:
            for name, count in after.items():  # one record dropped (late, a duplicate): counted once
                if count - before.get(name, 0) == 2:
                    _windowed(inner)._count(name, -1)
        return as_left + as_right

    def _unmark(self, own: bytes, value: bytes) -> None:
        """The record's left copy had no partner but its right copy: it stays unmatched (a
        left self-join emits it once its window closes, unless another record meets it)."""
        stored = UNMATCHED_FLAG + value
        windowed = _windowed(self.inner)
        windowed._changes[own] = stored
        windowed.state.put(own, stored)

    def advance(self, stream_time: int) -> list[Match]:
        return self.inner.advance(stream_time)

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        return self.inner.take_changes()

    def restore(self, key: bytes, value: bytes | None) -> None:
        self.inner.restore(key, value)

    def finish_restore(self) -> None:
        self.inner.finish_restore()

    def counters(self) -> Mapping[str, int]:
        return self.inner.counters()

    @property
    def live_records(self) -> int | None:
        """Records held in the window index: each record twice (one per role)."""
        return self.inner.live_records

    def index_memory(self) -> dict[str, int] | None:
        return self.inner.index_memory()


@dataclass(frozen=True)
class SelfJoinKind(WindowedKind):
    """A windowed join of a topic with itself (`tables.join(app, t, t, ...)`)."""

    name: str = "self"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.join_type not in SELF_JOIN_TYPES:
            raise ValueError(
                f"how={self.join_type.value!r}: a self-join is 'inner' or 'left' (its right join would "
                "be its left join mirrored)"
            )

    def operator(self, state: KV, ids: bool) -> SelfJoin:
        inner = WindowedKind(
            held_window(self.window),
            self.join_type,
            index=self.index,
            filter_bytes=self.filter_bytes,
            budget=self.budget,
        )
        return SelfJoin(inner.operator(state, ids), self.window)

    def retention_ms(self) -> int:
        """As the windowed join's, of the window the records are held for (`held_window`)."""
        return WindowedKind(held_window(self.window), self.join_type).retention_ms()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kind": self.name}

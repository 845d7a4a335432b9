"""Windowed stream-stream join of two co-partitioned inputs (Kafka Streams' KStream-KStream
join, KIP-633), minus its spurious unmatched results.

Pure operator, no I/O: it reads and writes an ordered key-value state (tables/operators/kv.py;
layout in tables/operators/keys.py) and returns matches exactly as in docs/join-semantics.md.
Keys and values are bytes: the operator never decodes them, so any serializer works.

    join = WindowedJoin(state, JoinWindow(before=0, after=600_000, grace=60_000), JoinType.LEFT)
    matches = join.process("left", key, ts, record_id, value)  # list of Match
    changes = join.take_changes()                # (key, value) pairs for the changelog
    join.restore(key, value); join.finish_restore()  # apply a changelog, emitting nothing

Time only moves forward: a record is late, dropped and counted, when its window
closed before it arrived; unmatched records of a left, right or outer join are
emitted once stream time passes their window plus grace; every record is deleted
once no record still accepted could match it. Partners, duplicates and due records
are found in an in-memory index of the live records (tables/operators/window_index.py), never by
reading the whole state. The per-record loop also exists compiled (tables/operators/_fastjoin.pyx),
used where it is built: `LOOP.active` says whether it runs.
"""

from __future__ import annotations

import enum
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from heapq import heappush

from tables.compiled import CompiledPart
from tables.operators import keys
from tables.operators.base import Event, Match, Side
from tables.operators.keys import BYTE_SIDE
from tables.operators.kv import KV, write_derived
from tables.operators.meta import StateMeta
from tables.operators.window_index import WindowIndex, split_record_key

UNMATCHED_FLAG = b"\x00"
MATCHED_FLAG = b"\x01"


class JoinType(enum.Enum):
    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    OUTER = "outer"

    @property
    def unmatched_sides(self) -> frozenset[Side]:
        """Sides whose unmatched records are emitted with the other side None."""
        sides: dict[JoinType, frozenset[Side]] = {
            JoinType.INNER: frozenset(),
            JoinType.LEFT: frozenset({"left"}),
            JoinType.RIGHT: frozenset({"right"}),
            JoinType.OUTER: frozenset({"left", "right"}),
        }
        return sides[self]


@dataclass(frozen=True, slots=True)
class JoinWindow:
    """`left.ts - before <= right.ts <= left.ts + after`; `grace` for late records (ms)."""

    before: int = 0
    after: int = 600_000
    grace: int = 60_000

    def __post_init__(self) -> None:
        if min(self.before, self.after, self.grace) < 0:
            raise ValueError(f"window bounds must not be negative: {self}")

    def retained_until(self, ts: int) -> int:
        """Last stream time at which a record still accepted could match this one:
        an unmatched record is emitted, and any record deleted, once stream time passes it."""
        return ts + self.before + self.after + self.grace


_STREAM_TIME_KEY = keys.meta_key("stream_time")
_RECORD_LEFT = keys.RECORD + keys.SIDE_BYTE["left"]
_RECORD_RIGHT = keys.RECORD + keys.SIDE_BYTE["right"]
_RECORDS = keys.prefix_bounds(keys.RECORD)
_pack_time = keys.TIME.pack
_unpack_time = keys.TIME.unpack_from
_pack_len = keys.LEN.pack
_BIAS = keys.TIME_BIAS
_new = tuple.__new__  # Match(...) without its Python-level __new__ (once per result)
# Counters kept with the state and its changelog.
COUNTERS = ("late", "duplicates")
DAY_MS = 24 * 3600 * 1000


class WindowedJoin(StateMeta):
    """The join of one task (partition) over its state.

    The state holds the records and counters; which records are live, by join key and
    by due time, is kept in memory (tables/operators/window_index.py), loaded from the state when the
    operator is made. So the per-record path reads the state only for the values of
    partners found, and writes each record once (and deletes it once it expires).

    The per-record path (`process`) is written flat, with the key layout of
    tables/operators/keys.py inlined: it runs once per input record and its cost is the
    join's throughput (docs/bench/worker.md)."""

    def __init__(
        self,
        state: KV,
        window: JoinWindow | None = None,
        join_type: JoinType = JoinType.INNER,
        ids: bool = False,
    ) -> None:
        """`ids`: records carry their own ids (the join's `id` option), and one with an id
        already held for its side and key is a duplicate whatever its time. Otherwise the
        id is the input offset, and a duplicate is a record read twice (same time too).

        Reads every record key of `state` (to index them): make it before writing to the
        state through anything but this operator."""
        self.state = state
        self.ids = ids
        self.window = window or JoinWindow()
        self.join_type = join_type
        self._tracked = join_type.unmatched_sides
        self._changes: dict[bytes, bytes] = {}
        self._dirty_meta: set[str] = set()
        w = self.window
        self._closes = {"left": w.after + w.grace, "right": w.before + w.grace}
        self._retention = w.before + w.after + w.grace
        self.stream_time: int | None = self._meta("stream_time")
        self.late = self._meta("late") or 0
        self.duplicates = self._meta("duplicates") or 0
        if state.get(keys.INDEX_MARK) is not None:
            _drop_stored_index(state)  # TANDEM_WINDOW_INDEX=rocksdb wrote it: it would go stale
        self.index = WindowIndex(self._retention, ids)
        self.index.load(key for key, _ in state.scan(*_RECORDS))

    # -- processing -------------------------------------------------------

    def process(self, side: Side, key: bytes, ts: int, record_id: bytes, value: bytes) -> list[Match]:
        """Matches caused by one input record (and unmatched records now due)."""
        return self.process_many(((side, key, ts, record_id, value),))

    def process_many(self, events: Iterable[Event]) -> list[Match]:
        """`process` of each (side, key, ts, record id, value) in turn, their matches in
        one list: the same results as one call per event, cheaper (one loop over local
        names: it runs for every input record).

        Runs the compiled loop (tables/operators/_fastjoin.pyx) when it is built and in use (`LOOP.active`),
        else `_process_many_python`. Subclasses take the Python loop: the compiled one inlines
        `_expire` and the index's methods, so it would skip their overrides."""
        fast = LOOP.fast
        if fast is not None and type(self) is WindowedJoin:
            return fast(self, events)
        return self._process_many_python(events)

    def _process_many_python(self, events: Iterable[Event]) -> list[Match]:
        """The per-record loop in Python: the reference the compiled loop must equal
        (tests/test_tables_fastjoin.py), and what runs where it is not built."""
        results: list[Match] = []
        index = self.index
        by_prefix, due, late_due, ids = index.by_prefix, index.due, index.late_due, index.ids
        retention = index.retention
        state = self.state
        get, put = state.get, state.put
        changes = self._changes
        window = self.window
        before, after = window.before, window.after
        close_left, close_right = self._closes["left"], self._closes["right"]
        other_tracked = {"left": "right" in self._tracked, "right": "left" in self._tracked}
        for side, key, ts, record_id, value in events:
            left = side == "left"
            joined = _pack_len(len(key)) + key
            prefix = (_RECORD_LEFT if left else _RECORD_RIGHT) + joined
            own = prefix + _pack_time(ts + _BIAS) + record_id
            # Duplicates first: a record read again after a takeover is one, not a late record.
            id_key = prefix + record_id if ids is not None else None
            if (id_key in ids) if ids is not None else index.holds(prefix, own):
                self._count("duplicates")
                continue
            now = self.stream_time
            if now is not None and ts + (close_left if left else close_right) < now:
                self._count("late")
                continue
            if now is None or ts > now:
                self.stream_time = ts  # written to the state once per batch (take_changes)
                if (due and due[0][0] < ts) or (late_due and late_due[0][0] < ts):
                    results += self._expire(True)

            # Partners: the other side's records of this join key within the window.
            if left:
                other = _RECORD_RIGHT + joined
                lo, hi = ts - before, ts + after
            else:
                other = _RECORD_LEFT + joined
                lo, hi = ts - after, ts + before
            held = by_prefix.get(other)
            found = (
                held[
                    bisect_left(held, other + _pack_time(lo + _BIAS)) : bisect_left(
                        held, other + _pack_time(hi + 1 + _BIAS)
                    )
                ]
                if held
                else None
            )
            if found:
                at = len(other)
                tracked = other_tracked[side]
                for partner_key in found:
                    partner = get(partner_key)
                    if partner is None:  # the index and the state disagree: a bug, not bad input
                        raise RuntimeError(f"join state lost record {partner_key!r} its index holds")
                    partner_ts = _unpack_time(partner_key, at)[0] - _BIAS
                    later = ts if ts > partner_ts else partner_ts
                    if left:
                        results.append(_new(Match, (key, value, partner[1:], later)))
                    else:
                        results.append(_new(Match, (key, partner[1:], value, later)))
                    if tracked and partner[:1] == UNMATCHED_FLAG:
                        partner = MATCHED_FLAG + partner[1:]
                        changes[partner_key] = partner
                        put(partner_key, partner)

            # The record itself.
            stored = (MATCHED_FLAG if found else UNMATCHED_FLAG) + value  # type: ignore[operator]
            changes[own] = stored
            put(own, stored)
            # ... and in the index (WindowIndex.add, inlined: once per record).
            mine = by_prefix.get(prefix)  # after the expiry above, which may drop a key's list
            if mine is None:
                by_prefix[prefix] = [own]
            elif own > mine[-1]:
                mine.append(own)
            else:
                insort(mine, own)
            entry = (ts + retention, own)
            if not due or entry > due[-1]:
                due.append(entry)
            else:
                heappush(late_due, entry)
            if ids is not None:
                ids.add(id_key)  # type: ignore[arg-type]
        return results

    # -- expiry and unmatched emission ------------------------------------

    def _expire(self, emit: bool) -> list[Match]:
        """Records fall due once stream time passes `retained_until(ts)`: no record still
        accepted can match them. Each is emitted if its side is tracked and its flag
        still says unmatched, then deleted."""
        if self.stream_time is None:
            return []
        results: list[Match] = []
        state = self.state
        tracked = self._tracked
        due = self.index.pop_due(self.stream_time)
        if emit and tracked:
            for record_key in due:
                if BYTE_SIDE[record_key[1]] in tracked:
                    value = state.get(record_key)
                    if value is not None and value[:1] == UNMATCHED_FLAG:
                        results.append(_unmatched(record_key, value))
        expire = state.expire
        for record_key in due:
            expire(record_key)
        return results

    def advance(self, stream_time: int) -> list[Match]:
        """Stream time moves to `stream_time` (if later) with no record: the unmatched
        records that fall due by then, and the expiry of every record past its window."""
        if self.stream_time is None or stream_time > self.stream_time:
            self.stream_time = stream_time
        return self._expire(emit=True)

    # -- metadata: counters ------------------------------------------------

    def counters(self) -> dict[str, int]:
        """Records dropped, kept with the state: late ones and duplicates."""
        return {"late": self.late, "duplicates": self.duplicates}

    @property
    def live_records(self) -> int:
        """Records held in the window index (in memory): what the state holds now."""
        return len(self.index)

    def index_memory(self) -> dict[str, int] | None:
        """The window index's entries and its memory in bytes (an estimate: WindowIndex.memory_bytes)."""
        return {"entries": len(self.index), "bytes": self.index.memory_bytes()}

    # -- changelog ---------------------------------------------------------

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        """Changelog records since the last call: records first, then the counters. Also
        puts the stream time in the state (derived on replay: not in the changelog)."""
        if self.stream_time is not None:
            self.state.put(_STREAM_TIME_KEY, _pack_time(self.stream_time + _BIAS))
        changes: list[tuple[bytes, bytes | None]] = list(self._changes.items())
        for name in sorted(self._dirty_meta):
            key = keys.meta_key(name)
            changes.append((key, self.state.get(key) or b""))
        self._changes.clear()
        self._dirty_meta.clear()
        return changes

    def restore(self, key: bytes, value: bytes | None) -> None:
        """Apply one changelog record without emitting anything."""
        if value is None:
            return  # the join writes no tombstones; compaction may, harmlessly
        if key.startswith(keys.META):
            self.state.put(key, value)
            name = key[len(keys.META) :].decode()
            if name in COUNTERS:
                setattr(self, name, keys.decode_int(value))
            return
        if key.startswith(keys.RECORD):
            prefix, ts = split_record_key(key)
            self.state.put(key, value)
            if not self.index.holds(prefix, key):  # a flag update writes a record again
                self.index.add(prefix, key, ts, key[len(prefix) + 8 :])
            if self.stream_time is None or ts > self.stream_time:
                self.stream_time = ts
                self.state.put(_STREAM_TIME_KEY, keys.encode_int(ts))

    def finish_restore(self) -> None:
        """Drop what the restored stream time has expired, silently (already emitted)."""
        self._expire(emit=False)


def _drop_stored_index(state: KV) -> None:
    """Delete the index keys the join with its index in the state wrote (stored_window.py),
    and their mark, last (a crash midway leaves the mark: dropped again at the next start):
    this join keeps its index in memory and would not keep them current."""

    def deletes() -> Iterator[tuple[bytes, None]]:
        for prefix in (keys.EXPIRY_INDEX, keys.ID_INDEX):
            for key, _ in state.scan(*keys.prefix_bounds(prefix)):
                yield key, None
        yield keys.INDEX_MARK, None

    write_derived(state, deletes())


def _unmatched(record_key: bytes, value: bytes) -> Match:
    stored = keys.parse_record_key(record_key)
    if stored.side == "left":
        return Match(stored.key, value[1:], None, stored.ts)
    return Match(stored.key, None, value[1:], stored.ts)


# -- the compiled loop -------------------------------------------------------------

# tables/operators/_fastjoin.pyx's `process_many`, where it is built and in use (`LOOP.active`).
LOOP: CompiledPart[Callable[[WindowedJoin, Iterable[Event]], list[Match]]] = CompiledPart(
    "tables.operators._fastjoin",
    lambda module: module.bind(Match, _unmatched),
    "the windowed join's per-record loop",
)

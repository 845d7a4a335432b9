"""The windowed join with its index of live records kept in the state (RocksDB), not in memory:
`TANDEM_WINDOW_INDEX=rocksdb` (docs/operations.md, "Memory per worker").

`WindowedJoin` (tables/operators/windowed.py) indexes every live record in memory, a few
hundred bytes each, so a worker's memory grows with what its windows hold. This operator
keeps that index in the state instead, in key spaces of their own next to the records, as
Kafka Streams' window stores do:

| key | value | in changelog |
| --- | --- | --- |
| `x` expire_at record-key | empty: the time index (due records, in due-time order) | no |
| `i` side len(key) key id | empty: with the join's `id` option, the ids held (duplicates) | no |
| `w:window_index` | b"rocksdb": this state holds the two indexes above | no |

Partners are found by a range scan of the other side's records under their join key (byte
order is time order, tables/operators/keys.py), a duplicate by a point read, due records by a
scan of the time index from its start (read ahead READ_AHEAD entries at a time). What stays in
memory is bounded: the batch's pending writes and the read-ahead. Its memory is RocksDB's
(block cache, memtables), whatever the window holds; the cost is CPU per record (docs/bench/memory.md).

The indexes are derived from the records, never sent to the changelog: a restore writes them
as it applies each record, and a state the in-memory join wrote (no `w:window_index`) has them
built from its records when this operator is made; the in-memory join drops them when it is
made over a state this one wrote (they would go stale). Its results, counters, changelog and
stored records are the in-memory join's (tests/test_tables_index.py, test_tables_window_store.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from tables.compiled import CompiledPart
from tables.operators import keys
from tables.operators.base import Event
from tables.operators.keys import BYTE_SIDE, Side
from tables.operators.kv import KV, write_derived
from tables.operators.windowed import (
    MATCHED_FLAG,
    UNMATCHED_FLAG,
    JoinType,
    JoinWindow,
    Match,
    WindowedJoin,
    _unmatched,
)

_NEVER = 1 << 62
READ_AHEAD = 256  # expiry index entries read per scan beyond those due
# The two indexes this operator keeps in the state, and their key helpers.
EXPIRY = keys.EXPIRY_INDEX
ID = keys.ID_INDEX
# Set in a state whose indexes this operator keeps (not in the changelog: derived).
INDEX_MARK = keys.INDEX_MARK
ROCKSDB = b"rocksdb"


def index_key(index: bytes, at: int, key: bytes) -> bytes:
    return index + keys.encode_time(at) + key


def index_bounds(index: bytes) -> tuple[bytes, bytes]:
    return index, index[:-1] + bytes([index[-1] + 1])


def id_key(record_key: bytes) -> bytes:
    (length,) = keys.LEN.unpack_from(record_key, 2)
    key_end = keys.KEY_AT + length
    return ID + record_key[1:key_end] + record_key[key_end + 8 :]


_STREAM_TIME_KEY = keys.meta_key("stream_time")
_RECORD_LEFT = keys.RECORD + keys.SIDE_BYTE["left"]
_RECORD_RIGHT = keys.RECORD + keys.SIDE_BYTE["right"]
_ID_LEFT = ID + keys.SIDE_BYTE["left"]
_ID_RIGHT = ID + keys.SIDE_BYTE["right"]
_pack_time = keys.TIME.pack
_unpack_time = keys.TIME.unpack_from
_pack_len = keys.LEN.pack
_unpack_len = keys.LEN.unpack_from
# Memory of one partition's key filter: 4 MiB, 4 Mi counters. With fewer live (side, join key)
# pairs than a tenth of that, nine scans in ten for a key with no live partner are skipped.
FILTER_BYTES = 4 << 20
_SATURATED = 255


class KeyFilter:
    """How many live records each (side, join key) holds, by a hash of its record-key prefix
    into a fixed array of byte counters: the bounded in-memory part of the index. A count of
    0 is exact (no live record of any prefix hashed there), so the join skips the partner
    scan and the duplicate read for a key with nothing live; a count above 0 may be another
    key's (the scan then finds nothing). A counter that reaches 255 stays there (never
    decremented: a key with that many live records, or a crowded slot, is always scanned).
    Hashes are Python's, so the filter is rebuilt whenever the operator is made (from the
    time index: `StoredIndexJoin._count_live`), never stored."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"key filter of {size} bytes: give it at least 1")
        slots = 1 << (size.bit_length() - 1)  # a power of two: a hash's low bits pick the slot
        self.counts = bytearray(slots)
        self.mask = slots - 1

    def add(self, prefix: bytes) -> None:
        slot = hash(prefix) & self.mask
        if self.counts[slot] < _SATURATED:
            self.counts[slot] += 1

    def remove(self, prefix: bytes) -> None:
        slot = hash(prefix) & self.mask
        count = self.counts[slot]
        if 0 < count < _SATURATED:
            self.counts[slot] = count - 1

    def may_hold(self, prefix: bytes) -> bool:
        return self.counts[hash(prefix) & self.mask] > 0


_BIAS = keys.TIME_BIAS


class StoredIndexJoin(WindowedJoin):
    """The join of one task (partition) over its state, its indexes stored in it.

    The per-record path (`process`) is written flat, with the key layout of
    tables/operators/keys.py inlined: it runs once per input record and its cost is the
    join's throughput (docs/bench/worker.md)."""

    def __init__(
        self,
        state: KV,
        window: JoinWindow | None = None,
        join_type: JoinType = JoinType.INNER,
        ids: bool = False,
        filter_bytes: int = FILTER_BYTES,
    ) -> None:
        """`ids`: records carry their own ids (the join's `id` option), and one with an id
        already held for its side and key is a duplicate whatever its time. Otherwise the
        id is the input offset, and a duplicate is a record read twice (same time too).
        `filter_bytes`: the memory of the key filter (KeyFilter), rounded down to a power of 2.

        Builds the state's indexes from its records if the in-memory join wrote it (one
        scan of its records); else reads the time index once (its live records, counted
        and put in the key filter)."""
        self.state = state
        self.ids = ids
        self.window = window or JoinWindow()
        self.join_type = join_type
        self._tracked = join_type.unmatched_sides
        self._changes: dict[bytes, bytes] = {}
        self._dirty_meta: set[str] = set()
        # Lower bound of the earliest entry of the time index: skip scans until due.
        self._due = -_NEVER
        # Read-ahead of the time index: every entry due at or before `_ahead_until`,
        # in order, so expiry scans the state once per READ_AHEAD entries, not per record.
        self._ahead: list[bytes] = []
        self._ahead_until = -_NEVER
        w = self.window
        self._closes = {"left": w.after + w.grace, "right": w.before + w.grace}
        self._retention = w.before + w.after + w.grace
        self.stream_time: int | None = self._meta("stream_time")
        self.late = self._meta("late") or 0
        self.duplicates = self._meta("duplicates") or 0
        self.filter = KeyFilter(filter_bytes)
        self._live = self._build_indexes() if state.get(INDEX_MARK) != ROCKSDB else self._count_live()

    def _build_indexes(self) -> int:
        """Index the records of a state the in-memory join wrote (none of its keys indexed),
        and mark the state as indexed, last (kv.write_derived: a chunk at a time; a crash
        midway leaves no mark, and the next start indexes it again). The count of records."""
        count = 0
        add, retention, ids = self.filter.add, self._retention, self.ids

        def index_keys() -> Iterator[tuple[bytes, bytes]]:
            nonlocal count
            for record_key, _ in self.state.scan(*keys.prefix_bounds(keys.RECORD)):
                end = keys.KEY_AT + _unpack_len(record_key, 2)[0]
                ts = _unpack_time(record_key, end)[0] - _BIAS
                yield EXPIRY + _pack_time(ts + retention + _BIAS) + record_key, b""
                if ids:
                    yield ID + record_key[1:end] + record_key[end + 8 :], b""  # id_key
                add(record_key[:end])
                count += 1
            yield INDEX_MARK, ROCKSDB

        # The time index's first scan starts at its beginning (`_due` stays unknown).
        write_derived(self.state, index_keys())
        return count

    def _count_live(self) -> int:
        count, add = 0, self.filter.add
        for entry, _ in self.state.scan(*index_bounds(EXPIRY)):
            add(entry[9 : 9 + keys.KEY_AT + _unpack_len(entry, 11)[0]])  # the record's prefix
            count += 1
        return count

    @property
    def live_records(self) -> int:
        """Records the time index holds: what the state holds now (none of them in memory)."""
        return self._live

    def index_memory(self) -> dict[str, int]:
        """The index's part in memory: the key filter and the time index's read-ahead (at
        most 2 * READ_AHEAD entries), whatever the window holds."""
        ahead = sum(map(len, self._ahead)) + 64 * len(self._ahead)
        return {"entries": self._live, "bytes": len(self.filter.counts) + ahead}

    # -- processing -------------------------------------------------------

    def process_many(self, events: Iterable[Event]) -> list[Match]:
        """`process` of each event in turn (WindowedJoin's loops keep their index in memory):
        compiled (tables/operators/_fastwindow.pyx) where it is built and in use
        (`STORED_LOOP.active`), else in Python, the reference (`process`)."""
        fast = STORED_LOOP.fast
        if fast is not None and type(self) is StoredIndexJoin:
            return fast(self, events)
        results: list[Match] = []
        process = self.process
        for side, key, ts, record_id, value in events:
            results += process(side, key, ts, record_id, value)  # type: ignore[arg-type]  # never None here
        return results

    def process(self, side: Side, key: bytes, ts: int, record_id: bytes, value: bytes) -> list[Match]:
        """Matches caused by one input record (and unmatched records now due)."""
        state = self.state
        left = side == "left"
        joined = _pack_len(len(key)) + key
        prefix = (_RECORD_LEFT if left else _RECORD_RIGHT) + joined
        own = prefix + _pack_time(ts + _BIAS) + record_id
        identity = ((_ID_LEFT if left else _ID_RIGHT) + joined + record_id) if self.ids else own
        counts, mask = self.filter.counts, self.filter.mask
        slot = hash(prefix) & mask
        # Duplicates first: a record read again after a takeover is one, not a late record.
        # None of its side and key live (the filter says so, exactly): none is the same.
        if counts[slot] and state.get(identity) is not None:
            self._count("duplicates")
            return []
        now = self.stream_time
        if now is not None and ts + self._closes[side] < now:
            self._count("late")
            return []
        if now is None or ts > now:
            self.stream_time = ts  # written to the state once per batch (take_changes)
            results = self._expire(True) if self._due < ts else []
        else:
            results = []

        # Partners: the other side's records of this join key within the window.
        window = self.window
        if left:
            other = _RECORD_RIGHT + joined
            lo, hi = ts - window.before, ts + window.after
        else:
            other = _RECORD_LEFT + joined
            lo, hi = ts - window.after, ts + window.before
        found = (
            list(state.scan(other + _pack_time(lo + _BIAS), other + _pack_time(hi + 1 + _BIAS)))
            if counts[hash(other) & mask]  # else no record of the other side and key is live
            else ()
        )
        if found:
            at = len(other)
            other_tracked = ("right" if left else "left") in self._tracked
            changes = self._changes
            for partner_key, partner in found:
                partner_ts = _unpack_time(partner_key, at)[0] - _BIAS
                later = ts if ts > partner_ts else partner_ts
                if left:
                    results.append(Match(key, value, partner[1:], later))
                else:
                    results.append(Match(key, partner[1:], value, later))
                if other_tracked and partner[:1] == UNMATCHED_FLAG:
                    # Only the flag changes: the partner's index entry stays as it is.
                    partner = MATCHED_FLAG + partner[1:]
                    changes[partner_key] = partner
                    state.put(partner_key, partner)

        # The record itself, and its index entry.
        stored = (MATCHED_FLAG if found else UNMATCHED_FLAG) + value
        self._changes[own] = stored
        state.put(own, stored)
        if identity is not own:
            state.put(identity, b"")
        expire_at = ts + self._retention
        entry = EXPIRY + _pack_time(expire_at + _BIAS) + own
        state.put(entry, b"")
        self._live += 1
        if counts[slot] < _SATURATED:  # KeyFilter.add, inlined
            counts[slot] += 1
        if expire_at <= self._ahead_until:
            self._add_ahead(entry)
        if expire_at < self._due:
            self._due = expire_at
        return results

    # -- expiry and unmatched emission ------------------------------------

    def _index(self, record_key: bytes, ts: int) -> None:
        """Add a restored record's index entry (process inlines this)."""
        expire_at = self.window.retained_until(ts)
        entry = index_key(EXPIRY, expire_at, record_key)
        self.state.put(entry, b"")
        if self.ids:
            self.state.put(id_key(record_key), b"")
        if expire_at <= self._ahead_until:
            self._add_ahead(entry)
        self._due = min(self._due, expire_at)

    def _add_ahead(self, entry: bytes) -> None:
        """Keep a new index entry that falls inside the read-ahead (once: a restored
        record may be written again), and keep the read-ahead short."""
        ahead = self._ahead
        at = bisect_left(ahead, entry)
        if at < len(ahead) and ahead[at] == entry:
            return
        ahead.insert(at, entry)
        if len(ahead) > 2 * READ_AHEAD:
            # Keep the entries before the time of the READ_AHEAD-th: all of each time.
            cut_at = _unpack_time(ahead[READ_AHEAD], 1)[0] - _BIAS
            del ahead[bisect_left(ahead, EXPIRY + _pack_time(cut_at + _BIAS)) :]
            self._ahead_until = cut_at - 1

    def _expire(self, emit: bool) -> list[Match]:
        """One time index serves retention and unmatched emission (both fall due at
        `retained_until(ts)`): when an entry comes due, the record is emitted if its side
        is tracked and its flag still says unmatched, then deleted."""
        results: list[Match] = []
        state = self.state
        tracked = self._tracked
        for index_entry in self._take_due():
            record_key = index_entry[9:]
            if emit and tracked and BYTE_SIDE[record_key[1]] in tracked:
                value = state.get(record_key)
                if value is not None and value[:1] == UNMATCHED_FLAG:
                    results.append(_unmatched(record_key, value))
            # Unreachable once due: no record still accepted has a partner range reaching
            # back to it, and the index is read from the earliest live entry on.
            state.expire(record_key)
            if self.ids:
                state.expire(id_key(record_key))
            state.expire(index_entry)
            self._live -= 1
            self.filter.remove(record_key[: keys.KEY_AT + _unpack_len(record_key, 2)[0]])
        return results

    def _take_due(self) -> list[bytes]:
        """Index entries whose time is before stream time, from the read-ahead when it
        covers them, else from a scan that also refills the read-ahead."""
        now = self.stream_time
        if now is None or self._due >= now:
            return []
        ahead = self._ahead
        if self._ahead_until < now - 1:
            ahead, self._ahead_until = self._read_ahead(now)
            self._ahead = ahead
        cut = bisect_left(ahead, EXPIRY + _pack_time(now + _BIAS))
        due = ahead[:cut]
        del ahead[:cut]
        if ahead:
            self._due = _unpack_time(ahead[0], 1)[0] - _BIAS
        else:
            until = self._ahead_until
            self._due = until + 1 if until < _NEVER else _NEVER
        return due

    def _read_ahead(self, now: int) -> tuple[list[bytes], int]:
        """Every index entry due before `now` plus about READ_AHEAD more (all of each
        time), and the time up to which the list is complete. The scan starts at the
        earliest live entry, so it never walks the tombstones expiry leaves behind."""
        lo, hi = index_bounds(EXPIRY)
        if self._due > -_NEVER:
            lo = EXPIRY + keys.encode_time(self._due)
        entries: list[bytes] = []
        kept, last_at = 0, -_NEVER
        for entry, _ in self.state.scan(lo, hi):
            at = _unpack_time(entry, 1)[0] - _BIAS
            if at >= now:
                if kept >= READ_AHEAD and at > last_at:
                    return entries, last_at
                kept += 1
                last_at = at
            entries.append(entry)
        return entries, _NEVER

    # -- counters, changelog, finish_restore: WindowedJoin's own ------------

    def restore(self, key: bytes, value: bytes | None) -> None:
        """Apply one changelog record without emitting anything."""
        if value is None or not key.startswith(keys.RECORD):
            super().restore(key, value)  # counters (a tombstone: nothing), as WindowedJoin does
            return
        # Flat, as `process` (a restore or a standby applies every record of the changelog).
        state = self.state
        end = keys.KEY_AT + _unpack_len(key, 2)[0]
        ts = _unpack_time(key, end)[0] - _BIAS
        counts, slot = self.filter.counts, hash(key[:end]) & self.filter.mask
        # New unless a flag update writes it again (then indexed already); none of its side and
        # key live (the filter's exact zero): new without a read.
        if not counts[slot] or state.get(key) is None:
            self._live += 1
            if counts[slot] < _SATURATED:  # KeyFilter.add
                counts[slot] += 1
            expire_at = ts + self._retention
            entry = EXPIRY + _pack_time(expire_at + _BIAS) + key
            state.put(entry, b"")
            if self.ids:
                state.put(ID + key[1:end] + key[end + 8 :], b"")  # id_key
            if expire_at <= self._ahead_until:
                self._add_ahead(entry)
            if expire_at < self._due:
                self._due = expire_at
        state.put(key, value)
        if self.stream_time is None or ts > self.stream_time:
            self.stream_time = ts
            self.state.put(_STREAM_TIME_KEY, keys.encode_int(ts))


# tables/operators/_fastwindow.pyx's `process_many`, where it is built and in use (`STORED_LOOP.active`).
STORED_LOOP: CompiledPart[Callable[[StoredIndexJoin, Iterable[Event]], list[Match]]] = CompiledPart(
    "tables.operators._fastwindow",
    lambda module: module.process_many,
    "the windowed join's per-record loop with its index in RocksDB",
)

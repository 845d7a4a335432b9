"""Windowed stream-stream join of impressions (left) and clicks (right), KIP-633 style.

Pure operator, no I/O: it reads and writes an ordered key-value state (tables/kv.py;
layout in tables/keys.py) and returns output records exactly as in
docs/join-semantics.md.

    join = WindowedJoin(state, JoinWindow(before=0, after=600_000, grace=60_000), JoinType.LEFT)
    results = join.process("left", impression)   # list of output records
    changes = join.take_changes()                # (key, value) pairs for the changelog
    join.restore(key, value); join.finish_restore()  # apply a changelog, emitting nothing

Time only moves forward: a record is late, dropped and counted, when its window
closed before it arrived; unmatched records of a left or outer join are emitted
once stream time passes their window plus grace; every record is deleted once
no record still accepted could match it. Both run by range scans over time
indexes, never over the whole state.
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tables import keys
from tables.keys import BYTE_SIDE, RecordKey
from tables.kv import KV
from tables.records import Side

UNMATCHED_FLAG = b"\x00"
MATCHED_FLAG = b"\x01"
_NEVER = 1 << 62
READ_AHEAD = 256  # expiry index entries read per scan beyond those due
OTHER: dict[Side, Side] = {"left": "right", "right": "left"}


class JoinType(enum.Enum):
    INNER = "inner"
    LEFT = "left"
    OUTER = "outer"

    @property
    def unmatched_sides(self) -> frozenset[Side]:
        """Sides whose unmatched records are emitted with the other side null."""
        if self is JoinType.LEFT:
            return frozenset({"left"})
        if self is JoinType.OUTER:
            return frozenset({"left", "right"})
        return frozenset()


@dataclass(frozen=True, slots=True)
class JoinWindow:
    """`left.ts - before <= right.ts <= left.ts + after`; `grace` for late records (ms)."""

    before: int = 0
    after: int = 600_000
    grace: int = 60_000

    def __post_init__(self) -> None:
        if min(self.before, self.after, self.grace) < 0:
            raise ValueError(f"window bounds must not be negative: {self}")

    def closes_at(self, side: Side, ts: int) -> int:
        """Stream time after which the record is late (dropped if it arrives later)."""
        return ts + (self.after if side == "left" else self.before) + self.grace

    def retained_until(self, ts: int) -> int:
        """Last stream time at which a record still accepted could match this one:
        an unmatched record is emitted, and any record deleted, once stream time passes it."""
        return ts + self.before + self.after + self.grace

    def match_range(self, side: Side, ts: int) -> tuple[int, int]:
        """Inclusive range of the other side's timestamps that match a record."""
        if side == "left":
            return ts - self.before, ts + self.after
        return ts - self.after, ts + self.before


def output_record(
    auction_id: str,
    left: tuple[str, str, int] | None,
    right: tuple[str, int] | None,
) -> dict[str, Any]:
    """An `ad-joins` record; left = (impression_id, campaign_id, ts), right = (click_id, ts)."""
    kind = "inner" if left and right else "left" if left else "right"
    times = [side[-1] for side in (left, right) if side]
    return {
        "join_id": f"{left[0] if left else ''}|{right[0] if right else ''}",
        "auction_id": auction_id,
        "campaign_id": left[1] if left else None,
        "impression_id": left[0] if left else None,
        "click_id": right[0] if right else None,
        "impression_ts": left[2] if left else None,
        "click_ts": right[1] if right else None,
        "ts": max(times),
        "kind": kind,
    }


_STREAM_TIME_KEY = keys.meta_key("stream_time")
_RECORD_LEFT = keys.RECORD + keys.SIDE_BYTE["left"]
_RECORD_RIGHT = keys.RECORD + keys.SIDE_BYTE["right"]
_pack_time = keys.TIME.pack
_unpack_time = keys.TIME.unpack_from
_pack_len = keys.LEN.pack
_BIAS = keys.TIME_BIAS


class WindowedJoin:
    """The join of one task (partition) over its state.

    The per-record path (`process`) is written flat, with the key layout of
    tables/keys.py inlined: it runs once per input record and its cost is the
    join's throughput (docs/bench/tables.md)."""

    def __init__(
        self,
        state: KV,
        window: JoinWindow | None = None,
        join_type: JoinType = JoinType.INNER,
    ) -> None:
        self.state = state
        self.window = window or JoinWindow()
        self.join_type = join_type
        self._tracked = join_type.unmatched_sides
        self._changes: dict[bytes, bytes] = {}
        self._dirty_meta: set[str] = set()
        self._counter_values: dict[str, int] = {}  # add_counter's values, read once
        # Lower bounds of the earliest entry of each time index: skip scans until due.
        # UNMATCHED is a legacy index (see _expire): scanned once, then only if written.
        self._due = {keys.UNMATCHED: -_NEVER, keys.EXPIRY: -_NEVER}
        # Read-ahead of the expiry index: every entry due at or before `_ahead_until`,
        # in order, so expiry scans the state once per READ_AHEAD entries, not per record.
        self._ahead: list[bytes] = []
        self._ahead_until = -_NEVER
        w = self.window
        self._closes = {"left": w.after + w.grace, "right": w.before + w.grace}
        self._retention = w.before + w.after + w.grace
        self.stream_time: int | None = self._meta("stream_time")
        self.late = self._meta("late") or 0
        self.duplicates = self._meta("duplicates") or 0

    # -- processing -------------------------------------------------------

    def process(self, side: Side, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Output records caused by one validated input record (tables.records.validate)."""
        ts: int = record["ts"]
        now = self.stream_time
        if now is not None and ts + self._closes[side] < now:
            self._count("late")
            return []
        state = self.state
        event_id: str = record["event_id"]
        raw_event = event_id.encode()
        left = side == "left"
        event_key = (b"eL" if left else b"eR") + raw_event
        if state.get(event_key) is not None:
            self._count("duplicates")
            return []
        if now is None or ts > now:
            self.stream_time = ts
            state.put(_STREAM_TIME_KEY, _pack_time(ts + _BIAS))
            due = self._due
            expiring = due[keys.EXPIRY] < ts or due[keys.UNMATCHED] < ts
            results = self._expire(True) if expiring else []
        else:
            results = []

        # Partners: the other side's records of this join key within the window.
        auction_id: str = record["auction_id"]
        raw_auction = auction_id.encode()
        joined = _pack_len(len(raw_auction)) + raw_auction
        window = self.window
        if left:
            other_prefix = _RECORD_RIGHT + joined
            lo, hi = ts - window.before, ts + window.after
        else:
            other_prefix = _RECORD_LEFT + joined
            lo, hi = ts - window.after, ts + window.before
        found = list(
            state.scan(other_prefix + _pack_time(lo + _BIAS), other_prefix + _pack_time(hi + 1 + _BIAS))
        )
        if found:
            at = len(other_prefix)
            other_tracked = ("right" if left else "left") in self._tracked
            for key, value in found:
                other_ts = _unpack_time(key, at)[0] - _BIAS
                other_id = key[at + 8 :].decode()
                if left:
                    i_id, campaign, i_ts, c_id, c_ts = (
                        event_id,
                        record["campaign_id"],
                        ts,
                        other_id,
                        other_ts,
                    )
                else:
                    i_id, campaign, i_ts, c_id, c_ts = (other_id, value[1:].decode(), other_ts, event_id, ts)
                results.append(
                    {
                        "join_id": f"{i_id}|{c_id}",
                        "auction_id": auction_id,
                        "campaign_id": campaign,
                        "impression_id": i_id,
                        "click_id": c_id,
                        "impression_ts": i_ts,
                        "click_ts": c_ts,
                        "ts": i_ts if i_ts > c_ts else c_ts,
                        "kind": "inner",
                    }
                )
                if other_tracked and value[:1] == UNMATCHED_FLAG:
                    # Only the flag changes: the partner's index entries stay as they are.
                    value = MATCHED_FLAG + value[1:]
                    self._changes[key] = value
                    state.put(key, value)

        # The record itself, and its index entries.
        key = (_RECORD_LEFT if left else _RECORD_RIGHT) + joined + _pack_time(ts + _BIAS) + raw_event
        flag = MATCHED_FLAG if found else UNMATCHED_FLAG
        value = flag + record["campaign_id"].encode() if left else flag
        self._changes[key] = value
        state.put(key, value)
        state.put(event_key, b"")
        expire_at = ts + self._retention
        entry = keys.EXPIRY + _pack_time(expire_at + _BIAS) + key
        state.put(entry, b"")
        if expire_at <= self._ahead_until:
            self._add_ahead(entry)
        if expire_at < self._due[keys.EXPIRY]:
            self._due[keys.EXPIRY] = expire_at
        return results

    # -- state shared by processing and restore --------------------------

    def _apply_record(self, key: bytes, value: bytes, stored: RecordKey) -> None:
        """Store a record and derive its index entries (restore; process inlines this).

        One time index serves retention and unmatched emission (both fall due at
        `retained_until(ts)`): when an entry comes due, the record is emitted if its
        side is tracked and its flag is still unmatched, then deleted."""
        self.state.put(key, value)
        self.state.put(keys.event_key(stored.side, stored.event_id), b"")
        expire_at = self.window.retained_until(stored.ts)
        entry = keys.index_key(keys.EXPIRY, expire_at, key)
        self.state.put(entry, b"")
        if expire_at <= self._ahead_until:
            self._add_ahead(entry)
        self._due[keys.EXPIRY] = min(self._due[keys.EXPIRY], expire_at)

    def _add_ahead(self, entry: bytes) -> None:
        """Keep a new expiry entry that falls inside the read-ahead (once: a restored
        record may be written again), and keep the read-ahead short."""
        ahead = self._ahead
        at = bisect_left(ahead, entry)
        if at < len(ahead) and ahead[at] == entry:
            return
        ahead.insert(at, entry)
        if len(ahead) > 2 * READ_AHEAD:
            # Keep the entries before the time of the READ_AHEAD-th: all of each time.
            cut_at = _unpack_time(ahead[READ_AHEAD], 1)[0] - _BIAS
            del ahead[bisect_left(ahead, keys.EXPIRY + _pack_time(cut_at + _BIAS)) :]
            self._ahead_until = cut_at - 1

    def _expire(self, emit: bool) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        state = self.state
        # Legacy: databases written before the two indexes were merged hold `u` entries
        # (due at the same time as their `x` entry, or earlier). A record emitted from
        # there is flagged matched in the state (not in the changelog: derived, like the
        # index) so that its `x` entry does not emit it again.
        for index_entry in self._take_due(keys.UNMATCHED):
            record_key = index_entry[9:]
            value = state.get(record_key)
            if value is not None and value[:1] == UNMATCHED_FLAG:
                if emit:
                    results.append(self._unmatched_output(record_key, value))
                state.put(record_key, MATCHED_FLAG + value[1:])
            state.delete(index_entry)
        tracked = self._tracked
        for index_entry in self._take_due_expiry():
            record_key = index_entry[9:]
            if tracked and BYTE_SIDE[record_key[1]] in tracked:
                value = state.get(record_key)
                if emit and value is not None and value[:1] == UNMATCHED_FLAG:
                    results.append(self._unmatched_output(record_key, value))
            state.delete(record_key)
            (length,) = keys.LEN.unpack_from(record_key, 2)
            state.delete(keys.EVENT + record_key[1:2] + record_key[4 + length + 8 :])
            state.delete(index_entry)
        return results

    def _take_due_expiry(self) -> list[bytes]:
        """Expiry entries whose time is before stream time, from the read-ahead when it
        covers them, else from a scan that also refills the read-ahead."""
        now = self.stream_time
        if now is None or self._due[keys.EXPIRY] >= now:
            return []
        ahead = self._ahead
        if self._ahead_until < now - 1:
            ahead, self._ahead_until = self._read_ahead(now)
            self._ahead = ahead
        cut = bisect_left(ahead, keys.EXPIRY + _pack_time(now + _BIAS))
        due = ahead[:cut]
        del ahead[:cut]
        if ahead:
            self._due[keys.EXPIRY] = _unpack_time(ahead[0], 1)[0] - _BIAS
        else:
            until = self._ahead_until
            self._due[keys.EXPIRY] = until + 1 if until < _NEVER else _NEVER
        return due

    def _read_ahead(self, now: int) -> tuple[list[bytes], int]:
        """Every expiry entry due before `now` plus about READ_AHEAD more (all of each
        time), and the time up to which the list is complete."""
        lo, hi = keys.index_bounds(keys.EXPIRY)
        if self._due[keys.EXPIRY] > -_NEVER:
            lo = keys.EXPIRY + keys.encode_time(self._due[keys.EXPIRY])
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

    def _take_due(self, index: bytes) -> list[bytes]:
        """Index entries whose time is before stream time.

        The scan starts at the earliest live entry (`_due`), not at the start of the
        index, so it never walks the tombstones that expiry leaves behind."""
        now = self.stream_time
        if now is None or self._due[index] >= now:
            return []
        due: list[bytes] = []
        next_at = _NEVER
        lo, hi = keys.index_bounds(index)
        if self._due[index] > -_NEVER:
            lo = index + keys.encode_time(self._due[index])
        for entry, _ in self.state.scan(lo, hi):
            at = keys.decode_time(entry[1:9])
            if at >= now:
                next_at = at
                break
            due.append(entry)
        self._due[index] = next_at
        return due

    @staticmethod
    def _unmatched_output(record_key: bytes, value: bytes) -> dict[str, Any]:
        stored = keys.parse_record_key(record_key)
        if stored.side == "left":
            return output_record(stored.auction_id, (stored.event_id, value[1:].decode(), stored.ts), None)
        return output_record(stored.auction_id, None, (stored.event_id, stored.ts))

    # -- metadata: counters and input offsets -----------------------------

    def _meta(self, name: str) -> int | None:
        raw = self.state.get(keys.meta_key(name))
        return None if raw is None else keys.decode_int(raw)

    def _set_meta(self, name: str, value: int) -> None:
        self.state.put(keys.meta_key(name), keys.encode_int(value))
        self._dirty_meta.add(name)

    def _count(self, name: str) -> None:
        value = getattr(self, name) + 1
        setattr(self, name, value)
        self._set_meta(name, value)

    def add_counter(self, name: str, delta: int = 1) -> int:
        """Add to a named counter kept with the state and its changelog (e.g. per-campaign
        totals): committed, restored and handed over exactly like the join state."""
        meta = f"count:{name}"
        value = self._counter_values.get(meta)
        if value is None:  # read once from the state, then kept: only this join writes it
            value = self._meta(meta) or 0
        value += delta
        self._counter_values[meta] = value
        self._set_meta(meta, value)
        return value

    def counters(self, prefix: str = "") -> dict[str, int]:
        """Named counters whose name starts with `prefix`."""
        start = keys.meta_key("count:")
        lo = keys.meta_key(f"count:{prefix}")
        return {
            key[len(start) :].decode(): keys.decode_int(value)
            for key, value in self.state.scan(lo, lo + b"\xff")  # no 0xff byte in UTF-8
        }

    def set_input_offset(self, topic: str, next_offset: int) -> None:
        """Record how far the input is processed, atomically with the state it produced."""
        self._set_meta(f"in:{topic}", next_offset)

    def input_offset(self, topic: str) -> int | None:
        """Next offset of `topic` to process, as recorded in the state (None = unknown)."""
        return self._meta(f"in:{topic}")

    # -- changelog ---------------------------------------------------------

    def take_changes(self) -> list[tuple[bytes, bytes]]:
        """Changelog records since the last call: records first, then the counters and
        input offsets, so a changelog cut short never claims input it does not hold."""
        changes = list(self._changes.items())
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
            if name in ("late", "duplicates"):
                setattr(self, name, keys.decode_int(value))
            self._counter_values.pop(name, None)
            return
        if key.startswith(keys.RECORD):
            stored = keys.parse_record_key(key)
            self._apply_record(key, value, stored)
            ts = stored.ts
            if self.stream_time is None or ts > self.stream_time:
                self.stream_time = ts
                self.state.put(keys.meta_key("stream_time"), keys.encode_int(ts))

    def finish_restore(self) -> None:
        """Drop what the restored stream time has expired, silently (already emitted)."""
        self._expire(emit=False)

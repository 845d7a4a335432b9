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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tables import keys
from tables.keys import RecordKey
from tables.kv import KV
from tables.records import Side

UNMATCHED_FLAG = b"\x00"
MATCHED_FLAG = b"\x01"
_NEVER = 1 << 62
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


class WindowedJoin:
    """The join of one task (partition) over its state."""

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
        # Lower bounds of the earliest entry of each time index: skip scans until due.
        self._due = {keys.UNMATCHED: -_NEVER, keys.EXPIRY: -_NEVER}
        self.stream_time: int | None = self._meta("stream_time")
        self.late = self._meta("late") or 0
        self.duplicates = self._meta("duplicates") or 0

    # -- processing -------------------------------------------------------

    def process(self, side: Side, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Output records caused by one validated input record (tables.records.validate)."""
        ts: int = record["ts"]
        if self.stream_time is not None and self.window.closes_at(side, ts) < self.stream_time:
            self._count("late")
            return []
        if self.state.get(keys.event_key(side, record["event_id"])) is not None:
            self._count("duplicates")
            return []
        results = self._advance(ts, emit=True)
        matches = self._match(side, record)
        payload = record["campaign_id"].encode() if side == "left" else b""
        flag = MATCHED_FLAG if matches else UNMATCHED_FLAG
        stored = RecordKey(side, record["auction_id"], ts, record["event_id"])
        key = keys.record_key(side, stored.auction_id, ts, stored.event_id)
        self._write_record(key, flag + payload, stored)
        return results + matches

    def _match(self, side: Side, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        other = OTHER[side]
        lo, hi = self.window.match_range(side, record["ts"])
        prefix = keys.key_prefix(other, record["auction_id"])
        found = list(
            self.state.scan(prefix + keys.encode_time(lo), prefix + keys.encode_time(hi + 1))
        )
        results = []
        for key, value in found:
            stored = keys.parse_record_key(key)
            if side == "left":
                left = (record["event_id"], record["campaign_id"], record["ts"])
                right = (stored.event_id, stored.ts)
            else:
                left = (stored.event_id, value[1:].decode(), stored.ts)
                right = (record["event_id"], record["ts"])
            results.append(output_record(record["auction_id"], left, right))
            if other in self._tracked and value[:1] == UNMATCHED_FLAG:
                self._write_record(key, MATCHED_FLAG + value[1:], stored)
        return results

    def _write_record(self, key: bytes, value: bytes, stored: RecordKey) -> None:
        self._changes[key] = value
        self._apply_record(key, value, stored)

    # -- state shared by processing and restore --------------------------

    def _apply_record(self, key: bytes, value: bytes, stored: RecordKey) -> None:
        """Store a record and derive its index entries (also on restore)."""
        self.state.put(key, value)
        self.state.put(keys.event_key(stored.side, stored.event_id), b"")
        expire_at = self.window.retained_until(stored.ts)
        self.state.put(keys.index_key(keys.EXPIRY, expire_at, key), b"")
        self._due[keys.EXPIRY] = min(self._due[keys.EXPIRY], expire_at)
        if stored.side in self._tracked:
            # Kept when the record matches (no tombstone per match); checked when due.
            # Not at closes_at: a partner accepted until its own close could still match.
            emit_at = self.window.retained_until(stored.ts)
            self.state.put(keys.index_key(keys.UNMATCHED, emit_at, key), b"")
            self._due[keys.UNMATCHED] = min(self._due[keys.UNMATCHED], emit_at)

    def _advance(self, ts: int, emit: bool) -> list[dict[str, Any]]:
        if self.stream_time is not None and ts <= self.stream_time:
            return []
        self.stream_time = ts
        self.state.put(keys.meta_key("stream_time"), keys.encode_int(ts))
        return self._expire(emit)

    def _expire(self, emit: bool) -> list[dict[str, Any]]:
        results = []
        for index_entry in self._take_due(keys.UNMATCHED):
            record_key = index_entry[9:]
            value = self.state.get(record_key)
            if emit and value is not None and value[:1] == UNMATCHED_FLAG:
                results.append(self._unmatched_output(keys.parse_record_key(record_key), value))
            self.state.delete(index_entry)
        for index_entry in self._take_due(keys.EXPIRY):
            record_key = index_entry[9:]
            stored = keys.parse_record_key(record_key)
            self.state.delete(record_key)
            self.state.delete(keys.event_key(stored.side, stored.event_id))
            self.state.delete(index_entry)
        return results

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
    def _unmatched_output(stored: RecordKey, value: bytes) -> dict[str, Any]:
        if stored.side == "left":
            return output_record(
                stored.auction_id, (stored.event_id, value[1:].decode(), stored.ts), None
            )
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
        value = (self._meta(f"count:{name}") or 0) + delta
        self._set_meta(f"count:{name}", value)
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

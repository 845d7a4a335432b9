"""Temporal (enrichment) join: each stream record joined with its table's value as of the
record's event time (Kafka Streams' KStream-KTable join over a versioned table with
stream-side grace, KIP-914 and KIP-923). The rules are docs/join-semantics.md,
"Enrichment: a stream joined with a table as of event time".

Pure operator, no I/O: it reads and writes an ordered key-value state (tables/operators/kv.py)
and returns matches. Keys and values are bytes, never decoded. Side "left" is the stream,
"right" the table; a table value of None is a delete.

    join = TemporalJoin(state, how="left", grace=60_000, history=86_400_000)
    matches = join.process_many(events)          # (side, key, ts, record id, value) each
    changes = join.take_changes()                # (key, value or None) for the changelog
    join.restore(key, value); join.finish_restore()

Nothing is indexed in memory: the versions and the pending stream records live in the
state only, under their own prefixes (docs/tables.md, "The temporal join's state"), so
the memory used does not grow with the number of keys. The operator keeps a few numbers:
stream time, counters, and where the next pending record and the next delete to sweep lie;
and up to 2 * READ_AHEAD pending records read ahead of their emission.

| key | value |
| --- | --- |
| `l` len(key) key | the key's latest version: ts, offset, oldest (8 bytes each), then as `v` |
| `v` len(key) key ~ts ~offset | an older version: `\\x01` + the table's value, or `\\x00` for a delete |
| `p` ts len(key) key id | the pending stream record's value |
| `d` len(key) key id | ts of the pending record (with declared ids only) |
| `g` ts len(key) key | empty: a delete at ts, to sweep once `S - history` passes it |
| `m:` name | big-endian int: stream_time, late, duplicates, late_updates, latest_layout |

The latest version of each key has a key of its own (`l`, read by a `get`, bloom-filtered),
as Kafka Streams' versioned store keeps its "latest value store": a lookup as of a time at or
after it (a stream record newer than its key's last update: the common case) and an update
newer than it (the common case again) are each one point read, whatever the size of the
store. Its `oldest` is a lower bound of the time of the key's oldest `v` version (all ones:
it has none), so a lookup before every version and an update with no older version at or
before the prune point need no scan either. The older versions lie under `v`: `~` is the
bitwise complement, so one ascending scan from `v` key ~t finds the latest of them at or
before t first, and of two at one time the later offset first.

A state written before the `l` keys (no `m:latest_layout`) holds every version under `v`:
the operator moves each key's newest to `l` before its first batch (`_ensure_layout`).
"""

from __future__ import annotations

import struct
from bisect import insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from tables.operators import keys
from tables.operators.base import Match, Side
from tables.operators.kv import KV
from tables.operators.meta import StateMeta

# One input record as this operator takes it: the table's value may be None (a delete).
TemporalEvent = tuple[Side, bytes, int, bytes, bytes | None]

VERSION = b"v"
LATEST = b"l"
PENDING = b"p"
PENDING_ID = b"d"
GONE = b"g"
_PENDING_END = b"q"
_GONE_END = b"h"

PRESENT = b"\x01"
DELETED = b"\x00"

HOWS = ("inner", "left")
COUNTERS = ("late", "duplicates", "late_updates")
OFFSET_BYTES = 8  # a table record's id: its Kafka offset, big-endian (tables/records/codecs.py)

_U64 = struct.Struct(">Q")
_MAX_U64 = (1 << 64) - 1
_BIAS = keys.TIME_BIAS
_MAX_TIME = (1 << 63) - 1  # the largest time a state key can hold
_pack_len = keys.LEN.pack
_unpack_len = keys.LEN.unpack_from
_TIME_AT = 1  # in `p` and `g` keys, the time follows the one-byte prefix
_KEY_AT = 1 + 8 + keys.LEN.size  # in `p` and `g` keys, where the join key starts
_VERSIONS_END = b"\xff" * 17  # after every `~ts ~offset` (16 bytes) under one key's prefix
_VERSION_END = b"w"  # after every `v` key
_COMPLEMENT = bytes(255 - byte for byte in range(256))  # bytes.translate: each byte's complement
_STREAM_TIME_KEY = keys.meta_key("stream_time")
# Marks a state whose latest versions are under `l` (absent: every version under `v`).
LAYOUT_KEY = keys.meta_key("latest_layout")
_LAYOUT = keys.encode_int(1)
# In an `l` value: the version's time and offset (its order), the oldest `v` time, its body.
_ORDER_END = 16
_OLDEST_AT = 16
_BODY_AT = 24
_NO_HISTORY = b"\xff" * 8  # `oldest` of a key without older versions


def _time(ms: int) -> bytes:
    """Big-endian, biased: byte order is time order. Clamped (for scan bounds)."""
    return _U64.pack(min(max(ms + _BIAS, 0), _MAX_U64))


def _inverted_time(ms: int) -> bytes:
    """The complement of `_time`: byte order is reverse time order. Clamped."""
    return _U64.pack(_MAX_U64 - min(max(ms + _BIAS, 0), _MAX_U64))


def _decode_time(raw: bytes, at: int) -> int:
    return int(_U64.unpack_from(raw, at)[0]) - _BIAS


def version_offset(version_key: bytes) -> int:
    """The table record's offset of a version, from its state key (`v` ... ~ts ~offset)."""
    return _MAX_U64 - int(_U64.unpack_from(version_key, len(version_key) - 8)[0])


def _join_key(key: bytes) -> bytes:
    """len(key) + key: what follows a prefix (and a time) in every key of one join key."""
    return _pack_len(len(key)) + key


class TemporalJoin(StateMeta):
    """The temporal join of one partition over its state (an `Operator`)."""

    # Pending records read from the state at a time when some fall due, and held at most
    # (twice this): emission one record at a time (each stream record moving stream time
    # past the grace of one earlier) costs a list step, not a RocksDB iterator and seek.
    READ_AHEAD = 256

    def __init__(
        self, state: KV, how: str = "inner", grace: int = 0, history: int = 0, ids: bool = False
    ) -> None:
        """`how`: "inner" or "left"; `grace` and `history` in ms, `history >= grace >= 0`.
        `ids`: stream records carry declared ids, and one whose id is pending for its key is a
        duplicate whatever its time; otherwise the id is the input offset. The table's ids are
        always its offsets (8 bytes, big-endian): they order versions of equal timestamps.

        Reads a few keys of `state` and the first pending record and delete to sweep. Make
        it over a state whose pending writes came from nothing but `restore`, or none (a
        fresh overlay, as the runtime does): expired keys of an overlay would be scanned."""
        check_parameters(how, grace, history)
        self.state = state
        self.how = how
        self.grace = grace
        self.history = history
        self.ids = ids
        self._left = how == "left"
        self._changes: dict[bytes, bytes | None] = {}
        self._dirty_meta: set[str] = set()
        self.stream_time: int | None = self._meta("stream_time")
        self._stream_time_kept = self.stream_time  # what the state holds
        self.late = self._meta("late") or 0
        self.duplicates = self._meta("duplicates") or 0
        self.late_updates = self._meta("late_updates") or 0
        # Every pending record below `_due_from` was emitted and every delete below
        # `_sweep_from` swept: scans start there (past the tombstones the store may still hold,
        # and the keys this overlay expired, which its scans would not skip).
        self._due_from = PENDING
        self._sweep_from = GONE
        self._next_due: int | None = None  # the earliest pending record's time (or lower)
        self._next_sweep: int | None = None  # the earliest delete to sweep (or lower)
        # The pending records from `_due_from` up to `_ahead_end` (every one below it is
        # here; None: none read), in key order; those before `_ahead_at` were emitted.
        self._ahead: list[tuple[bytes, bytes]] = []
        self._ahead_at = 0
        self._ahead_end: bytes | None = None
        self._layout_checked = self.state.get(LAYOUT_KEY) is not None
        self._load_hints()

    # -- processing -------------------------------------------------------

    def process_many(self, events: Iterable[TemporalEvent]) -> list[Match]:
        """Each (side, key, ts, record id, value) in turn: the results of stream records
        that fall due as stream time moves, and of stream records joined at once (past grace
        on arrival). Table updates emit nothing."""
        results: list[Match] = []
        if not self._layout_checked:
            self._ensure_layout()
        for side, key, ts, record_id, value in events:
            if side == "left":
                if value is None:
                    raise ValueError("a stream record without a value (the runtime drops those)")
                self._stream_record(key, ts, record_id, value, results)
            elif side == "right":
                self._table_update(key, ts, record_id, value, results)
            else:
                raise ValueError(f"unknown side {side!r}")
        return results

    def process(self, side: Side, key: bytes, ts: int, record_id: bytes, value: bytes | None) -> list[Match]:
        """`process_many` of one event."""
        return self.process_many(((side, key, ts, record_id, value),))

    def _stream_record(
        self, key: bytes, ts: int, record_id: bytes, value: bytes, results: list[Match]
    ) -> None:
        state = self.state
        joined = _join_key(key)
        pending_key = PENDING + _time(ts) + joined + record_id
        id_key = PENDING_ID + joined + record_id if self.ids else None
        # Duplicates first: a record read again after a takeover is one, not a late record.
        if state.get(pending_key if id_key is None else id_key) is not None:
            self._count("duplicates")
            return
        now = self.stream_time
        if now is not None and ts + self.grace < now:  # past grace on arrival
            if ts < now - self.history:
                self._count("late")  # the versions as of ts may be pruned: no answer
            else:
                self._emit(key, ts, record_id, value, results)
            return
        if now is None or ts > now:
            self._move_to(ts, results)
        self._put(pending_key, value)
        if self._ahead_end is not None and pending_key < self._ahead_end:
            self._hold_ahead(pending_key, value)
        if id_key is not None:
            self._put(id_key, _time(ts))
        if self._next_due is None or ts < self._next_due:
            self._next_due = ts

    def _table_update(
        self, key: bytes, ts: int, record_id: bytes, value: bytes | None, results: list[Match]
    ) -> None:
        if len(record_id) != OFFSET_BYTES:
            raise ValueError(
                f"a table record's id must be its offset ({OFFSET_BYTES} bytes), not {record_id!r}: "
                "versions of one timestamp are ordered by it"
            )
        now = self.stream_time
        if now is not None and ts < now - self.history:
            self._count("late_updates")  # its neighbours may be pruned: it cannot be placed
            return
        if now is None or ts > now:
            self._move_to(ts, results)
        joined = _join_key(key)
        self._add_version(joined, self._order(ts, record_id), DELETED if value is None else PRESENT + value)
        if value is None:  # to sweep once the prune point passes it (ts >= prune point here)
            self._put(GONE + _time(ts) + joined, b"")
            if self._next_sweep is None or ts < self._next_sweep:
                self._next_sweep = ts

    def advance(self, stream_time: int) -> list[Match]:
        """Stream time moves to `stream_time` (if later) without a record: the results of
        pending records that fall due by then (`ts + grace < stream_time`)."""
        results: list[Match] = []
        if not self._layout_checked:
            self._ensure_layout()
        stream_time = min(stream_time, _MAX_TIME)
        if self.stream_time is None or stream_time > self.stream_time:
            self._move_to(stream_time, results)
        return results

    # -- time: emission of pending records, the sweep of deletes ------------

    def _watermark(self) -> int:
        """Pending records with a time below this are due (`ts + grace < stream time`)."""
        assert self.stream_time is not None
        return self.stream_time - self.grace

    def _prune_point(self) -> int:
        """Lookups are only made at or after this time (`stream time - history`)."""
        assert self.stream_time is not None
        return self.stream_time - self.history

    def _move_to(self, stream_time: int, results: list[Match]) -> None:
        """Stream time moves forward: emit what falls due, then sweep deletes (in this order:
        a due record is looked up before the versions it needs can be pruned)."""
        self.stream_time = stream_time
        if self._next_due is not None and self._next_due < self._watermark():
            self._emit_due(results)
        if self._next_sweep is not None and self._delete_removable(self._next_sweep, self._prune_point()):
            self._sweep()

    def _emit_due(self, results: list[Match]) -> None:
        watermark = self._watermark()
        due: list[tuple[bytes, bytes]] = []
        self._next_due = None
        ahead, at = self._ahead, self._ahead_at
        while True:
            if at == len(ahead):  # every one held emitted: the next ones, if any
                found = self._read_ahead()
                ahead, at = self._ahead, 0
                if not found:
                    break
            item = ahead[at]
            ts = _decode_time(item[0], _TIME_AT)
            if ts >= watermark:
                self._next_due = ts
                break
            due.append(item)
            at += 1
        if at > self.READ_AHEAD:  # the emitted ones go
            del ahead[:at]
            at = 0
        self._ahead_at = at
        expire = self.state.expire
        for pending_key, value in due:
            key_end = _KEY_AT + _unpack_len(pending_key, 9)[0]
            key, ts = pending_key[_KEY_AT:key_end], _decode_time(pending_key, _TIME_AT)
            self._emit(key, ts, pending_key[key_end:], value, results)
            expire(pending_key)
            self._changes[pending_key] = None
            if self.ids:
                id_key = PENDING_ID + pending_key[9:]
                expire(id_key)
                self._changes[id_key] = None
        self._due_from = PENDING + _time(watermark)

    def _read_ahead(self) -> bool:
        """In place of those held (all emitted): the next READ_AHEAD pending records from
        the state; False if there are none."""
        end = self._ahead_end
        if end == _PENDING_END:  # none left to read
            self._ahead, self._ahead_at = [], 0
            return False
        scan = self.state.scan(self._due_from if end is None else end, _PENDING_END)
        self._ahead = list(islice(scan, self.READ_AHEAD))
        self._ahead_at = 0
        full = len(self._ahead) == self.READ_AHEAD
        self._ahead_end = self._ahead[-1][0] + b"\x00" if full else _PENDING_END
        return bool(self._ahead)

    def _hold_ahead(self, pending_key: bytes, value: bytes) -> None:
        """A pending record written below `_ahead_end`: held with the others, in order; the
        last ones let go (read again when due) past twice READ_AHEAD."""
        ahead = self._ahead
        if not ahead or pending_key > ahead[-1][0]:
            ahead.append((pending_key, value))
        else:
            insort(ahead, (pending_key, value), lo=self._ahead_at)
        if len(ahead) - self._ahead_at > 2 * self.READ_AHEAD:
            keep = self._ahead_at + self.READ_AHEAD
            self._ahead_end = ahead[keep][0]
            del ahead[keep:]

    def _sweep(self) -> None:
        """Deletes the prune point has passed: prune their keys (which removes the delete
        and every older version if it is still the key's latest at or before that point)."""
        prune_point = self._prune_point()
        due, self._next_sweep = self._scan_until(
            self._sweep_from, _GONE_END, lambda ts: self._delete_removable(ts, prune_point)
        )
        expire = self.state.expire
        for gone_key, _ in due:
            self._prune_key(gone_key[9:], prune_point)
            expire(gone_key)
            self._changes[gone_key] = None
        self._sweep_from = GONE + _time(prune_point)

    def _scan_until(
        self, lo: bytes, hi: bytes, due: Callable[[int], bool]
    ) -> tuple[list[tuple[bytes, bytes]], int | None]:
        """The items from `lo` whose time (after the one-byte prefix) is `due`, in order,
        and the time of the first item that is not (None: there is none)."""
        found: list[tuple[bytes, bytes]] = []
        for item in self.state.scan(lo, hi):
            ts = _decode_time(item[0], _TIME_AT)
            if not due(ts):
                return found, ts
            found.append(item)
        return found, None

    # -- the versioned table -------------------------------------------------

    def _order(self, ts: int, record_id: bytes) -> bytes:
        """A version's time and offset, 16 bytes whose byte order is the versions' order
        (the later offset after the earlier at one time). Its complement ends its `v` key."""
        return _time(ts) + record_id

    def _add_version(self, joined: bytes, order: bytes, body: bytes) -> None:
        """A table update of the key `joined` (len + key): `order` is its time and offset
        (16 bytes, byte order is version order), `body` its flagged value. A version newer
        than the key's latest takes its place (the latest goes to `v`), an older one goes to
        `v`; then what no lookup can find any more is pruned."""
        latest_key = LATEST + joined
        latest = self.state.get(latest_key)
        if latest is None:  # a new key (or one whose delete was swept): no older version
            self._put(latest_key, order + _NO_HISTORY + body)
            return
        head, oldest = latest[:_ORDER_END], latest[_OLDEST_AT:_BODY_AT]
        if order >= head:  # the new latest (the same record read again: its value again)
            if order != head:
                self._put(self._older_key(joined, head), latest[_BODY_AT:])
                oldest = min(oldest, head[:8])
            latest = order + oldest + body
        else:  # an update into the key's history
            self._put(self._older_key(joined, order), body)
            latest = head + min(oldest, order[:8]) + latest[_BODY_AT:]
        pruned = self._pruned(joined, latest, self._prune_point())
        if pruned is None:
            self._delete(latest_key)
        else:
            self._put(latest_key, pruned)

    def _older_key(self, joined: bytes, order: bytes) -> bytes:
        """The `v` key of a version of time and offset `order` (as in an `l` value): `~ts
        ~offset`, so a key's versions lie newest first, and the later offset first at one time."""
        return VERSION + joined + order[:_ORDER_END].translate(_COMPLEMENT)

    def _lookup(self, key: bytes, ts: int) -> bytes | None:
        """The table's value for `key` as of `ts`: its latest version at or before `ts`
        (the later offset at one time), None if there is none or it is a delete."""
        found = self._version_at(key, ts)
        return found[1][1:] if found is not None and found[1][:1] == PRESENT else None

    def _version_at(self, key: bytes, ts: int) -> tuple[bytes, bytes] | None:
        """`key`'s latest version at or before `ts` (a delete too) as (its `v` key, its
        flagged value), or None. A get of its latest; a scan only for a time before it."""
        joined = _join_key(key)
        latest = self.state.get(LATEST + joined)
        if latest is None:
            return None
        at = _time(ts)
        if latest[:8] <= at:
            return self._older_key(joined, latest), latest[_BODY_AT:]
        if latest[_OLDEST_AT:_BODY_AT] > at:  # before every version
            return None
        versions = VERSION + joined
        for item in self.state.scan(versions + _inverted_time(ts), versions + _VERSIONS_END):
            return item
        return None

    def _prune_key(self, joined: bytes, prune_point: int) -> None:
        """`_pruned` of the key `joined` as the state holds it, written back."""
        latest_key = LATEST + joined
        latest = self.state.get(latest_key)
        if latest is None:
            return  # pruned already, by an update of the key
        pruned = self._pruned(joined, latest, prune_point)
        if pruned is None:
            self._delete(latest_key)
        elif pruned != latest:
            self._put(latest_key, pruned)

    def _pruned(self, joined: bytes, latest: bytes, prune_point: int) -> bytes | None:
        """Remove what no lookup at or after `prune_point` can find: of the key's versions at
        or before it, all but the latest; and that one too if it is a removable delete.
        Returns the key's `l` value after it (None: the key has no version left). Scans only
        when its `oldest` says a `v` version may lie at or before the prune point."""
        oldest = latest[_OLDEST_AT:_BODY_AT]
        point = _time(prune_point)
        versions = VERSION + joined
        if latest[:8] <= point:  # the latest is at or before it: every older version goes
            if oldest != _NO_HISTORY:
                for stored_key, _ in list(self.state.scan(versions, versions + _VERSIONS_END)):
                    self._delete(stored_key)
                latest = latest[:_OLDEST_AT] + _NO_HISTORY + latest[_BODY_AT:]
            removable = self._delete_removable(_decode_time(latest, 0), prune_point)
            return None if latest[_BODY_AT:] == DELETED and removable else latest
        if oldest > point:
            return latest
        older = list(self.state.scan(versions + _inverted_time(prune_point), versions + _VERSIONS_END))
        kept: int | None = None
        if older:  # newest first
            first_key, first = older[0]
            first_time = _MAX_U64 - _U64.unpack_from(first_key, len(versions))[0] - _BIAS
            if first[:1] == PRESENT or not self._delete_removable(first_time, prune_point):
                del older[0]  # the latest version at or before the prune point: kept
                kept = first_time
        for stored_key, _ in older:
            self._delete(stored_key)
        if kept is not None:
            oldest = _time(kept)
        else:  # what is left lies after the prune point, if anything is
            left = next(iter(self.state.scan(versions, versions + _inverted_time(prune_point))), None)
            oldest = _NO_HISTORY if left is None else _time(prune_point + 1)
        return latest[:_OLDEST_AT] + oldest + latest[_BODY_AT:]

    def _ensure_layout(self) -> None:
        """Before the first batch over a state without the layout mark: move each key's
        newest version from `v` to `l` (a state an earlier version wrote), then mark it. In
        the changelog too, so a restore from it needs no move."""
        self._layout_checked = True
        if self.state.get(LAYOUT_KEY) is not None:  # marked since (restored)
            return
        first: tuple[bytes, bytes, bytes] | None = None  # joined, newest key, its value
        oldest = _NO_HISTORY
        for stored_key, value in list(self.state.scan(VERSION, _VERSION_END)):
            joined = stored_key[1 : len(stored_key) - 16]
            if first is None or first[0] != joined:
                if first is not None:
                    self._move_to_latest(*first, oldest)
                first, oldest = (joined, stored_key, value), _NO_HISTORY
            else:
                oldest = _time(_MAX_U64 - _U64.unpack_from(stored_key, len(stored_key) - 16)[0] - _BIAS)
        if first is not None:
            self._move_to_latest(*first, oldest)
        self._put(LAYOUT_KEY, _LAYOUT)

    def _move_to_latest(self, joined: bytes, version_key: bytes, value: bytes, oldest: bytes) -> None:
        order = version_key[len(version_key) - 16 :].translate(_COMPLEMENT)
        self._delete(version_key)
        self._put(LATEST + joined, order + oldest + value)

    def _delete_removable(self, delete_time: int, prune_point: int) -> bool:
        """A key's latest delete (with every older version) can go once the prune point
        passes it. Not when it reaches it: an update at that very time with an earlier offset
        is still accepted (it is not older than history), and must stay hidden behind it."""
        return delete_time < prune_point

    def _emit(self, key: bytes, ts: int, record_id: bytes, value: bytes, results: list[Match]) -> None:
        """The stream record (`key`, `ts`, `record_id`) joined as of `ts` (`record_id`: for a
        subclass that traces which record made each result, as the batch twin does)."""
        table_value = self._lookup(key, ts)
        if table_value is not None or self._left:
            results.append(Match(key, value, table_value, ts))

    # -- state writes, counters, changelog -----------------------------------

    def _put(self, key: bytes, value: bytes) -> None:
        self.state.put(key, value)
        self._changes[key] = value

    def _delete(self, key: bytes) -> None:
        self.state.delete(key)
        self._changes[key] = None

    def counters(self) -> dict[str, int]:
        """Records dropped, kept with the state: stream records older than history (`late`),
        stream records already pending (`duplicates`), table updates older than history
        (`late_updates`)."""
        return {name: getattr(self, name) for name in COUNTERS}

    @property
    def live_records(self) -> None:
        """None: the temporal join holds no records in memory (its state is all in RocksDB)."""
        return None

    def index_memory(self) -> None:
        """None: the temporal join keeps no index of records (its lookups are RocksDB reads)."""
        return None

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        """The changelog records since the last call (None: a delete): state keys first,
        then the counters and the stream time, each with its last value."""
        if self.stream_time is not None and self.stream_time != self._stream_time_kept:
            self.state.put(_STREAM_TIME_KEY, keys.encode_int(self.stream_time))
            self._stream_time_kept = self.stream_time
            self._dirty_meta.add("stream_time")
        changes = list(self._changes.items())
        for name in sorted(self._dirty_meta):
            key = keys.meta_key(name)
            changes.append((key, self.state.get(key)))
        self._changes.clear()
        self._dirty_meta.clear()
        return changes

    def restore(self, key: bytes, value: bytes | None) -> None:
        """Apply one changelog record, emitting nothing."""
        if value is None:
            self.state.delete(key)
            return
        self.state.put(key, value)
        if key.startswith(keys.META):
            name = key[len(keys.META) :].decode()
            if name == "stream_time":
                self.stream_time = self._stream_time_kept = keys.decode_int(value)
            elif name in COUNTERS:
                setattr(self, name, keys.decode_int(value))
        elif key.startswith(PENDING):
            ts = _decode_time(key, _TIME_AT)
            if self._next_due is None or ts < self._next_due:
                self._next_due = ts
        elif key.startswith(GONE):
            ts = _decode_time(key, _TIME_AT)
            if self._next_sweep is None or ts < self._next_sweep:
                self._next_sweep = ts

    def finish_restore(self) -> None:
        """The changelog is applied: find the next pending record and delete again (the
        restore's deletes may have left the hints low). Nothing falls due: the changelog's
        stream time is the one its pending records were written under."""
        self._load_hints()

    def _load_hints(self) -> None:
        self._ahead, self._ahead_at, self._ahead_end = [], 0, None
        if self.stream_time is not None:  # what is due by then was emitted, what is past swept
            self._due_from = PENDING + _time(self._watermark())
            self._sweep_from = GONE + _time(self._prune_point())
        self._next_due = self._first_time(self._due_from, _PENDING_END)
        self._next_sweep = self._first_time(self._sweep_from, _GONE_END)

    def _first_time(self, lo: bytes, hi: bytes) -> int | None:
        for stored_key, _ in self.state.scan(lo, hi):
            return _decode_time(stored_key, _TIME_AT)
        return None


def check_parameters(how: str, grace: int, history: int) -> None:
    """ValueError unless `how` is inner or left and `history >= grace >= 0` (ms)."""
    if how not in HOWS:
        raise ValueError(f"how must be one of {HOWS}, not {how!r}")
    if grace < 0:
        raise ValueError(f"grace must not be negative: {grace}")
    if history < grace:
        raise ValueError(
            f"history ({history} ms) must be at least grace ({grace} ms): a record waiting out its "
            "grace is looked up in the table's history"
        )


# -- the declaration's side ------------------------------------------------------------


@dataclass(frozen=True)
class TemporalKind:
    """A temporal (enrichment) join (docs/join-semantics.md), as the runtime makes and shows it."""

    how: str
    grace_ms: int
    history_ms: int
    name: str = "temporal"
    table_side: Side = "right"  # the table: its null values are deletes, its ids its offsets
    # Counters are read by key, and so are the id of a pending record and a key's latest
    # version; older versions, pending records and deletes to sweep are scanned (the batch
    # overlay must index them).
    unscanned: tuple[bytes, ...] = field(default=(keys.META, PENDING_ID, LATEST))

    def __post_init__(self) -> None:
        check_parameters(self.how, self.grace_ms, self.history_ms)

    def operator(self, state: KV, ids: bool) -> TemporalJoin:
        return TemporalJoin(state, self.how, self.grace_ms, self.history_ms, ids)

    def emits_unmatched(self) -> bool:
        return self.how == "left"

    def retention_ms(self) -> None:
        """Compaction only: a key's latest version must be kept however old it is, and
        what the join removes it deletes with a tombstone."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "how": self.how, "grace_ms": self.grace_ms, "history_ms": self.history_ms}

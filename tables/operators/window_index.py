"""The in-memory index of one join partition's live records: which records each join key
holds on each side, in time order, and when each one falls due.

The records themselves (their values and matched flags) stay in the state (RocksDB);
the index holds their keys only and is rebuilt from the state whenever an operator is
made over it (`load`), so it never needs a changelog of its own. It answers the three
questions the operator asks of every input record without a read of the state: is this
record already held (a duplicate), which records of the other side fall in its window
(partners), and which records are now due (expiry and unmatched emission).

Memory: a few hundred bytes per live record (its key, a list slot, a heap entry; with
the join's `id` option, a set entry more): docs/tables.md, "Memory".
"""

from __future__ import annotations

import heapq
import sys
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable

from tables.operators import keys

_unpack_len = keys.LEN.unpack_from
_unpack_time = keys.TIME.unpack_from
_BIAS = keys.TIME_BIAS
_KEY_AT = keys.KEY_AT


_TUPLE2 = sys.getsizeof((0, b""))
_INT = 32  # a due time (a few 30-bit digits), in its allocation
_LIST = sys.getsizeof([])


def _granules(size: int) -> int:
    """Bytes CPython's small-object allocator takes for an object of `size` bytes."""
    return (size + 7) // 8 * 8


def split_record_key(record_key: bytes) -> tuple[bytes, int]:
    """(prefix: the `r` side len key part, time in ms) of a record key (tables/operators/keys.py)."""
    end = _KEY_AT + _unpack_len(record_key, 2)[0]
    return record_key[:end], _unpack_time(record_key, end)[0] - _BIAS


class WindowIndex:
    """The live records of one partition, by join key and side, and by due time.

    `by_prefix[prefix]` is the sorted list of record keys under one record-key prefix
    (side and join key): byte order is time order, then id. Due times are (expire_at,
    record key) pairs, popped in that order (the order of the time index they replace):
    records come in event-time order as a rule (the runtime aligns its inputs), so each
    pair is appended to the sorted queue `due`, and only one that sorts before the
    queue's last goes to the heap `late_due`.

    The operator's per-record path (`WindowedJoin.process_many`) reads and extends these
    structures in place, as `add` does (partners: a bisection of the other side's list);
    `add` serves restores, `holds` restores and the duplicate check of a join without ids."""

    def __init__(self, retention: int, ids: bool) -> None:
        self.retention = retention
        self.by_prefix: dict[bytes, list[bytes]] = {}
        self.due: deque[tuple[int, bytes]] = deque()
        self.late_due: list[tuple[int, bytes]] = []
        # With the join's `id` option: prefix + id of every live record (duplicates by id).
        self.ids: set[bytes] | None = set() if ids else None

    def __len__(self) -> int:
        return len(self.due) + len(self.late_due)

    def memory_bytes(self) -> int:
        """An estimate of the memory the index holds, in O(1): its objects' sizes as CPython
        allocates them (8-byte granules), with the key lengths of one record held taken for
        all. Within 15 % of tracemalloc's count for uniform keys (tests/test_tables_index.py)."""
        entries = len(self)
        if not entries:
            return 0
        sample = self.due[-1][1] if self.due else self.late_due[0][1]
        prefix_len = _KEY_AT + _unpack_len(sample, 2)[0]
        # Per record: its key, its due entry (a 2-tuple and an int), a deque and a list slot.
        per_record = _granules(sys.getsizeof(sample)) + _TUPLE2 + _INT + 8 + 8
        # Per join key and side: its prefix, its list, the dict's table (exact).
        per_prefix = _granules(sys.getsizeof(sample[:prefix_len])) + _LIST + 8
        total = entries * per_record + len(self.by_prefix) * per_prefix + sys.getsizeof(self.by_prefix)
        total += sys.getsizeof(self.due) + sys.getsizeof(self.late_due)
        if self.ids is not None:
            id_len = len(sample) - 8  # prefix + id
            total += sys.getsizeof(self.ids) + len(self.ids) * _granules(sys.getsizeof(b"") + id_len)
        return total

    def load(self, records: Iterable[bytes]) -> None:
        """Index every record key of a state, read in key order."""
        by_prefix, ids, retention = self.by_prefix, self.ids, self.retention
        due: list[tuple[int, bytes]] = []
        for record_key in records:
            prefix, ts = split_record_key(record_key)
            held = by_prefix.get(prefix)
            if held is None:
                by_prefix[prefix] = [record_key]
            else:
                held.append(record_key)  # key order: each list is built sorted
            due.append((ts + retention, record_key))
            if ids is not None:
                ids.add(prefix + record_key[len(prefix) + 8 :])
        due.sort()
        self.due.extend(due)

    def holds(self, prefix: bytes, record_key: bytes) -> bool:
        held = self.by_prefix.get(prefix)
        if held is None:
            return False
        at = bisect_left(held, record_key)
        return at < len(held) and held[at] == record_key

    def add(self, prefix: bytes, record_key: bytes, ts: int, record_id: bytes) -> None:
        """Index a record not held yet."""
        held = self.by_prefix.get(prefix)
        if held is None:
            self.by_prefix[prefix] = [record_key]
        elif record_key > held[-1]:
            held.append(record_key)
        else:
            insort(held, record_key)
        entry = (ts + self.retention, record_key)
        due = self.due
        if not due or entry > due[-1]:
            due.append(entry)
        else:
            heapq.heappush(self.late_due, entry)
        if self.ids is not None:
            self.ids.add(prefix + record_id)

    def pop_due(self, now: int) -> list[bytes]:
        """Remove and return the records due before stream time `now` (retained until
        before it), in (due time, key) order."""
        due, late = self.due, self.late_due
        if late:
            out = self._pop_merged(now)
        elif due and due[0][0] < now:  # the rule (records in event-time order): the queue alone
            popleft = due.popleft
            out = [popleft()[1]]
            while due and due[0][0] < now:
                out.append(popleft()[1])
        else:
            return []
        by_prefix, ids = self.by_prefix, self.ids
        for record_key in out:
            end = _KEY_AT + _unpack_len(record_key, 2)[0]
            prefix = record_key[:end]
            held = by_prefix[prefix]
            if held[0] != record_key:  # the oldest of its key, as a rule: due in time order
                held.remove(record_key)
            elif len(held) == 1:
                del by_prefix[prefix]
                continue
            else:
                del held[0]
            if not held:
                del by_prefix[prefix]
        if ids is not None:
            for record_key in out:
                end = _KEY_AT + _unpack_len(record_key, 2)[0]
                ids.discard(record_key[:end] + record_key[end + 8 :])
        return out

    def _pop_merged(self, now: int) -> list[bytes]:
        """The due records of both the queue and the heap, in (due time, key) order."""
        due, late = self.due, self.late_due
        out: list[bytes] = []
        while True:
            if due and due[0][0] < now and (not late or due[0] < late[0]):
                out.append(due.popleft()[1])
            elif late and late[0][0] < now:
                out.append(heapq.heappop(late)[1])
            else:
                return out

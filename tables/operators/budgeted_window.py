"""The windowed join's default index (`TANDEM_WINDOW_INDEX=budget`): in memory while the
worker's in-memory indexes fit a budget (`TANDEM_WINDOW_INDEX_BUDGET_MB`), in the state
beyond it (docs/operations.md, "Memory per worker").

The in-memory index (tables/operators/window_index.py, `WindowedJoin`) is the fastest, and
costs a few hundred bytes of RAM per live record; the index in RocksDB
(tables/operators/stored_window.py, `StoredIndexJoin`) costs more CPU per record and no RAM
per record. `BudgetedJoin` runs a partition's join with the first while every in-memory index
of the process together stays under the budget (`IndexBudget`, shared by every partition and
join of a worker, active and standby), and moves a partition to the second ("spills" it) when
they outgrow it: the partition whose index is at least the average of those still in memory,
so the large ones go first. A spill builds the index keys from the records in the state (one
scan, written straight to the store a chunk at a time, kv.write_derived) and frees the
partition's in-memory index; results, counters, changelog and records are the same whichever
operator runs (tests/test_tables_budget.py).

A spilled state stays spilled (its mark, `w:window_index`, says so) when it is opened again,
unless its live records would take less than a quarter of the budget in memory: then the
in-memory join takes it back (and drops the stored index). So a window that grew past the
budget once does not keep a worker in the slow mode for good.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import weakref
from collections.abc import Callable, Iterable

from tables.operators import keys
from tables.operators.base import Event, Match, Side
from tables.operators.kv import KV, Overlay
from tables.operators.stored_window import FILTER_BYTES, ROCKSDB, StoredIndexJoin
from tables.operators.windowed import JoinType, JoinWindow, WindowedJoin

# What one live record costs in memory, for deciding whether a spilled state fits again
# (index_memory()'s bytes per entry run from ~300 to ~460 with ids: docs/bench/memory.md).
BYTES_PER_RECORD = 460
# Calls of a spilling join that wait for its batch overlay to be written (the spill's index
# keys then go straight to the store, a chunk at a time) before it spills all the same.
SPILL_WAITS = 64


class IndexBudget:
    """The memory the in-memory window indexes of one process may take together, in bytes.

    Each `BudgetedJoin` whose index is in memory reports its size after each call that can
    grow it (`report`); the budget keeps the sum, in O(1) per report."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"window index budget of {limit} bytes: give it 0 or more")
        self.limit = limit
        self._sizes: dict[int, int] = {}
        self.total = 0
        self.spills = 0  # partitions moved to the index in RocksDB since the process started
        self._ids = itertools.count()

    def join(self) -> int:
        """A new in-memory index, of 0 bytes: its id for `report` and `leave`."""
        number = next(self._ids)
        self._sizes[number] = 0
        return number

    def report(self, number: int, size: int) -> bool:
        """Index `number` holds `size` bytes: whether it should spill (the sum is over the
        budget, and this index is at least the average of those in memory, or the sum is
        over 1.5 times the budget)."""
        sizes = self._sizes
        self.total += size - sizes.get(number, 0)
        sizes[number] = size
        total = self.total
        if total <= self.limit:
            return False
        # The largest first; anyone once the sum is half again over (a large index that
        # no longer grows would otherwise let the small ones grow to its size each).
        return size * len(sizes) >= total or 2 * total > 3 * self.limit

    def leave(self, number: int) -> None:
        """Index `number` is no longer in memory (spilled, or its operator gone)."""
        self.total -= self._sizes.pop(number, 0)

    @property
    def in_memory(self) -> int:
        """Indexes in memory now."""
        return len(self._sizes)


class BudgetedJoin:
    """The windowed join of one partition, its index in memory within the budget, in the
    state beyond it. The `Operator` of tables/operators/base.py, delegating to the join it runs."""

    def __init__(
        self,
        state: KV,
        window: JoinWindow,
        join_type: JoinType,
        ids: bool,
        budget: IndexBudget,
        filter_bytes: int = FILTER_BYTES,
    ) -> None:
        self.state = state
        self.window = window
        self.join_type = join_type
        self.ids = ids
        self.budget = budget
        self.filter_bytes = filter_bytes
        self._number: int | None = None  # in the budget while the index is in memory
        self._spill_due = 0  # calls waited since the budget asked for a spill (0: none asked)
        self.inner: WindowedJoin = self._open()

    def _open(self) -> WindowedJoin:
        """The in-memory join, unless the state holds a spilled index that does not fit in a
        quarter of the budget (the stored join then counts its live records, one scan)."""
        if self.state.get(keys.INDEX_MARK) == ROCKSDB:
            stored = StoredIndexJoin(self.state, self.window, self.join_type, self.ids, self.filter_bytes)
            if stored.live_records * BYTES_PER_RECORD * 4 > self.budget.limit - self.budget.total:
                _scan_records(self.state)
                return stored
            del stored
        join = WindowedJoin(self.state, self.window, self.join_type, self.ids)
        self._enter(join)
        return join

    def _enter(self, join: WindowedJoin) -> None:
        number = self.budget.join()
        self._number = number
        weakref.finalize(self, self.budget.leave, number)
        if self.budget.report(number, join.index_memory()["bytes"]):  # type: ignore[index]
            self._spill_due = 1

    @property
    def spilled(self) -> bool:
        """Whether the index is in the state (RocksDB), not in memory."""
        return self._number is None

    # -- the Operator ---------------------------------------------------------------

    @property
    def stream_time(self) -> int | None:
        return self.inner.stream_time

    @stream_time.setter
    def stream_time(self, value: int | None) -> None:
        self.inner.stream_time = value

    def process(self, side: Side, key: bytes, ts: int, record_id: bytes, value: bytes) -> list[Match]:
        return self.process_many(((side, key, ts, record_id, value),))

    def process_many(self, events: Iterable[Event]) -> list[Match]:
        if self._spill_due:
            self._maybe_spill()
        results = self.inner.process_many(events)
        if self._number is not None:
            self._measure()
        return results

    def advance(self, stream_time: int) -> list[Match]:
        return self.inner.advance(stream_time)

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        return self.inner.take_changes()

    def restore(self, key: bytes, value: bytes | None) -> None:
        """Apply one changelog record. The budget is checked once per fetch (finish_restore),
        and a spill it asks for happens at the next fetch's first record, its overlay written."""
        if self._spill_due:
            self._maybe_spill()
        self.inner.restore(key, value)

    def finish_restore(self) -> None:
        self.inner.finish_restore()
        if self._number is not None:
            self._measure()

    def counters(self) -> dict[str, int]:
        return self.inner.counters()

    @property
    def live_records(self) -> int:
        return self.inner.live_records

    def index_memory(self) -> dict[str, int] | None:
        return self.inner.index_memory()

    @property
    def late(self) -> int:
        return self.inner.late

    @property
    def duplicates(self) -> int:
        return self.inner.duplicates

    # -- the spill -----------------------------------------------------------------

    def _measure(self) -> None:
        size = self.inner.index.memory_bytes()
        if self.budget.report(self._number, size) and not self._spill_due:  # type: ignore[arg-type]
            self._spill_due = 1

    def _maybe_spill(self) -> None:
        """Spill now if the batch overlay holds nothing (its writes are in the store, so the
        index keys go straight there, a chunk at a time), or after SPILL_WAITS calls anyway."""
        pending = getattr(self.state, "pending", None)
        if pending and self._spill_due < SPILL_WAITS:
            self._spill_due += 1
            return
        self._spill()

    def _spill(self) -> None:
        """Move the index to the state: the stored join builds it from the records (their
        keys scanned; what this batch wrote is pending in the overlay, which from now on must
        index record keys for its scans), takes over the batch's changes and the counters,
        and the in-memory index is freed."""
        memory = self.inner
        _scan_records(self.state)
        stored = StoredIndexJoin(self.state, self.window, self.join_type, self.ids, self.filter_bytes)
        stored.stream_time = memory.stream_time
        stored.late, stored.duplicates = memory.late, memory.duplicates
        stored._closes = memory._closes  # as its user set them (a self-join's: self_join.py)
        stored._changes = memory._changes
        stored._dirty_meta = memory._dirty_meta
        self.inner = stored
        self._spill_due = 0
        if self._number is not None:
            self.budget.leave(self._number)
            self._number = None
        self.budget.spills += 1
        del memory  # the last reference to the in-memory index: freed here
        release_freed_memory()


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, where the C library has it (not musl, not macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Hand what the C allocator holds free back to the OS (glibc's malloc_trim): the freed
    index's lists and queues were malloc'd, and glibc keeps freed memory in its heaps (a
    100 MB index spilled in one process: RSS 232 -> 213 MB with this, unchanged without).
    What Python's own allocator held stays with the process, for its reuse: a spill leaves
    RSS near its high-water mark, which is why the budget counts in full (docs/operations.md)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _scan_records(state: KV) -> None:
    """The stored join range-scans records (and its time index) through the batch overlay,
    which the in-memory join's overlay skips indexing (kind.unscanned): have it index them,
    the ids index unscanned instead (only ever read by key)."""
    if isinstance(state, Overlay):
        state.set_unscanned(tuple(p for p in state.unscanned if p != keys.RECORD) + (keys.ID_INDEX,))

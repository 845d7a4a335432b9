"""The ordered key-value interface the join runs on, and two in-memory forms of it.

`MemoryKV` is a plain sorted map (tests, benchmarks of the pure operator).
`Overlay` buffers the writes of one batch over a read-only base (the RocksDB
store) so the operator reads its own writes, and hands the batch over whole to
be written in one atomic write batch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from typing import Protocol


class ReadableKV(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Items with lo <= key < hi, in key order."""
        ...


class KV(ReadableKV, Protocol):
    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def expire(self, key: bytes) -> None:
        """Delete a key that no later scan reaches (the caller knows: an expired
        record or index entry lies below every range the join still reads)."""
        ...


class MemoryKV:
    """A sorted in-memory map."""

    def __init__(self) -> None:
        self._values: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []

    def get(self, key: bytes) -> bytes | None:
        return self._values.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self._values:
            insort(self._keys, key)
        self._values[key] = value

    def delete(self, key: bytes) -> None:
        if self._values.pop(key, None) is not None:
            del self._keys[bisect_left(self._keys, key)]

    expire = delete

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        start, stop = bisect_left(self._keys, lo), bisect_left(self._keys, hi)
        for key in self._keys[start:stop]:
            yield key, self._values[key]

    def __len__(self) -> int:
        return len(self._values)


class SortedKeys:
    """A sorted set of keys held in chunks of at most 2 * CHUNK, so an insert costs
    O(log n + CHUNK) wherever it lands (one flat sorted list cost a memmove of half
    of it: several microseconds per write in a batch of thousands of records).
    Callers add only keys not yet present."""

    CHUNK = 256

    def __init__(self) -> None:
        self.chunks: list[list[bytes]] = []
        self.firsts: list[bytes] = []  # first key of each chunk

    def add(self, key: bytes) -> None:
        chunks = self.chunks
        if not chunks:
            chunks.append([key])
            self.firsts.append(key)
            return
        chunk = chunks[-1]
        if key > chunk[-1]:  # past every key (keys written in order, mostly): append
            i = len(chunks) - 1
            chunk.append(key)
        else:
            i = bisect_right(self.firsts, key) - 1
            if i < 0:
                i = 0
                self.firsts[0] = key
            chunk = chunks[i]
            insort(chunk, key)
        if len(chunk) > 2 * self.CHUNK:
            tail = chunk[self.CHUNK :]
            del chunk[self.CHUNK :]
            chunks.insert(i + 1, tail)
            self.firsts.insert(i + 1, tail[0])

    def position(self, key: bytes, after: bool = False) -> tuple[int, int]:
        """(chunk, index) of the first key >= `key` (> `key` if `after`)."""
        i = bisect_right(self.firsts, key) - 1
        if i < 0:
            return 0, 0
        chunk = self.chunks[i]
        j = bisect_right(chunk, key) if after else bisect_left(chunk, key)
        return (i + 1, 0) if j == len(chunk) else (i, j)

    def at(self, i: int, j: int) -> bytes | None:
        return self.chunks[i][j] if i < len(self.chunks) else None

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            yield from chunk

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


class Overlay:
    """Pending writes (None = delete) over a base that is only read."""

    def __init__(self, base: ReadableKV, unscanned: tuple[bytes, ...] = ()) -> None:
        """Keys starting with one of `unscanned` are never range-scanned by the caller:
        they skip the sorted index of pending keys (a cost on every write)."""
        self.base = base
        self.pending: dict[bytes, bytes | None] = {}
        self._pending_keys = SortedKeys()
        self._inserts = 0  # bumped when _pending_keys changes shape (a scan re-finds its place)
        self._unscanned = unscanned

    def get(self, key: bytes) -> bytes | None:
        if key in self.pending:
            return self.pending[key]
        return self.base.get(key)

    @property
    def unscanned(self) -> tuple[bytes, ...]:
        return self._unscanned

    def set_unscanned(self, unscanned: tuple[bytes, ...]) -> None:
        """Change which keys are never range-scanned (an operator that changed how it reads
        its state: the windowed join spilling its index to it): the sorted index of pending
        keys is made again from the pending keys a scan may now reach."""
        if unscanned == self._unscanned:
            return
        self._unscanned = unscanned
        keys = SortedKeys()
        for key in sorted(self.pending):
            if not key.startswith(unscanned):
                keys.add(key)
        self._pending_keys = keys
        self._inserts += 1

    def put(self, key: bytes, value: bytes) -> None:
        pending = self.pending
        if not key.startswith(self._unscanned) and key not in pending:  # the join's records: the first test
            self._pending_keys.add(key)
            self._inserts += 1
        pending[key] = value

    def delete(self, key: bytes) -> None:
        pending = self.pending
        if key not in pending and not key.startswith(self._unscanned):
            self._pending_keys.add(key)
            self._inserts += 1
        pending[key] = None

    def expire(self, key: bytes) -> None:
        """delete() for a key no later scan reaches: it skips the sorted index of pending
        keys (scans still skip it if it is there: it was written in this batch)."""
        self.pending[key] = None

    def clear(self) -> None:
        self.pending = {}
        self._pending_keys = SortedKeys()
        self._inserts += 1

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Base items merged with pending ones; pending wins, deletes hide.

        Costs O(log pending + items read): the pending keys are walked in place, not
        copied (an expiry scan is open-ended and most of a batch's index entries lie
        past its end). A write during the scan is seen if it sorts after the last
        item yielded."""
        i, j = self._pending_keys.position(lo)
        first = self._pending_keys.at(i, j)
        if first is None or first >= hi:
            return self.base.scan(lo, hi)  # nothing pending in range: the base alone
        return self._merge(i, j, hi, self.base.scan(lo, hi))

    def _merge(
        self, i: int, j: int, hi: bytes, theirs: Iterator[tuple[bytes, bytes]]
    ) -> Iterator[tuple[bytes, bytes]]:
        pending, mine = self.pending, self._pending_keys
        seen = self._inserts

        def next_mine() -> bytes | None:
            key = mine.at(i, j)
            return key if key is not None and key < hi else None

        my_key, their = next_mine(), next(theirs, None)
        while my_key is not None or their is not None:
            if their is None or (my_key is not None and my_key <= their[0]):
                if their is not None and my_key == their[0]:
                    their = next(theirs, None)
                value = pending.get(my_key)  # type: ignore[arg-type]
                if value is not None:
                    yield my_key, value  # type: ignore[misc]
                if self._inserts != seen:  # keys were added meanwhile: find our place again
                    pending, mine, seen = self.pending, self._pending_keys, self._inserts
                    i, j = mine.position(my_key, after=True)  # type: ignore[arg-type]
                else:
                    j += 1
                    if j == len(mine.chunks[i]):
                        i, j = i + 1, 0
                my_key = next_mine()
            else:
                yield their
                their = next(theirs, None)


DERIVED_CHUNK = 50_000  # keys per direct write of `write_derived`


def write_derived(state: KV, changes: Iterable[tuple[bytes, bytes | None]]) -> None:
    """Write keys an operator derives from its state (never in the changelog, the same however
    often written; None deletes), in order. Under a batch overlay with nothing pending, over a
    store that writes batches (PartitionStore), they go straight to the store DERIVED_CHUNK at
    a time, so that indexing (or dropping the index of) a large state holds one chunk in memory,
    not all of it until the next batch; a crash midway leaves a prefix of them written, so put
    what says they are complete last. Elsewhere (MemoryKV, a batch in progress) through `state`."""
    base = getattr(state, "base", None)
    write = getattr(base, "write", None)
    if not isinstance(state, Overlay) or state.pending or write is None:
        for key, value in list(changes):
            if value is None:
                state.delete(key)
            else:
                state.put(key, value)
        return
    chunk: dict[bytes, bytes | None] = {}
    for key, value in changes:
        chunk[key] = value
        if len(chunk) >= DERIVED_CHUNK:
            write(chunk, None)  # no checkpoint: derived keys are no changelog offset
            chunk = {}
    if chunk:
        write(chunk, None)

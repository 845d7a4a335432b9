"""The ordered key-value interface the join runs on, and two in-memory forms of it.

`MemoryKV` is a plain sorted map (tests, benchmarks of the pure operator).
`Overlay` buffers the writes of one batch over a read-only base (the RocksDB
store) so the operator reads its own writes, and hands the batch over whole to
be written in one atomic write batch.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import Protocol


class ReadableKV(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Items with lo <= key < hi, in key order."""
        ...


class KV(ReadableKV, Protocol):
    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...


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

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        start, stop = bisect_left(self._keys, lo), bisect_left(self._keys, hi)
        for key in self._keys[start:stop]:
            yield key, self._values[key]

    def __len__(self) -> int:
        return len(self._values)


class Overlay:
    """Pending writes (None = delete) over a base that is only read."""

    def __init__(self, base: ReadableKV, unscanned: tuple[bytes, ...] = ()) -> None:
        """Keys starting with one of `unscanned` are never range-scanned by the caller:
        they skip the sorted index of pending keys (a cost on every write)."""
        self.base = base
        self.pending: dict[bytes, bytes | None] = {}
        self._pending_keys: list[bytes] = []
        self._unscanned = unscanned

    def get(self, key: bytes) -> bytes | None:
        if key in self.pending:
            return self.pending[key]
        return self.base.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._remember(key)
        self.pending[key] = value

    def delete(self, key: bytes) -> None:
        self._remember(key)
        self.pending[key] = None

    def _remember(self, key: bytes) -> None:
        if key not in self.pending and not key.startswith(self._unscanned):
            insort(self._pending_keys, key)

    def clear(self) -> None:
        self.pending = {}
        self._pending_keys = []

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Base items merged with pending ones; pending wins, deletes hide."""
        start, stop = bisect_left(self._pending_keys, lo), bisect_left(self._pending_keys, hi)
        mine = iter(self._pending_keys[start:stop])
        theirs = self.base.scan(lo, hi)
        my_key, their = next(mine, None), next(theirs, None)
        while my_key is not None or their is not None:
            if their is None or (my_key is not None and my_key <= their[0]):
                if their is not None and my_key == their[0]:
                    their = next(theirs, None)
                value = self.pending[my_key]  # type: ignore[index]
                if value is not None:
                    yield my_key, value  # type: ignore[misc]
                my_key = next(mine, None)
            else:
                yield their
                their = next(theirs, None)

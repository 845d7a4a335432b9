"""The aligner's `add`, `add_many` and `release` as they were before the sorted release
(commit 75cbcb5): every released record popped off the heap one at a time, each counted in
its input's `gone`. Kept as a reference: tests/test_tables_alignment.py drives it and
tables.records.alignment.Aligner with the same steps and compares everything observable, and
benchmarks/bench_aligner.py measures one against the other. Not used by the framework.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from tables.records.alignment import Aligner

Item = TypeVar("Item")


class HeapAligner(Aligner[Item]):
    """Aligner with the heap-pop release it had before (the rest inherited unchanged)."""

    def __init__(self, topics: Sequence[str], **kwargs: float | int | Callable[[], float]) -> None:
        super().__init__(topics, **kwargs)  # type: ignore[arg-type]
        self._arrivals = itertools.count()

    def add(self, partition: int, topic: str, offset: int, ts: int, item: Item) -> None:
        """As Aligner.add was."""
        source = self._read(partition, topic, offset)
        source.highest_ts = ts if source.highest_ts is None else max(source.highest_ts, ts)
        source.hold(offset)
        heapq.heappush(self._partitions[partition].held, (ts, next(self._arrivals), topic, offset, item))

    def add_many(
        self,
        partition: int,
        topic: str,
        offsets: Sequence[int],
        timestamps: Sequence[int],
        items: Iterable[Item],
        last_offset: int,
    ) -> None:
        """As Aligner.add_many was (its part on the input is Aligner's, unchanged)."""
        if self._read_many(partition, topic, offsets, timestamps, last_offset) is None:
            return
        held, arrivals = self._partitions[partition].held, self._arrivals
        entries = [
            (ts, next(arrivals), topic, offset, item)
            for ts, offset, item in zip(timestamps, offsets, items, strict=True)
        ]
        if len(entries) > len(held):
            held.extend(entries)
            heapq.heapify(held)
        else:
            push = heapq.heappush
            for entry in entries:
                push(held, entry)

    def release(
        self,
        partition: int,
        ends: Mapping[str, int | None],
        starts: Mapping[str, int | None] | None = None,
    ) -> list[Item]:
        """As Aligner.release was: one heappop and one `gone` count per released record
        (whether any is due decided as Aligner decides it, unchanged)."""
        due = self._due(partition, ends, starts)
        if due is None:
            return []
        state, bounds, limit = due
        held, max_held = state.held, self.max_held
        out: list[Item] = []
        pop, inputs = heapq.heappop, state.inputs
        while held and held[0][0] <= limit:
            entry = pop(held)
            out.append(entry[4])
            gone = inputs[entry[2]].gone
            gone[entry[3]] = gone.get(entry[3], 0) + 1
        while len(held) > max_held:
            entry = pop(held)
            self.forced += 1
            out.append(entry[4])
            gone = inputs[entry[2]].gone
            gone[entry[3]] = gone.get(entry[3], 0) + 1
        if not held:
            for source in inputs.values():
                source.clear_held()
        self._note_ahead(state, bounds, limit)
        return out

"""How far a join partition's state has taken one input partition (no I/O).

A batch writes, with each partition's state and changelog (tables/state/partition.py), one
`InputPosition` per input topic: the next offset not read, and the runs of offsets read
but still held by the event-time alignment (tables/records/alignment.py), so not yet in
the state. A worker that restarts, or takes the partition over from the changelog, reads
again from the group's committed offset, which lags behind: the records it reads again
that the state already holds are *re-reads*, skipped and counted apart from the
operator's duplicates (a record whose declared id is already held: a producer's own
duplicate, which is what that counter is for).
"""

from __future__ import annotations

import itertools
import struct
from bisect import bisect_right
from dataclasses import dataclass, field

_U64 = struct.Struct(">Q")
_RUN = struct.Struct(">QQ")


@dataclass(frozen=True)
class InputPosition:
    """`read_next`: every offset below it was read, and is done (in the state, or dead-lettered,
    or a null value) unless it lies in one of `held`, inclusive (first, last) runs in ascending
    order: read but held, to be joined again."""

    read_next: int
    held: tuple[tuple[int, int], ...] = ()
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(first for first, _ in self.held))

    def done(self, offset: int) -> bool:
        """Whether the record at `offset` is already done (a re-read if it comes again)."""
        if offset >= self.read_next:
            return False
        at = bisect_right(self._starts, offset) - 1
        return at < 0 or self.held[at][1] < offset

    def encode(self) -> bytes:
        return _U64.pack(self.read_next) + b"".join(_RUN.pack(first, last) for first, last in self.held)

    @classmethod
    def decode(cls, raw: bytes | None) -> InputPosition | None:
        """The position `encode` wrote; None for anything else (then no record counts as done:
        all are joined again, as without positions)."""
        if raw is None or len(raw) < _U64.size or (len(raw) - _U64.size) % _RUN.size:
            return None
        (read_next,) = _U64.unpack_from(raw)
        runs = tuple(_RUN.iter_unpack(raw[_U64.size :]))
        if any(first > last for first, last in runs) or any(
            a[1] >= b[0] for a, b in itertools.pairwise(runs)
        ):
            return None
        if runs and runs[-1][1] >= read_next:
            return None
        return cls(read_next, runs)

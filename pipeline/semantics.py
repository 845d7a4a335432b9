"""The join contract (docs/join-semantics.md), record by record, in plain Python.

This is the readable statement of the semantics that the Spark job in
`pipeline.join` computes in bulk; the tests hold the two (and `tables/`) to the
same answers. It replays records in arrival order, one partition at a time.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.records import Rejected, validate
from tables.records.partitioners import Partitioner, find_misplaced

JoinKind = Literal["inner", "left", "outer"]
SIDE_OF_TOPIC = {"impressions": "left", "clicks": "right"}


@dataclass(frozen=True, slots=True)
class JoinParams:
    before: int = 0
    after: int = 600_000
    grace: int = 60_000
    kind: JoinKind = "inner"
    now_ms: int | None = None  # None: no wall-clock check (a backfill over old data)
    # How both inputs' producers partition keys; a record whose key belongs to another
    # partition than the one it was read from is misplaced: never joined ("none": no check).
    partitioner: Partitioner = "murmur2"

    def close(self, side: str, ts: int) -> int:
        """The last stream time at which a record of `side` with `ts` can still join."""
        return ts + (self.after if side == "left" else self.before) + self.grace

    def emit_after(self, ts: int) -> int:
        """Stream time after which no accepted partner can still match: unmatched emit."""
        return ts + self.before + self.after + self.grace

    def matches(self, left_ts: int, right_ts: int) -> bool:
        return left_ts - self.before <= right_ts <= left_ts + self.after


def result(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """One output record in the `ad-joins` format."""
    anchor = left or right
    assert anchor is not None
    ts = max(r["ts"] for r in (left, right) if r is not None)
    kind = "inner" if left and right else ("left" if left else "right")
    impression_id = left["event_id"] if left else None
    click_id = right["event_id"] if right else None
    return {
        "join_id": f"{impression_id or ''}|{click_id or ''}",
        "auction_id": anchor["auction_id"],
        "campaign_id": left["campaign_id"] if left else None,
        "impression_id": impression_id,
        "click_id": click_id,
        "impression_ts": left["ts"] if left else None,
        "click_ts": right["ts"] if right else None,
        "ts": ts,
        "kind": kind,
    }


@dataclass
class _Stored:
    side: str
    record: dict[str, Any]
    matched: bool = False


@dataclass
class PartitionJoin:
    """One task (partition): stream time, the records accepted so far, seen event ids.

    Nothing is purged: a stream store may drop a record once no accepted record
    could still match it (ts + before + after + grace), which never changes results.
    """

    params: JoinParams
    stream_time: int | None = None
    stores: dict[tuple[str, str], list[_Stored]] = field(default_factory=lambda: defaultdict(list))
    closing: list[tuple[int, int, _Stored]] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def process(self, side: str, key: bytes | None, value: bytes | None) -> list[dict[str, Any]]:
        record = validate(side, key, value, self.params.now_ms)  # type: ignore[arg-type]
        if isinstance(record, Rejected):
            self.counts["rejected"] += 1
            return []
        close = self.params.close(side, record["ts"])
        if self.stream_time is not None and close < self.stream_time:
            self.counts["late"] += 1
            return []
        if (side, record["event_id"]) in self.seen:
            self.counts["duplicate"] += 1
            return []
        self.seen.add((side, record["event_id"]))
        # Stream time moves first: windows it closes emit before this record matches.
        out = self._advance(record["ts"])
        return out + self._match(side, record)

    def _match(self, side: str, record: dict[str, Any]) -> list[dict[str, Any]]:
        mine = _Stored(side, record)
        other = "right" if side == "left" else "left"
        out = []
        for stored in self.stores[(other, record["auction_id"])]:
            left, right = (record, stored.record) if side == "left" else (stored.record, record)
            if self.params.matches(left["ts"], right["ts"]):
                stored.matched = mine.matched = True
                out.append(result(left, right))
        self.stores[(side, record["auction_id"])].append(mine)
        heapq.heappush(self.closing, (self.params.emit_after(record["ts"]), id(mine), mine))
        return out

    def _advance(self, ts: int) -> list[dict[str, Any]]:
        """Move stream time to `ts` if later; emit unmatched records whose window closed."""
        if self.stream_time is not None and ts <= self.stream_time:
            return []
        self.stream_time = ts
        out = []
        while self.closing and self.closing[0][0] < ts:
            _, _, stored = heapq.heappop(self.closing)
            if not stored.matched and self._emits_unmatched(stored.side):
                pair = (stored.record, None) if stored.side == "left" else (None, stored.record)
                out.append(result(*pair))
        return out

    def _emits_unmatched(self, side: str) -> bool:
        kind = self.params.kind
        return kind == "outer" or (kind == "left" and side == "left")


def sequential_join(
    records: Iterable[tuple[int, str, bytes | None, bytes | None]],
    params: JoinParams,
    partitions: int | None = None,
) -> list[dict[str, Any]]:
    """Results of (partition, side, key, value) records given in arrival order.

    With `partitions` (both topics' partition count), misplaced records are skipped first,
    by the check the stream runs (`tables.records.partitioners.find_misplaced`).
    """
    tasks: dict[int, PartitionJoin] = {}
    out: list[dict[str, Any]] = []
    for partition, side, key, value in records:
        task = tasks.setdefault(partition, PartitionJoin(params))
        if partitions and find_misplaced([key], partition, partitions, params.partitioner):
            task.counts["misplaced"] += 1
            continue
        out.extend({**r, "partition": partition} for r in task.process(side, key, value))
    return out

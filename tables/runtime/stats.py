"""What a join on this worker counts and remembers: its counters, its last rebalances, and
the latency of its results (for the view, the group page and `/metrics`, which read them).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tables.records.codecs import CATEGORIES

# Event time to output, in seconds: from a live stream (tens of ms) to a backlog (hours).
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
REBALANCE_KINDS = ("kept", "moved_warm", "moved_cold")


@dataclass
class LatencyBuckets:
    """A histogram kept as plain counts (observed on the join's loop, read at scrape time)."""

    bounds_ms: tuple[int, ...] = tuple(int(b * 1000) for b in LATENCY_BUCKETS_S)
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    total_ms: int = 0

    def observe_ms(self, value_ms: int) -> None:
        value_ms = max(0, value_ms)
        self.counts[bisect.bisect_left(self.bounds_ms, value_ms)] += 1
        self.total_ms += value_ms

    def observe_since(self, event_times_ms: Iterable[int]) -> None:
        """Observe now minus each event time (one per partition of a batch)."""
        now_ms = int(time.time() * 1000)
        for ts in event_times_ms:
            self.observe_ms(now_ms - ts)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (upper bound in seconds, observations at or below it)."""
        out, running = [], 0
        for bound_ms, n in zip(self.bounds_ms, self.counts, strict=False):
            running += n
            out.append((_le(bound_ms / 1000), float(running)))
        out.append(("+Inf", float(running + self.counts[-1])))
        return out


def _le(seconds: float) -> str:
    return repr(float(seconds))


@dataclass
class Rebalance:
    """What the last assignment did to one join on this worker."""

    epoch: int = 0
    started: float = field(default_factory=time.time)
    kept: list[int] = field(default_factory=list)
    moved_warm: list[int] = field(default_factory=list)
    moved_cold: list[int] = field(default_factory=list)
    replayed: dict[int, int] = field(default_factory=dict)
    seconds: float | None = None  # until every new active was restored

    def as_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "moved_warm": self.moved_warm,
            "moved_cold": self.moved_cold,
            "replayed": sum(self.replayed.values()),
            "replayed_by_partition": {str(p): n for p, n in sorted(self.replayed.items())},
            "seconds": self.seconds,
        }


@dataclass
class JoinStats:
    """Counters of one join on this worker (since the process started)."""

    read: dict[str, int] = field(default_factory=lambda: {"left": 0, "right": 0})
    null_values: dict[str, int] = field(default_factory=lambda: {"left": 0, "right": 0})
    # A rekeyed input's source records produced to its repartition topic (tables/runtime/rekeyer.py).
    rekeyed: dict[str, int] = field(default_factory=lambda: {"left": 0, "right": 0})
    # Records read again that the state already held (a restart, a takeover, a rebalance), by
    # partition: expected, and skipped (tables/records/positions.py).
    rereads: dict[int, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    # Of `dead_letters`: letters too large for the producer even when cut, skipped (logged)
    letters_skipped: int = 0
    results: int = 0
    unmatched: int = 0  # of `results`: a record without a partner (left, right, outer joins)
    idle_results: int = 0  # of `results`: released by an idle partition's clock (the `idle` option)
    results_by_partition: dict[int, int] = field(default_factory=dict)
    batches: int = 0
    faust_sends: int = 0  # Faust messages the handler queued (its tables' changelogs), sent with the output
    handler_restarts: int = 0
    failure: str | None = None  # why the join stopped the worker
    rebalance_partitions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REBALANCE_KINDS, 0))
    latency: LatencyBuckets = field(default_factory=LatencyBuckets)  # event time -> output acknowledged


@dataclass(frozen=True)
class InputSnapshot:
    """What a join's input holds at one moment (`JoinTask.input_snapshot()`, for the view and
    `/metrics`): records held for event-time order, those released past the cap, the inputs
    paused (far ahead of their partner) and what was fetched of them before the pause, and the
    records the operators hold in memory (None for a join kind that holds none)."""

    held: int
    forced: int
    let_go: dict[str, int]  # side -> times its alignment wait ran out (Aligner.let_go)
    paused: list[str]  # "topic:partition"
    deferred: int
    live_records: int | None
    window_index: dict[str, int] | None  # the windowed join's index: entries, bytes in memory

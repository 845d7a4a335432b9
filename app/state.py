"""Interim join state: in-memory operators, a changelog topic, local files, standbys.

Stands in for `tables/`' state manager (same shape: `on_assignment(active,
standby)`, `operator(partition)`, `local_offsets()`, `close()`) until it lands.

Every accepted input record is written to the changelog partition of the same
number; the state of a partition is the join fed with its changelog in order.
A standby follows its changelog partitions with its own consumer (no group),
so a promotion replays only the standby's lag. Each applied record is also
appended to a local file, so a restarted worker replays only what it missed.
"How far is the end" comes from the fetch high watermark (docs/embedded-broker.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

from app.interim_join import CampaignStats, Record, WindowedJoin

# (topic, key, value, partition) -> offset of the written record.
Send = Callable[[str, bytes, bytes, int], Awaitable[int]]
Emit = Callable[[list[Record]], Awaitable[None]]


class PartitionState:
    """One partition's operator, the changelog offset it reflects, its local file."""

    def __init__(self, partition: int, path: Path) -> None:
        self.partition = partition
        self.join = WindowedJoin()
        self.stats = CampaignStats()
        self.offset = -1  # last changelog offset applied
        self.joined = 0
        self.path = path
        self._file: TextIO | None = None

    def load(self) -> int:
        """Replay the local file; the number of records it held."""
        if not self.path.exists():
            return 0
        count = 0
        good = 0
        with self.path.open("rb") as lines:
            for raw in lines:
                try:
                    entry = json.loads(raw)
                except json.JSONDecodeError:
                    break  # a torn last line from a SIGKILL: keep what precedes it
                self._apply(entry["o"], entry["s"], entry["r"])
                count += 1
                good += len(raw)
        with self.path.open("r+b") as handle:
            handle.truncate(good)
        return count

    def _apply(self, offset: int, side: str, record: Record) -> list[Record]:
        results = self.process(side, record)
        self.offset = max(self.offset, offset)
        return results

    def process(self, side: str, record: Record) -> list[Record]:
        """Join one record in memory (not yet durable: see `persist`)."""
        results = self.join.process(side, record)
        self.stats.count(side, record, results)
        self.joined += len(results)
        return results

    def persist(self, offset: int, side: str, record: Record) -> None:
        """Record that changelog `offset` is applied; the OS keeps the line across SIGKILL."""
        self.offset = max(self.offset, offset)
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", buffering=1)
        self._file.write(json.dumps({"o": offset, "s": side, "r": record}) + "\n")

    def apply(self, offset: int, side: str, record: Record) -> list[Record]:
        """Feed one changelog record (a standby or a restore)."""
        if offset <= self.offset:
            return []
        results = self.process(side, record)
        self.persist(offset, side, record)
        return results

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class Rebalance:
    """What the last rebalance did on this worker."""

    started: float = field(default_factory=time.time)
    kept: list[int] = field(default_factory=list)
    warm: list[int] = field(default_factory=list)
    cold: list[int] = field(default_factory=list)
    replayed: int = 0
    replayed_by_partition: dict[int, int] = field(default_factory=dict)
    seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "kept": self.kept,
            "moved_warm": self.warm,
            "moved_cold": self.cold,
            "replayed": self.replayed,
            "replayed_by_partition": {str(p): n for p, n in self.replayed_by_partition.items()},
            "seconds": self.seconds,
        }


class StateManager:
    """Actives are restored before use; standbys follow the changelog continuously."""

    def __init__(self, bootstrap: str, changelog: str, data_dir: Path, send: Send) -> None:
        self.changelog = changelog
        self._bootstrap = bootstrap
        self._dir = data_dir / "join-state"
        self._send = send
        self.states: dict[int, PartitionState] = {}
        self.active: set[int] = set()
        self.standby: set[int] = set()
        self._ready: dict[int, asyncio.Event] = {}
        self._restoring: dict[int, float] = {}  # partition -> time restore was asked
        self._replayed: dict[int, int] = {}
        self._changed = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self.rebalance = Rebalance()
        self.total_replayed = 0

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            request_timeout_ms=30000,
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._follow(), name="changelog-follower")

    def rebalance_started(self) -> None:
        self.rebalance = Rebalance()

    async def on_assignment(self, active: set[int], standby: set[int]) -> None:
        """Adopt a new assignment: new actives restore, the rest follow or are dropped."""
        previous = set(self.active)
        self.active, self.standby = set(active), set(standby) - set(active)
        rebalance = self.rebalance
        rebalance.kept = sorted(previous & self.active)
        for partition in [p for p in self._restoring if p not in self.active]:
            self._restoring.pop(partition)  # revoked while restoring
            self._ready[partition].set()
        for partition in sorted(self.active - previous):
            # Warm: a standby's memory or a local file already holds part of the state.
            warm = self._state(partition).offset >= 0
            (rebalance.warm if warm else rebalance.cold).append(partition)
            self._ready.setdefault(partition, asyncio.Event()).clear()
            self._restoring[partition] = time.time()
            self._replayed[partition] = 0
        for partition in list(self.states):
            if partition not in self.active | self.standby:
                self.states.pop(partition).close()
        self._changed.set()
        if not self._restoring:
            rebalance.seconds = round(time.time() - rebalance.started, 3)

    def _state(self, partition: int) -> PartitionState:
        if partition not in self.states:
            state = PartitionState(partition, self._dir / f"p{partition}.jsonl")
            state.load()
            self.states[partition] = state
        return self.states[partition]

    async def operator(self, partition: int) -> PartitionState | None:
        """The partition's state once restored; None if it is not ours (revoked)."""
        # A record may arrive before the assignment signal: wait for it, bounded.
        event = self._ready.setdefault(partition, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), 30.0)
        except TimeoutError:
            return None
        return self._state(partition) if partition in self.active else None

    async def record(self, partition: int, side: str, record: Record, emit: Emit) -> None:
        """Join an accepted input record, emit its results, then write it to the changelog.

        Emitting first keeps at-least-once: a crash before the changelog write
        replays the input on the new owner, which emits the same join ids again.
        """
        state = await self.operator(partition)
        if state is None:
            return  # not ours: the owner processes it
        if state.join.seen(side, record["event_id"]):
            return  # a redelivery: no result, nothing to log
        await emit(state.process(side, record))
        key = record["auction_id"].encode()
        value = json.dumps({"side": side, "record": record}).encode()
        offset = await self._send(self.changelog, key, value, partition)
        state.persist(offset, side, record)

    async def process_batch(self, partition: int, items: list[tuple[str, Record]], emit: Emit) -> None:
        for side, record in items:  # the interim state logs record by record
            await self.record(partition, side, record, emit)

    def joined_counts(self) -> dict[int, int]:
        return {p: s.joined for p, s in sorted(self.states.items()) if p in self.active}

    def late(self) -> int:
        return sum(s.join.late for p, s in self.states.items() if p in self.active)

    def campaigns(self) -> dict[str, dict[str, int]]:
        totals: dict[str, dict[str, int]] = {}
        for partition, state in self.states.items():
            if partition not in self.active:
                continue
            for kind, counts in (("impressions", state.stats.impressions), ("clicks", state.stats.clicks)):
                for campaign, n in counts.items():
                    entry = totals.setdefault(campaign, {"impressions": 0, "clicks": 0})
                    entry[kind] += n
        return totals

    def local_offsets(self) -> dict[int, int]:
        """Changelog offset each partition held here reflects (in memory or on disk)."""
        offsets = {p: s.offset for p, s in self.states.items()}
        for path in self._dir.glob("p*.jsonl"):
            partition = int(path.stem[1:])
            if partition not in offsets:
                offsets[partition] = _last_offset(path)
        return offsets

    async def refresh_lag(self) -> None:
        """Nothing to fetch: the follower's consumer knows its high watermarks."""

    def lag(self, partition: int) -> int | None:
        """Changelog records not yet applied here (standbys and restoring actives)."""
        if self._consumer is None or partition not in self.states:
            return None
        try:
            high = self._consumer.highwater(TopicPartition(self.changelog, partition))
        except (AssertionError, KeyError, IllegalStateError):
            return None  # not followed (a restored active)
        return None if high is None else max(0, high - 1 - self.states[partition].offset)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()
        for state in self.states.values():
            state.close()

    # The follower: one loop owns the consumer, so assignment changes never race a fetch.
    async def _follow(self) -> None:
        assert self._consumer is not None
        assigned: set[int] = set()
        while True:
            wanted = self.standby | set(self._restoring)
            if wanted != assigned:
                assigned = wanted
                self._assign(assigned)
            if not assigned:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 1.0)
                continue
            batch = await self._consumer.getmany(timeout_ms=200, max_records=2000)
            for tp, messages in batch.items():
                self._apply_batch(tp.partition, messages)
            self._check_restored(assigned)

    def _assign(self, partitions: set[int]) -> None:
        assert self._consumer is not None
        tps = [TopicPartition(self.changelog, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        for tp in tps:
            self._consumer.seek(tp, self._state(tp.partition).offset + 1)

    def _apply_batch(self, partition: int, messages: list[Any]) -> None:
        state = self.states.get(partition)
        if state is None:
            return
        for message in messages:
            entry = json.loads(message.value)
            state.apply(message.offset, entry["side"], entry["record"])
        if partition in self._replayed:
            self._replayed[partition] += len(messages)

    def _check_restored(self, assigned: set[int]) -> None:
        assert self._consumer is not None
        for partition, asked in list(self._restoring.items()):
            if partition not in assigned:
                continue  # promoted during this fetch: assigned on the next turn
            tp = TopicPartition(self.changelog, partition)
            fetched_ms = self._consumer.last_poll_timestamp(tp) or 0
            high = self._consumer.highwater(tp)
            # A fetch answered after the promotion, and nothing left below its high watermark.
            if high is None or fetched_ms < asked * 1000:
                continue
            if self._state(partition).offset + 1 >= high:
                self._restored(partition)

    def _restored(self, partition: int) -> None:
        del self._restoring[partition]
        replayed = self._replayed.pop(partition, 0)
        self.rebalance.replayed += replayed
        self.rebalance.replayed_by_partition[partition] = replayed
        self.total_replayed += replayed
        self._ready[partition].set()
        if not self._restoring:
            self.rebalance.seconds = round(time.time() - self.rebalance.started, 3)


def _last_offset(path: Path) -> int:
    last = -1
    with path.open("rb") as lines:
        for raw in lines:
            with contextlib.suppress(json.JSONDecodeError, KeyError):
                last = max(last, json.loads(raw)["o"])
    return last
